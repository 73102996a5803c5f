"""Check every job a notebook wrote, as a GPU cluster would run it, on this CPU machine.

For each ``job.json`` (written by ``helpers.cluster.job.Job.write``, so by every
``%%sbatch`` cell and every site job a notebook shows):

1. **full size, fake tensors**: the job's own program and arguments, at its world size,
   rank 0 alone on the "dryrun" process group (and rank N-1 too when it sends point-to-point
   messages, as pipeline stages do), until two optimizer steps are done. Its peak GPU bytes are held against each GPU its profile offers (less
   ``helpers.gpus.RESERVE_GIB`` for the CUDA context and NCCL), and the host bytes its
   ranks need against the job's ``--mem`` (or the node's memory per GPU);
   The fake ranks' operations are checked against NCCL's order for the whole job where the
   ranks it ran show it (order.py: 2 ranks, or ranks that all do the same);
2. **device-strict**: the same program on 2 real CPU ranks (1 for a one-GPU job), at its
   laptop sizes, on the stand-in GPU: a tensor left on the host fails, naming its line, and
   so does an order of operations that would hang NCCL or collectives the ranks disagree on.

Identical programs with identical arguments and world sizes are run once.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from helpers.course.dryrun.order import order_problem
from helpers.course.dryrun.runner import run_fake, run_ranks
from helpers.gpus import RESERVE_GIB, lookup

__all__ = ["Job", "Row", "find_jobs", "check_jobs", "PROCESS_GIB"]

PROCESS_GIB = 2.5  # a CUDA PyTorch rank's own host memory (libraries, CUDA context): estimate
GIB = 2**30


@dataclass
class Job:
    """A job directory as the notebook wrote it."""

    path: Path
    spec: dict

    @property
    def world(self) -> int:
        return self.spec["nodes"] * self.spec["gpus_per_node"]

    @property
    def program(self) -> Path:
        return self.path / self.spec["program"]

    def digest(self) -> str:
        """The program and the files shipped with it (not the script, logs or results)."""
        h = hashlib.sha256()
        for name in [self.spec["program"], *self.spec.get("files", [])]:
            h.update(name.encode() + b"\0" + (self.path / name).read_bytes())
        return h.hexdigest()[:16]


@dataclass
class Row:
    """One job on one of its profile's GPUs: the table's row."""

    job: str
    profile: str
    gpu: str
    ranks: int
    reached: str
    gpu_mem: str
    host_mem: str
    strict: str
    ok: bool
    notes: list[str] = field(default_factory=list)


def find_jobs(*roots: Path) -> list[Job]:
    """Every job.json below the roots, oldest first."""
    found = sorted({p for r in roots for p in Path(r).rglob("job.json")}, key=lambda p: str(p))
    return [Job(p.parent, json.loads(p.read_text())) for p in found]


def _mem_gib(text: str) -> float | None:
    """Slurm's --mem ('30GB', '30G', '512M', '1T') in GiB (Slurm's units are binary)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)B?", text.strip(), re.I)
    if not m:
        return None
    scale = {"": 1 / 1024, "K": 1 / 2**20, "M": 1 / 1024, "G": 1, "T": 1024}[m.group(2).upper()]
    return float(m.group(1)) * scale


def _failure(results: list[dict]) -> str:
    """'rank 0 at program.py:12: ... (in helpers/x.py:34: ...): Error: message'."""
    failed = [r for r in results if not r.get("ok")]
    # the rank that raised, not a peer killed after it (that one has no line to name)
    bad = next((r for r in failed if r.get("program_line") or r.get("workbook_line")), failed[0])
    lines = [x for x in (bad.get("program_line"), bad.get("workbook_line")) if x]
    where = f" at {lines[0]}" if lines else ""
    where += f" (in {lines[1]})" if len(lines) > 1 else ""
    error = bad.get("error", "failed").split("\n")[0][:300]
    return f"rank {bad['rank']}{where}: {error}"


def _least(results: list[dict]) -> str:
    order = ("started", "forward", "backward", "step", "end")
    return min((r.get("reached", "started") for r in results), key=order.index)


def _isolated(job: Job, scratch: Path) -> list[str]:
    """The job's arguments, with paths into its runs directory pointing at copies instead,
    so a check never writes into (or resumes from) what the notebook left there."""
    runs = job.path.parents[1]  # runs/NAME/<id>/ -> runs/
    out = []
    for arg in map(str, job.spec["args"]):
        path = Path(arg)
        if path.is_absolute() and path.resolve().is_relative_to(runs.resolve()):
            copy = scratch / path.resolve().relative_to(runs.resolve())
            if path.is_dir() and not copy.exists():
                shutil.copytree(path, copy)
            copy.parent.mkdir(parents=True, exist_ok=True)
            arg = str(copy)
        out.append(arg)
    return out


class _Runs:
    """Runs each distinct check once, each in a scratch copy of what it names."""

    def __init__(self, timeout: float):
        self.timeout, self.cache = timeout, {}

    def _argv(self, job: Job) -> list[str]:
        return _isolated(job, Path(tempfile.mkdtemp(prefix="dryrun-args-")))

    def fake(self, job: Job, gpu: str, marks: tuple[int, ...] = ()) -> list[dict]:
        limit = _host_limit(job)
        key = ("fake", job.digest(), tuple(job.spec["args"]), job.world, lookup(gpu).bf16, limit,
               marks)  # fmt: skip
        if key not in self.cache:
            self.cache[key] = run_fake(job.program, self._argv(job), job.world, gpu=gpu,
                                       gpus_per_node=job.spec["gpus_per_node"],
                                       timeout=self.timeout, host_limit=limit,
                                       gpu_marks=marks)  # fmt: skip
        return self.cache[key]

    def strict(self, job: Job) -> list[dict]:
        world = min(job.world, 2)
        key = ("strict", job.digest(), tuple(job.spec["args"]), world)
        if key not in self.cache:
            self.cache[key] = run_ranks(job.program, self._argv(job), "strict", world,
                                        gpu=job.spec.get("gpu") or "h100", small=True,
                                        timeout=self.timeout)  # fmt: skip
        return self.cache[key]


def _host_share(job: Job) -> tuple[float | None, str]:
    """(GiB the job gets on one node, where that figure comes from)."""
    mem = _mem_gib(job.spec.get("mem") or "")
    if mem is not None:
        return mem, f"--mem={job.spec['mem']}"
    per_gpu = job.spec.get("host_mem_per_gpu_gb") or 0
    if per_gpu:
        return per_gpu * job.spec["gpus_per_node"], "the node's share"
    return None, "no limit known"


def _host_limit(job: Job) -> tuple[int, str] | None:
    """The host bytes one rank may hold: its share of the node's, less the process itself."""
    have, source = _host_share(job)
    if have is None:
        return None
    per_rank = have / job.spec["gpus_per_node"] - PROCESS_GIB
    return int(per_rank * GIB), (f"{per_rank:.1f} GiB a rank ({source} over "
                                 f"{job.spec['gpus_per_node']} ranks, less {PROCESS_GIB} GiB "
                                 "for the process)")  # fmt: skip


def _host_need(job: Job, results: list[dict]) -> tuple[float, float | None, str]:
    """(GiB the ranks of one node need, GiB the job gets there, where that comes from)."""
    per_rank = max(r.get("peak_bytes", {}).get("cpu", 0) for r in results) / GIB + PROCESS_GIB
    have, source = _host_share(job)
    return per_rank * job.spec["gpus_per_node"], have, source


def _usable(gpu: str) -> int:
    """The bytes a rank's tensors may take on this GPU (its memory less the reserve)."""
    return int((lookup(gpu).memory_gib - RESERVE_GIB) * GIB)


def _where_full(fake: list[dict], gpu: str) -> str:
    """' at program.py:12: line' where a rank's GPU bytes first passed this GPU's memory."""
    for r in fake:
        place = r.get("gpu_passed", {}).get(str(_usable(gpu)), {})
        lines = [x for x in (place.get("program_line"), place.get("workbook_line")) if x]
        if lines:
            return f" at {lines[0]}" + (f" (in {lines[1]})" if len(lines) > 1 else "")
    return ""


def _rows_for(job: Job, runs: _Runs, gpus: list[str]) -> list[Row]:
    name = job.spec["name"]
    strict = runs.strict(job)
    on = f"on {min(job.world, 2)} ranks: " if job.world > 2 else ""
    strict_text = "ok" if all(r.get("ok") for r in strict) else f"FAILS {on}" + _failure(strict)
    rows = []
    marks = tuple(sorted({_usable(g) for g in gpus}))  # one fake run notes where each fills up
    for gpu in gpus:
        fake = runs.fake(job, gpu, marks)
        fake_ok = all(r.get("ok") for r in fake)
        reached = _least(fake) + ("" if fake_ok else " (FAILS " + _failure(fake) + ")")
        order = order_problem(job.world, fake)  # NCCL's order, from the ranks it ran
        if order:
            fake_ok = False
            reached += f" (FAILS on {job.world} ranks under NCCL's order: {order[:600]})"
        reached += "".join(f" ({r['note']})" for r in fake if r.get("note"))
        peak = max(r.get("peak_bytes", {}).get("gpu", 0) for r in fake) / GIB
        cap = lookup(gpu).memory_gib
        fits = peak + RESERVE_GIB <= cap
        need, have, source = _host_need(job, fake)
        host_ok = have is None or need <= have
        host = f"{need:.1f} of {have:.0f} GiB ({source})" if have else f"{need:.1f} GiB ({source})"
        ok = fake_ok and fits and host_ok and strict_text == "ok"
        gpu_mem = f"{peak:.1f} + {RESERVE_GIB:.0f} of {cap:.0f} GiB" + (
            "" if fits else " DOES NOT FIT: out of memory" + _where_full(fake, gpu)
        )
        rows.append(Row(name, job.spec["profile"], lookup(gpu).name, job.world, reached, gpu_mem,
                        host + ("" if host_ok else " TOO MUCH"), strict_text, ok))  # fmt: skip
    return rows


def check_jobs(jobs: list[Job], timeout: float = 300.0, all_gpus: bool = True) -> list[Row]:
    """A row per job and GPU: every GPU of the job's profile when ``all_gpus``."""
    from helpers.cluster.profiles import load_profile

    runs, rows = _Runs(timeout), []
    for job in jobs:
        gpus = [job.spec.get("gpu") or "h100"]
        if all_gpus:
            profile = load_profile(job.spec["profile"])
            gpus = [profile.facts(v)["gpu"] for v in profile.gpu_variants(job.spec["values"])]
        rows += _rows_for(job, runs, [g for g in dict.fromkeys(gpus) if g])
    return rows
