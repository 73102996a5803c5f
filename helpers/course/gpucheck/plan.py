"""What ``make gpu-check`` runs on this node, and what it leaves out and why.

Every distinct job program the notebooks wrote (``build/dryrun/runs/**/job.json``: the same
program with the same arguments runs once, the others say "same as"), at the job's own
arguments on min(its world size, the GPUs here) ranks, stopped after ``steps`` optimizer
steps; then the measurements (run to their end); then notebook 01. An item is left out,
before it starts, when it needs what the node lacks: more GPUs than it has (a job's declared
``min_gpus``; the all-reduce measurement on one GPU) or a package (DeepSpeed, papermill).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from helpers.course.dryrun.check import find_jobs
from helpers.course.gpucheck.needs import imports_of, missing

__all__ = ["Item", "plan", "MEASUREMENTS", "NOTEBOOK", "STEPS"]

STEPS = 20
PROGRAMS = Path(__file__).resolve().parents[2] / "programs"
NOTEBOOK = Path("notebooks/01_single_gpu_cnn.ipynb")
# (name, program, arguments, world: "all" GPUs or 1); each writes its figures with write_metrics
MEASUREMENTS = [
    ("cnn fp32", PROGRAMS / "train_cnn.py", ["--epochs", "1", "--amp", "none", "--offline", "true"], 1),
    ("cnn bf16", PROGRAMS / "train_cnn.py", ["--epochs", "1", "--amp", "bf16", "--offline", "true"], 1),
    ("all-reduce", PROGRAMS / "busbw.py", [], "all"),
    ("llama mfu", PROGRAMS / "train_llama.py",
     ["--model", "7B", "--n-layers", "4", "--tp", "1", "--seq-len", "2048", "--batch-size", "8",
      "--steps", "8"], "all"),
]  # fmt: skip


@dataclass
class Item:
    """One row of the check: a job, a measurement or the notebook."""

    name: str
    kind: str  # "job", "measurement", "notebook"
    program: Path | None
    args: list[str]
    world: int  # ranks it runs on here
    wants: int  # ranks it was written for
    limit: float  # seconds
    steps: int = STEPS
    written_by: str = ""
    skip: str = ""  # "needs 2 GPUs", "needs deepspeed": left out, not failed
    missing: list[str] = field(default_factory=list)  # packages it needs and this node lacks
    same_as: str = ""

    def describe(self) -> str:
        ranks = f"{self.world} rank(s)" + (
            f" of its {self.wants}" if self.wants > self.world else ""
        )
        what = self.skip or (f"same as {self.same_as}" if self.same_as else ranks)
        return f"{self.kind:<11} {self.name:<28} {what:<34} limit {self.limit:.0f} s"


def _job_items(jobs_dir: Path, gpus: int, limits: dict, find) -> list[Item]:
    items, seen = [], {}
    for job in find_jobs(jobs_dir) if jobs_dir.is_dir() else []:
        spec, args = job.spec, [str(a) for a in job.spec["args"]]
        key = (job.digest(), tuple(args), job.world)
        files = [job.program, *(job.path / f for f in spec.get("files", []))]
        lacks = missing(sorted(imports_of(*files) & {"deepspeed"}), find)
        limit = limits["deepspeed"] if "deepspeed" in imports_of(*files) else limits["job"]
        limit = min(limit, _seconds(spec.get("time") or "") or limit)  # never past its own
        item = Item(spec["name"], "job", job.program, args, min(job.world, gpus), job.world,
                    limit, written_by=spec.get("written_by", ""), missing=lacks)  # fmt: skip
        need = int(spec.get("min_gpus") or 0)
        if key in seen:
            item.same_as = seen[key]
        elif need > gpus:
            item.skip = f"needs {need} GPUs"
        elif lacks:
            item.skip = "needs " + ", ".join(lacks)
        seen.setdefault(key, spec["name"])
        items.append(item)
    return items


def _seconds(slurm_time: str) -> float | None:
    """Slurm's time limit ('00:10:00', '1-02:00:00', '30:00') in seconds; None if unreadable."""
    days, _, clock = slurm_time.rpartition("-")
    try:
        parts = [int(x) for x in clock.split(":")]
        d = int(days) if days else 0
    except ValueError:
        return None
    while len(parts) < 3:
        parts.insert(0, 0)
    return ((d * 24 + parts[0]) * 60 + parts[1]) * 60 + parts[2]


def _measurement_items(gpus: int, limits: dict) -> list[Item]:
    items = []
    for name, program, args, world in MEASUREMENTS:
        n = gpus if world == "all" else 1
        item = Item(name, "measurement", program, list(args), n, n, limits["job"], steps=10**9)
        if name == "all-reduce" and gpus < 2:
            item.skip, item.wants = "needs 2 GPUs (one GPU: nothing to all-reduce with)", 2
        items.append(item)
    return items


def plan(
    jobs_dir: Path, gpus: int, limits: dict, notebook: bool = True, measure: bool = True, find=None
) -> list[Item]:
    """Every item of the check for ``gpus`` GPUs. limits: seconds for "job" (never more than
    the job's own Slurm time), "deepspeed", "notebook"; find: importlib.util.find_spec."""
    import importlib.util

    find = find or importlib.util.find_spec
    items = _job_items(jobs_dir, gpus, limits, find)
    items += _measurement_items(gpus, limits) if measure else []
    if notebook:
        lacks = missing(["papermill", "ipykernel"], find)
        items.append(Item("notebook 01", "notebook", None, [], 1, 1, limits["notebook"],
                          skip="needs " + ", ".join(lacks) if lacks else "", missing=lacks))  # fmt: skip
    return items
