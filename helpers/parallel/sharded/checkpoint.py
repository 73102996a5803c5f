"""Checkpoints a job can be killed in the middle of, and resumed from with the same result.

A checkpoint is a directory ``CKPT_DIR/step-00000120/`` holding everything the
next step depends on:

    state/         model + optimizer, written by torch.distributed.checkpoint (DCP):
                   every rank writes its own shards (FSDP, TP), replicas (DDP) once
    shared.pt      (rank 0) step, data position (epoch, batches done in it,
                   sampler generator), extra state (LR scheduler, ...)
    rank0.pt ...   (each rank) its RNG states (python, numpy, torch, CUDA) and
                   its own small state (its loss curve)
    meta.json      written last: step and world size, for people and tools

Atomic: every rank writes into ``.tmp-step-00000120/``; once all have
finished (a barrier), rank 0 renames it to ``step-00000120``. A rename is
atomic on POSIX file systems, so a job killed mid-write leaves only a
``.tmp-*`` directory, which ``latest()`` never returns and the next save
deletes. The last ``keep`` checkpoints are kept.

    path = checkpoint.save(ckpt_dir, step, model, opt, d, data={"epoch": e, "offset": k})
    last = checkpoint.latest(ckpt_dir)                  # None on a fresh start
    ckpt = checkpoint.load(last, model, opt, d)         # ckpt.step, ckpt.data, ckpt.extra
    checkpoint.set_rng_state(ckpt.rng)                  # after the loader is re-positioned

The directory must be visible to every rank (one node, or a shared file system).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from helpers import compat
from helpers import data as data_lib
from helpers.dist import Dist, is_initialized

__all__ = [
    "Checkpoint",
    "save",
    "load",
    "latest",
    "checkpoints",
    "rng_state",
    "set_rng_state",
    "start_epoch",
]

_STEP = re.compile(r"step-(\d{8})")


@dataclass
class Checkpoint:
    """What load() found: the step to resume after and the state the loop needs."""

    path: Path
    step: int  # optimizer steps taken before the checkpoint
    data: dict = field(default_factory=dict)  # {"epoch", "offset", "generator"}
    extra: dict = field(default_factory=dict)  # rank 0's extra state (LR scheduler, ...)
    rank_state: dict = field(default_factory=dict)  # this rank's own state
    rng: dict | None = None  # this rank's RNG states (None: saved with fewer ranks)


# --------------------------------------------------------------------------- finding


def checkpoints(ckpt_dir) -> list[Path]:
    """Complete checkpoints in ``ckpt_dir``, oldest first (never a half-written one)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP.fullmatch(p.name) and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: p.name)


def latest(ckpt_dir) -> Path | None:
    """The newest complete checkpoint in ``ckpt_dir``, or None (a fresh start)."""
    found = checkpoints(ckpt_dir)
    return found[-1] if found else None


# --------------------------------------------------------------------------- RNG


def rng_state() -> dict:
    """This process's random number generators, in a form torch.load(weights_only) reads."""
    version, keys, gauss = random.getstate()
    state = {"python": [version, list(keys), gauss], "torch": torch.get_rng_state()}
    try:
        import numpy as np

        name, mt, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, torch.from_numpy(mt.astype(np.int64)), pos, has_gauss, cached]
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict | None) -> None:
    """Put back the generators saved by rng_state() (None: leave them as they are)."""
    if state is None:
        return
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        name, mt, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, mt.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- data position


def start_epoch(loader, epoch: int, generator_state: torch.Tensor | None = None):
    """Prepare ``loader`` for ``epoch``; returns what a checkpoint needs to rebuild its order.

    A DistributedSampler's order depends only on (seed, epoch): set_epoch is enough.
    A single-process shuffling loader draws each epoch's order from its generator,
    so the generator's state at the start of the epoch is saved, and put back on
    resume (``generator_state``) before the epoch's iterator is created.
    """
    data_lib.set_epoch(loader, epoch)
    gen = getattr(loader, "generator", None)
    if gen is None:
        return None
    if generator_state is not None:
        gen.set_state(generator_state)
    return gen.get_state().clone()


# --------------------------------------------------------------------------- save


def _barrier() -> None:
    if is_initialized():
        tdist.barrier()


def _model_state(model: nn.Module, optimizer) -> dict:
    """Model and optimizer state as DCP sees it: sharded DTensors for FSDP/TP, plain
    tensors otherwise; keys are parameter names without DDP's 'module.' prefix."""
    model_sd, optim_sd = get_state_dict(model, optimizer or [])
    return {"model": model_sd, "optim": optim_sd} if optimizer else {"model": model_sd}


def save(
    ckpt_dir,
    step: int,
    model: nn.Module,
    optimizer,
    d: Dist,
    *,
    data: dict | None = None,
    extra: dict | None = None,
    rank_state: dict | None = None,
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically; every rank calls it (it is collective).

    data: the data position, e.g. {"epoch": 1, "offset": 17, "generator": state}.
    extra: rank 0's other state (the LR scheduler's state_dict ...).
    rank_state: this rank's own small state (lists, numbers, tensors).
    keep: how many of the newest checkpoints to keep (>= 1).
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the checkpoint just written), got {keep}")
    root = Path(ckpt_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-{final.name}"
    if d.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-step-*"):  # left by a job killed mid-write
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    _barrier()  # nobody writes before the directory exists
    # Collective: ranks agree on who writes which tensor (a DDP replica is written once).
    dcp.save(_model_state(model, optimizer), checkpoint_id=str(tmp / "state"),
             **compat.checkpoint_save_options())  # fmt: skip
    torch.save({"rng": rng_state(), "state": rank_state or {}}, tmp / f"rank{d.rank}.pt")
    if d.rank == 0:
        torch.save({"step": step, "data": data or {}, "extra": extra or {}}, tmp / "shared.pt")
    _barrier()  # every rank's files are complete
    if d.rank == 0:
        meta = {"step": step, "world_size": d.world_size, "saved_at": time.time()}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if final.exists():  # the same step saved twice (a resumed run's last step)
            shutil.rmtree(final)
        tmp.rename(final)  # the atomic moment: before it, the checkpoint does not exist
        for old in checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()  # nobody reads (or exits) before the rename
    return final


# --------------------------------------------------------------------------- load


def load(path, model: nn.Module, optimizer, d: Dist) -> Checkpoint:
    """Load checkpoint ``path`` into ``model`` and ``optimizer`` on every rank (collective).

    The model must already be wrapped (DDP, fully_shard, TP) exactly as when it
    was saved: DCP reads each rank's shards into the tensors it already holds.
    The RNG states are returned, not applied: call set_rng_state(ckpt.rng) once
    the data loader is positioned (creating an iterator draws random numbers).
    """
    path = Path(path)
    if not (_STEP.fullmatch(path.name) and (path / "meta.json").is_file()):
        raise FileNotFoundError(
            f"{path} is not a complete checkpoint (a step-NNNNNNNN directory with meta.json; "
            "a .tmp-* one was never finished): use checkpoint.latest(dir)"
        )
    state = _model_state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path / "state"), **compat.checkpoint_save_options(load=True))
    set_state_dict(model, optimizer or [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}))  # fmt: skip
    shared = torch.load(path / "shared.pt", map_location="cpu", weights_only=True)
    mine = path / f"rank{d.rank}.pt"
    own = torch.load(mine, map_location="cpu", weights_only=True) if mine.is_file() else {}
    return Checkpoint(
        path=path,
        step=int(shared["step"]),
        data=shared["data"],
        extra=shared["extra"],
        rank_state=own.get("state", {}),
        rng=own.get("rng"),
    )
