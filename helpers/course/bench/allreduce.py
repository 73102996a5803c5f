"""``python -m helpers.course.bench allreduce``: the hand-written ring and parameter server
against gloo's ``all_reduce``, timed on real local ranks."""

from __future__ import annotations

from dataclasses import dataclass

from helpers import launch
from helpers.config import parse
from helpers.parallel.collectives import measure
from helpers.viz.common import machine_label


@dataclass
class BenchConfig:
    """python -m helpers.course.bench allreduce: hand ring vs gloo all_reduce."""

    size_mb: float = 4.0
    ranks: str = "2,4"
    table_kb: str = "4,64,1024"
    repeats: int = 10


def main(argv: list[str] | None = None) -> None:
    """Print hand-made ring and parameter server vs torch all_reduce times."""

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
    print(f"all-reduce of float32 tensors, median of {cfg.repeats}; {machine_label()}")
    print(
        f"{'ranks':>5} {'size':>10} {'ring (ms)':>10} {'ps (ms)':>10} {'builtin (ms)':>13} "
        f"{'ring/builtin':>13}"
    )
    for w in worlds:
        rows = launch.spawn(
            measure, world_size=w, args=(sizes, ("ring", "ps", "builtin"), cfg.repeats), timeout=600
        )[0]
        by = {(r["algo"], r["bytes"]): r["seconds"] for r in rows}
        for nbytes in sorted({r["bytes"] for r in rows}):
            ring, ps, blt = (by[(a, nbytes)] * 1e3 for a in ("ring", "ps", "builtin"))
            size = f"{nbytes / 2**20:g} MB" if nbytes >= 2**20 else f"{nbytes / 1024:g} KB"
            print(f"{w:>5} {size:>10} {ring:>10.3f} {ps:>10.3f} {blt:>13.3f} {ring / blt:>13.2f}")
