"""The dry run's table: a row per job and GPU, and what each column means."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from helpers.course.dryrun.check import PROCESS_GIB, Row
from helpers.gpus import RESERVE_GIB

__all__ = ["table", "LEGEND", "save_rows", "combined"]

LEGEND = (
    "full size: the job's program and arguments at its world size on fake tensors (rank 0, "
    "and rank N-1 where ranks exchange point-to-point messages), until 2 optimizer steps; GPU memory: that run's peak tensor bytes + "
    f"{RESERVE_GIB:.0f} GiB (CUDA context, NCCL) against the GPU's memory; host memory: per "
    f"node, each rank's peak host tensors + {PROCESS_GIB} GiB (the process itself, an "
    "estimate); device-strict: the same program on 2 CPU ranks (1 for a one-GPU job) at its "
    "laptop sizes, where a host tensor in a collective or beside a device tensor fails."
)


def table(rows: list[Row]) -> str:
    """A markdown table of the rows, with the legend above it."""
    head = ["job", "profile", "GPU", "ranks", "full size reached", "GPU memory", "host memory",
            "device-strict", "verdict"]  # fmt: skip
    lines = [LEGEND, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.job, r.profile, r.gpu, str(r.ranks), r.reached, r.gpu_mem, r.host_mem,
                 r.strict, "ok" if r.ok else "FAILS"]  # fmt: skip
        lines.append(
            "| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |"
        )
    return "\n".join(lines) + "\n"


def save_rows(rows: list[Row], label: str, out: Path) -> Path:
    """Keep one notebook's rows (``out/rows/<label>.json``) for the combined report."""
    path = Path(out) / "rows" / (label.replace("/", "__") + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return path


def combined(out: Path) -> str:
    """Every saved row, in one table (what ``make test`` leaves in build/dryrun/report.md)."""
    rows = [Row(**r) for p in sorted((Path(out) / "rows").glob("*.json"))
            for r in json.loads(p.read_text())]  # fmt: skip
    return table(rows)
