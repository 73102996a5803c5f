"""``python -m helpers.course.bench launch``: cold torchrun vs warm spawn for one all-reduce."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.config import parse

ALLREDUCE_PROGRAM = '''\
"""One all-reduce on every rank: the smallest complete distributed program."""
import torch
import torch.distributed as tdist

from helpers import dist


def main():
    d = dist.init()
    t = torch.ones(1)
    tdist.all_reduce(t)
    assert t.item() == d.world_size
    dist.cleanup()


if __name__ == "__main__":
    main()
'''


def _one_allreduce(d):
    """spawn() body: the same all-reduce as ALLREDUCE_PROGRAM."""
    import torch
    import torch.distributed as tdist

    t = torch.ones(1)
    tdist.all_reduce(t)
    return t.item()


@dataclass
class LaunchBench:
    """Cold torchrun vs warm spawn for one all-reduce."""

    sizes: str = "4,2"  # world sizes to measure, comma-separated
    # Warm spawn calls after the first: enough to see the slow tail (a rank that meets a
    # rendezvous port not yet open backs off for 0.3-0.8 s), not only the median.
    repeat: int = 30


def main(argv: list[str] | None = None) -> dict:
    from helpers import launch
    from helpers.launch import pool
    from helpers.viz.common import machine_label

    cfg = parse(LaunchBench, argv, prog="python -m helpers.course.bench launch")
    sizes = [int(s) for s in cfg.sizes.split(",") if s.strip()]
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "allreduce_once.py"
        program.write_text(ALLREDUCE_PROGRAM)
        for n in sizes:
            res = launch.run(program, nproc=n, name="bench-launch", stream=False, timeout=300)
            res.raise_for_status()
            # A fresh pool, so "first" includes starting it (importing torch once).
            pool.get_pool().close()
            t0 = time.perf_counter()
            launch.spawn(_one_allreduce, n)
            first = time.perf_counter() - t0
            warm = []
            for _ in range(cfg.repeat):
                t0 = time.perf_counter()
                launch.spawn(_one_allreduce, n)
                warm.append(time.perf_counter() - t0)
            out[n] = {
                "torchrun_cold_s": res.wall_time,
                "spawn_first_s": first,
                "spawn_warm_median_s": sorted(warm)[len(warm) // 2] if warm else None,
                "spawn_warm_min_s": min(warm) if warm else None,
                "spawn_warm_max_s": max(warm) if warm else None,
            }
    print(f"launch: one all-reduce, measured on {machine_label()}")
    print(
        f"{'ranks':>5} {'torchrun (cold)':>16} {'spawn (first)':>14} "
        f"{f'spawn (warm, median of {cfg.repeat})':>29} {'(min)':>7} {'(max)':>7}"
    )
    for n, r in out.items():
        warm = [r[f"spawn_warm_{k}_s"] for k in ("median", "min", "max")]
        med, lo, hi = (f"{x:.2f}s" if x is not None else "-" for x in warm)
        print(
            f"{n:>5} {r['torchrun_cold_s']:>15.2f}s {r['spawn_first_s']:>13.2f}s "
            f"{med:>29} {lo:>7} {hi:>7}"
        )
    print(
        "torchrun starts fresh interpreters that import torch; warm spawn forks ranks from a\n"
        "process that already did. On GPUs the start-up also includes CUDA and NCCL set-up."
    )
    return out
