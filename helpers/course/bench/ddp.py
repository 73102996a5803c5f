"""``python -m helpers.course.bench ddp``: DDP samples/s on 1 vs 2 ranks at equal total threads."""

from __future__ import annotations

from dataclasses import dataclass

from helpers.course.scaling_study import StudyConfig, run_study
from helpers.parallel.data.scaling import add_efficiency, format_table


@dataclass
class BenchConfig(StudyConfig):
    """DDP samples/s for 1 vs 2 ranks at equal total threads (1 x T vs 2 x T/2)."""

    ranks: str = "1,2"
    steps: int = 30


def main(argv: list[str] | None = None) -> None:
    """``python -m helpers.course.bench ddp [--ranks 1,2] [--steps 30] [--modes weak,strong]``.

    On a busy machine a multi-threaded rank suffers from OpenMP's spinning waits;
    compare with ``OMP_WAIT_POLICY=PASSIVE python -m helpers.course.bench ddp``.
    """
    import os

    from helpers.config import parse
    from helpers.viz.common import machine_label

    cfg = parse(BenchConfig, argv, prog="python -m helpers.course.bench ddp")
    print(f"DDP training throughput of the CIFAR CNN, {cfg.steps} timed steps per row")
    policy = os.environ.get("OMP_WAIT_POLICY", "unset (OpenMP threads spin while waiting)")
    print(f"measured on {machine_label()}; OMP_WAIT_POLICY={policy}")
    print(format_table(add_efficiency(run_study(cfg))))
    print(
        "All rows share the same threads, so without overhead the speedup would be 1.0 (the same\n"
        "cores split differently); on a cluster each rank adds a device and the ideal is N."
    )
