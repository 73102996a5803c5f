"""``python -m helpers.course.bench allreduce``: the hand-written ring and parameter server
against gloo's ``all_reduce``, timed on real local ranks."""

from __future__ import annotations

from dataclasses import dataclass

from helpers import launch
from helpers.config import parse
from helpers.parallel.collectives.collectives import measure, pingpong
from helpers.parallel.collectives.costmodel import bus_bandwidth, fit_pingpong, predict
from helpers.viz.common import machine_label


@dataclass
class BenchConfig:
    """python -m helpers.course.bench allreduce: hand ring vs gloo all_reduce vs the model."""

    size_mb: float = 4.0
    ranks: str = "2,4"
    table_kb: str = "4,64,1024"
    repeats: int = 10


def main(argv: list[str] | None = None) -> None:
    """Print ring, parameter server and torch all_reduce times beside the ping-pong model."""

    cfg = parse(BenchConfig, argv, prog="python -m helpers.course.bench allreduce")
    try:
        worlds = [int(w) for w in cfg.ranks.split(",") if w.strip()]
        table = [int(float(k) * 1024) for k in cfg.table_kb.split(",") if k.strip()]
    except ValueError as e:
        raise SystemExit(f"--ranks and --table-kb take comma-separated numbers ({e})") from e
    if not worlds or min(worlds) < 2:
        raise SystemExit(f"--ranks needs world sizes >= 2, got {cfg.ranks!r}")
    if cfg.size_mb <= 0 or cfg.repeats < 1 or min(table, default=1) < 4:
        raise SystemExit("--size-mb must be > 0, --repeats >= 1 and --table-kb sizes >= 4 bytes")
    sizes = sorted(set(table + [int(cfg.size_mb * 2**20)]))
    pp = launch.spawn(pingpong, world_size=2, args=(sizes, cfg.repeats), timeout=600)[0]
    ab = fit_pingpong([r["bytes"] for r in pp], [r["seconds"] for r in pp])
    print(f"all-reduce of float32 tensors, median of {cfg.repeats}; {machine_label()}")
    print(f"alpha-beta fitted once from a send/recv ping-pong: {ab}")
    print(
        f"{'ranks':>5} {'size':>10} {'algo':>8} {'median ms':>10} {'quartiles ms':>16} "
        f"{'model ms':>9} {'bus GB/s':>9}"
    )
    for w in worlds:
        rows = launch.spawn(
            measure, world_size=w, args=(sizes, ("ring", "ps", "builtin"), cfg.repeats), timeout=600
        )[0]
        for r in sorted(rows, key=lambda r: (r["bytes"], r["algo"])):
            nbytes = r["bytes"]
            size = f"{nbytes / 2**20:g} MB" if nbytes >= 2**20 else f"{nbytes / 1024:g} KB"
            quart = f"{r['lo'] * 1e3:.3f}-{r['hi'] * 1e3:.3f}"
            model = predict(r["algo"], nbytes, w, ab) * 1e3
            bus = bus_bandwidth(nbytes, w, r["seconds"]) / 1e9
            print(
                f"{w:>5} {size:>10} {r['algo']:>8} {r['seconds'] * 1e3:>10.3f} {quart:>16} "
                f"{model:>9.3f} {bus:>9.2f}"
            )
