"""The one module that touches process groups.

Every program in the workbook starts with::

    from helpers import dist
    d = dist.init()          # Dist(rank, local_rank, world_size, device, backend)
    ...
    dist.cleanup()

or, to leave the group correctly on errors too, ``with dist.session() as d: ...``.

and runs unchanged in three worlds:

    python prog.py                      -> single process, rank 0 of 1, no process group
    torchrun --nproc-per-node 4 prog.py -> RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* from torchrun
    srun python prog.py                 -> SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID,
                                           master = first host of SLURM_JOB_NODELIST

The backend is NCCL when a GPU is visible and gloo otherwise, so the same file
is a CPU exercise on a laptop and a GPU job on a cluster. A third world checks the
second without a GPU: with ``$WORKBOOK_DEVICE_CHECK=strict`` the device is a stand-in
GPU whose process group refuses host tensors as NCCL does, and with ``=fake`` one
process plays one rank of a full-size job on fake tensors (``helpers.standin``).

The helpers ``rank()``, ``world_size()`` and ``is_main()`` give trivial answers
(0, 1, True) when no process group exists, so single-process code needs no
branches (the NERSC tutorial's ``get_size`` idea).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import random
import re
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as tdist

from helpers import standin
from helpers.devices import device_name, supports_bf16, synchronize  # re-exported

__all__ = [
    "Dist",
    "init",
    "cleanup",
    "session",
    "rank",
    "world_size",
    "local_rank",
    "is_main",
    "is_initialized",
    "print0",
    "barrier",
    "seed_all",
    "env_from_slurm",
    "synchronize",
    "supports_bf16",
    "device_name",
]

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Dist:
    """What a program needs to know about its place in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: str = "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.backend != "none"

    def __str__(self) -> str:  # one line, handy in logs
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}) "
            f"on {self.device} via {self.backend}"
        )


# --------------------------------------------------------------------------- env


def first_host(nodelist: str) -> str:
    """First host name of a Slurm node list, without calling scontrol.

    'node[03-05,09]' -> 'node03', 'gpu1,gpu2' -> 'gpu1', 'n7' -> 'n7'.
    scontrol is preferred when present (it knows every syntax); this is the
    fallback for the common forms.
    """
    head = re.split(r",(?![^\[]*\])", nodelist.strip())[0]
    m = re.match(r"^([^\[]+)\[([^\],-]+)", head)
    return m.group(1) + m.group(2) if m else head


def _master_from_nodelist(nodelist: str) -> str:
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return first_host(nodelist)


def env_from_slurm(environ: dict[str, str] | None = None) -> dict[str, str]:
    """torch.distributed variables derived from Slurm's, for ``srun python prog.py``.

    Returns only what is missing: torchrun's own variables always win.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env or "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return {}
    if int(env["SLURM_NTASKS"]) <= 1:
        return {}
    out = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
    }
    if "MASTER_ADDR" not in env:
        out["MASTER_ADDR"] = _master_from_nodelist(env.get("SLURM_JOB_NODELIST", "localhost"))
    if "MASTER_PORT" not in env:
        # Derive the port from the job id so two jobs sharing a node do not collide.
        job = int(env.get("SLURM_JOB_ID", "0") or 0)
        out["MASTER_PORT"] = str(DEFAULT_PORT + job % 20000)
    return out


# --------------------------------------------------------------------------- init


def _pick_device(local_rank: int, backend: str | None) -> tuple[torch.device, str]:
    check = standin.mode()
    if not check and backend == "standin":  # asked for by name: spawn(fn, backend="standin")
        os.environ[standin.MODE_ENV] = check = "strict"
    if check:  # the stand-in GPU: "standin" refuses host tensors, "dryrun" plays one rank
        standin.install()
        return standin.device(), "standin" if check == "strict" else "dryrun"
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device()), backend
    return torch.device("cpu"), backend


def init(
    backend: str | None = None, timeout_s: float = 300.0, store: tdist.Store | None = None
) -> Dist:
    """Join the job's process group (or describe a single process) and return a Dist.

    backend: None picks nccl with a visible GPU, gloo otherwise; "standin" puts this rank on
    the stand-in GPU, device-strict (as ``$WORKBOOK_DEVICE_CHECK=strict`` does).
    timeout_s: collectives that wait longer than this fail instead of hanging.
    store: a rendezvous store made by the launcher (helpers.launch's pool makes one);
    None: rendezvous at MASTER_ADDR:MASTER_PORT, as torchrun and Slurm jobs do. A dry run
    (a rank alone, ``helpers.standin``) needs no store and ignores it.
    """
    os.environ.update(env_from_slurm())
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        if standin.mode():
            standin.install()
            return Dist(device=standin.device(), backend="none")
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        return Dist(device=device, backend="none")

    rank_ = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device, backend = _pick_device(local, backend)
    if not tdist.is_initialized():
        kwargs = {}
        if backend == "nccl":
            kwargs["device_id"] = device  # lets NCCL set up communicators eagerly
        if backend == "dryrun":  # one rank alone: no rendezvous with peers that do not exist
            kwargs["store"] = tdist.HashStore()
        elif store is not None:
            kwargs["store"] = store
        tdist.init_process_group(
            backend=backend,
            rank=rank_,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
    if backend in ("standin", "dryrun"):  # a checked run: DeepSpeed's tensors on the stand-in too
        standin.use_for_deepspeed(backend)
    elif backend == "gloo":  # DeepSpeed (if imported) all-reduces through gloo, as through NCCL
        standin.deepspeed_through_torch()
    return Dist(rank=rank_, local_rank=local, world_size=world, device=device, backend=backend)


def cleanup(failed: bool = False) -> None:
    """Leave the process group; safe to call when none exists.

    On a normal exit (``failed=False``) every rank first waits for the others (a
    barrier) and drops unreachable objects that still hold the group (a DDP
    reducer in a reference cycle). Tearing gloo down while a peer is still
    talking, or after the group is gone, aborts the process ("terminate called
    without an active exception") in a fraction of runs.

    ``failed=True`` skips the barrier: a failing rank must exit promptly so the
    launcher can stop the others. ``session()`` passes it for you; a handled
    exception (cleanup() called inside an ``except`` block that recovered) is a
    normal exit and waits as usual.
    """
    if not (tdist.is_available() and tdist.is_initialized()):
        return
    if not failed:
        gc.collect()
        with warnings.catch_warnings():  # the stand-in GPU's group: "using the device under
            warnings.filterwarnings("ignore", r"barrier\(\): using the device")  # current context"
            tdist.barrier()
    tdist.destroy_process_group()


@contextlib.contextmanager
def session(backend: str | None = None, timeout_s: float = 300.0) -> Iterator[Dist]:
    """``with dist.session() as d:`` joins the group and always leaves it correctly.

    A normal exit waits for every rank (``cleanup()``); an exception leaves at
    once (``cleanup(failed=True)``) and propagates, so the launcher names this rank.
    """
    d = init(backend=backend, timeout_s=timeout_s)
    try:
        yield d
    except BaseException:
        cleanup(failed=True)
        raise
    cleanup()


# --------------------------------------------------------------------------- queries


def is_initialized() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def rank() -> int:
    return tdist.get_rank() if is_initialized() else 0


def world_size() -> int:
    return tdist.get_world_size() if is_initialized() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_initialized():
        tdist.barrier()


def print0(*args, **kwargs) -> None:
    """print() on rank 0 only."""
    if is_main():
        print(*args, **kwargs, flush=True)


def seed_all(seed: int, rank_offset: int = 0) -> None:
    """Seed python, numpy and torch.

    rank_offset: pass the data-parallel rank when ranks must draw different
    random numbers (data augmentation); keep 0 when they must agree (model
    initialisation, tensor-parallel ranks that share an input).
    """
    s = seed + rank_offset
    random.seed(s)
    torch.manual_seed(s)
    try:
        import numpy as np

        np.random.seed(s % 2**32)
    except ImportError:  # numpy is optional for the helpers themselves
        pass
