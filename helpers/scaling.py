"""Scaling arithmetic for data parallelism: learning-rate rules, warm-up, efficiency.

Two ways to add workers (NERSC, "Deep Learning at Scale"):

    weak scaling    local batch B fixed      global batch N*B grows with N
                    -> more samples per step, same work per rank; ideal: N x throughput
    strong scaling  global batch G fixed     local batch G/N shrinks with N
                    -> same samples per step, less work per rank; ideal: N x throughput
                       (communication per step stays the same while compute shrinks)

Growing the global batch by a factor k changes the optimisation, so the learning
rate usually grows with it:

    linear rule       lr -> k * lr
    square-root rule  lr -> sqrt(k) * lr

and a large learning rate is unstable in the first steps, hence a warm-up that
ramps from the base rate to the scaled one.

Everything here is plain arithmetic (no processes), so it is unit-tested directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LR_RULES",
    "scale_lr",
    "warmup_lr",
    "warmup_factors",
    "ScalingPoint",
    "efficiency",
    "speedup",
    "local_batch",
    "StudyConfig",
    "train_each",
    "run_study",
    "add_efficiency",
    "format_table",
    "bench_main",
]

LR_RULES = ("none", "linear", "sqrt")


def scale_lr(base_lr: float, k: float, rule: str = "linear") -> float:
    """The learning rate for a global batch ``k`` times the one ``base_lr`` was tuned for.

    k: global batch / base batch. With a fixed local batch on N ranks, k = N.
    rule: "none" (keep base_lr), "linear" (k * lr) or "sqrt" (sqrt(k) * lr).
    """
    if k <= 0:
        raise ValueError(f"batch ratio k must be > 0, got {k}")
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * k
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    raise ValueError(f"unknown learning-rate rule {rule!r}: use one of {', '.join(LR_RULES)}")


def warmup_lr(step: int, base_lr: float, peak_lr: float, warmup_steps: int) -> float:
    """Learning rate at ``step`` (0-based) of a linear warm-up from base_lr to peak_lr.

    Step 0 uses base_lr, step ``warmup_steps`` and later use peak_lr; in between the
    rate grows linearly. warmup_steps=0 means no warm-up (peak_lr from the start).
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps == 0 or step >= warmup_steps:
        return peak_lr
    return base_lr + (peak_lr - base_lr) * step / warmup_steps


def warmup_factors(base_lr: float, peak_lr: float, warmup_steps: int):
    """A ``LambdaLR`` multiplier for an optimizer whose lr is set to ``peak_lr``.

    opt = SGD(params, lr=peak_lr)
    sched = LambdaLR(opt, warmup_factors(base_lr, peak_lr, warmup_steps))
    ... opt.step(); sched.step()   # once per optimizer step
    """
    if peak_lr <= 0:
        raise ValueError(f"peak_lr must be > 0, got {peak_lr}")

    def factor(step: int) -> float:
        return warmup_lr(step, base_lr, peak_lr, warmup_steps) / peak_lr

    return factor


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


# --------------------------------------------------------------------------- measuring


@dataclass
class StudyConfig:
    """Weak and strong scaling of DDP training on 1..N local ranks (real gloo processes)."""

    modes: str = "weak,strong"  # comma-separated: weak, strong
    ranks: str = "1,2,4"  # comma-separated rank counts; the first is the baseline
    batch: int = 64  # weak scaling: the per-rank batch
    global_batch: int = 128  # strong scaling: the fixed global batch
    steps: int = 20  # timed steps per configuration (after one untimed step)
    total_threads: int = 0  # threads shared by all ranks; 0: every core of this machine
    dataset: str = "cifar10"
    timeout: float = 300.0


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"expected comma-separated integers such as '1,2,4', got {text!r}"
        ) from None


def train_each(d, runs: list) -> list[dict]:
    """On every rank: train each config in turn (one spawn, one process start-up)."""
    from helpers.programs.train_ddp import train

    return [train(d, run) for run in runs]


def run_study(cfg: StudyConfig) -> list[dict]:
    """Measure DDP throughput for every (mode, ranks) pair; one row per configuration.

    Threads: ranks share ``total_threads`` (1 rank x T threads, 2 ranks x T/2, ...)
    so that a configuration with more ranks gets no more compute; once there are
    more ranks than threads each rank keeps 1 thread and the machine is
    oversubscribed (the row says so).
    """
    import os

    from helpers import launch
    from helpers.programs.train_ddp import DDPConfig

    modes = [m.strip() for m in cfg.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("weak", "strong")]
    if bad:
        raise ValueError(f"unknown scaling mode(s) {bad}: use 'weak' and/or 'strong'")
    total = cfg.total_threads or len(os.sched_getaffinity(0))
    rows = []
    for n in _ints(cfg.ranks):
        threads = max(1, total // n)
        batches = [
            cfg.batch if mode == "weak" else local_batch(cfg.global_batch, n) for mode in modes
        ]
        runs = [
            DDPConfig(
                dataset=cfg.dataset,
                offline="true",
                epochs=1,
                max_steps=cfg.steps + 1,
                batch_size=b,
                n_train=(cfg.steps + 2) * b * n,
                n_test=10,
                evaluate=False,
                verbose=False,
            )  # fmt: skip
            for b in batches
        ]
        # Throughput does not depend on pixel values, so the offline stand-in is
        # used even where the real dataset exists.
        results = launch.spawn(train_each, world_size=n, args=(runs,), threads=threads,
                               timeout=cfg.timeout)[0]  # fmt: skip
        for mode, b, m in zip(modes, batches, results, strict=True):
            rows.append({
                "mode": mode, "ranks": n, "threads": threads, "local_batch": b,
                "global_batch": b * n, "samples_per_s": m["samples_per_s"],
                "oversubscribed": n * threads > total,
            })  # fmt: skip
    return sorted(rows, key=lambda r: (r["mode"] != "weak", r["ranks"]))


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


@dataclass
class BenchConfig(StudyConfig):
    """DDP samples/s for 1 vs 2 ranks at equal total threads (1 x T vs 2 x T/2)."""

    ranks: str = "1,2"
    steps: int = 30


def bench_main(argv: list[str] | None = None) -> None:
    """``python -m helpers.bench ddp [--ranks 1,2] [--steps 30] [--modes weak,strong]``.

    On a busy machine a multi-threaded rank suffers from OpenMP's spinning waits;
    compare with ``OMP_WAIT_POLICY=PASSIVE python -m helpers.bench ddp``.
    """
    import os

    from helpers.config import parse
    from helpers.viz import machine_label

    cfg = parse(BenchConfig, argv, prog="python -m helpers.bench ddp")
    print(f"DDP training throughput of the CIFAR CNN, {cfg.steps} timed steps per row")
    policy = os.environ.get("OMP_WAIT_POLICY", "unset (OpenMP threads spin while waiting)")
    print(f"measured on {machine_label()}; OMP_WAIT_POLICY={policy}")
    print(format_table(add_efficiency(run_study(cfg))))
    print(
        "All rows share the same threads, so without overhead the speedup would be 1.0 (the same\n"
        "cores split differently); on a cluster each rank adds a device and the ideal is N."
    )
