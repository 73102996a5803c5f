"""The weak/strong scaling study: DDP throughput on 1..N real local ranks.

Runs helpers.programs.train_ddp's ``train`` on every rank through
helpers.launch.spawn, with the machine's threads shared between ranks, and
returns one row per (mode, ranks), with the ranks' ``readings`` (helpers.launch.cores:
the cores they had and wanted while they trained). The arithmetic (speedup, efficiency) is
helpers.parallel.data.scaling; ``python -m helpers.course.bench ddp`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.parallel.data.scaling import local_batch

__all__ = ["StudyConfig", "run_study", "train_each"]


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
    from helpers.launch import cores
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
        # cores.clocked: each rank also reports what its threads did (CPU, waiting for a core),
        # so a reader can tell whether the ranks had the cores the study gives them
        out = launch.spawn(cores.clocked(train_each), world_size=n, args=(runs,), threads=threads,
                           timeout=cfg.timeout)  # fmt: skip
        results, readings = out[0][0], [reading for _, reading in out]
        for mode, b, m in zip(modes, batches, results, strict=True):
            rows.append({
                "mode": mode, "ranks": n, "threads": threads, "local_batch": b,
                "global_batch": b * n, "samples_per_s": m["samples_per_s"],
                "oversubscribed": n * threads > total, "readings": readings,
            })  # fmt: skip
    return sorted(rows, key=lambda r: (r["mode"] != "weak", r["ranks"]))
