"""Scaling arithmetic for data parallelism: local batches, speedup, parallel efficiency.

Two ways to add workers (NERSC, "Deep Learning at Scale"):

    weak scaling    local batch B fixed      global batch N*B grows with N
                    -> more samples per step, same work per rank; ideal: N x throughput
    strong scaling  global batch G fixed     local batch G/N shrinks with N
                    -> same samples per step, less work per rank; ideal: N x throughput
                       (communication per step stays the same while compute shrinks)

Plain arithmetic (no processes), unit-tested directly. The learning-rate rules
that go with a larger global batch are in helpers.training.lr; the study that
measures throughput on 1..N ranks is helpers.course.scaling_study.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ScalingPoint",
    "add_efficiency",
    "efficiency",
    "format_table",
    "local_batch",
    "speedup",
]


def local_batch(global_batch: int, world_size: int) -> int:
    """Per-rank batch for strong scaling; refuses a global batch that does not split evenly."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if global_batch % world_size:
        raise ValueError(
            f"global batch {global_batch} does not split evenly over {world_size} ranks: "
            f"choose a multiple of {world_size} (e.g. {global_batch - global_batch % world_size})"
        )
    return global_batch // world_size


@dataclass(frozen=True)
class ScalingPoint:
    """One measured configuration of a scaling study."""

    ranks: int
    throughput: float  # samples per second, summed over all ranks
    local_batch: int
    threads_per_rank: int = 1


def speedup(throughputs: Sequence[float]) -> list[float]:
    """Throughput relative to the first entry (the single-rank baseline)."""
    if not throughputs or throughputs[0] <= 0:
        raise ValueError("need a positive baseline throughput as the first entry")
    return [t / throughputs[0] for t in throughputs]


def efficiency(ranks: Sequence[int], throughputs: Sequence[float]) -> list[float]:
    """Parallel efficiency E(N) = (X(N) / X(1)) / (N / N1) for throughputs X.

    The same formula serves both studies because both are written in samples/s:
    strong scaling (time for a fixed global batch T1/TN == XN/X1) and weak scaling
    (N times the samples in the same time). The first entry is the baseline,
    which need not be a single rank: E is relative to ranks[0].
    1.0 is perfect; 0.5 means half the added workers' capacity is lost.
    """
    if len(ranks) != len(throughputs):
        raise ValueError(f"{len(ranks)} rank counts but {len(throughputs)} throughputs")
    if any(n < 1 for n in ranks):
        raise ValueError(f"rank counts must be >= 1, got {list(ranks)}")
    s = speedup(throughputs)
    return [si / (n / ranks[0]) for si, n in zip(s, ranks, strict=True)]


def add_efficiency(rows: list[dict]) -> list[dict]:
    """Add 'speedup' and 'efficiency' to each row, relative to the first row of its mode."""
    for mode in {r["mode"] for r in rows}:
        sel = [r for r in rows if r["mode"] == mode]
        xs = [r["samples_per_s"] for r in sel]
        for r, s, e in zip(
            sel, speedup(xs), efficiency([r["ranks"] for r in sel], xs), strict=True
        ):
            r["speedup"], r["efficiency"] = s, e
    return rows


def format_table(rows: list[dict]) -> str:
    """The study as a fixed-width text table."""
    lines = [
        f"{'mode':<7}{'ranks':>6}{'threads/rank':>14}{'local batch':>13}{'global batch':>14}"
        f"{'samples/s':>11}{'speedup':>9}{'efficiency':>12}"
    ]
    for r in rows:
        flag = "  (oversubscribed)" if r.get("oversubscribed") else ""
        lines.append(
            f"{r['mode']:<7}{r['ranks']:>6}{r['threads']:>14}{r['local_batch']:>13}"
            f"{r['global_batch']:>14}{r['samples_per_s']:>11.0f}{r.get('speedup', 1):>9.2f}"
            f"{r.get('efficiency', 1):>12.2f}{flag}"
        )
    return "\n".join(lines)
