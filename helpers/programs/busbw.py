"""All-reduce bus bandwidth on every rank of the job: the figure nccl-tests report.

    torchrun --nproc-per-node 4 helpers/programs/busbw.py            (a GPU node: NCCL)
    python -m helpers.course.gpucheck                                  (runs it on all GPUs)

For each message size: the median of the slowest rank's time over repeats, for
``all_reduce`` (NCCL or gloo) and the workbook's hand-written ring, and the bus bandwidth
``2 (N - 1) / N x bytes / time``, which does not depend on N for an ideal ring. One rank
has nothing to all-reduce with (its bus bandwidth would be 0): the program refuses it.
The device-strict dry run (``WORKBOOK_SMALL``) measures two small sizes, three repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers import dist
from helpers.config import parse
from helpers.parallel.collectives.collectives import measure
from helpers.parallel.collectives.costmodel import bus_bandwidth
from helpers.runs import write_metrics


@dataclass
class BusConfig:
    """All-reduce bus bandwidth by message size."""

    # MiB, comma-separated
    sizes_mib: str = field(default="0.0625,1,16,256", metadata={"small": "0.0625,1"})
    repeats: int = field(default=10, metadata={"small": 3})


def main(argv: list[str] | None = None) -> None:
    cfg = parse(BusConfig, argv)
    sizes = [int(float(s) * 2**20) for s in cfg.sizes_mib.split(",")]
    with dist.session() as d:
        if d.world_size < 2:
            raise ValueError(
                "busbw needs at least 2 ranks: one rank has nothing to all-reduce with"
            )
        rows = measure(d, sizes, algos=("builtin", "ring"), repeats=cfg.repeats)
        for r in rows:
            r["busbw_GBps"] = bus_bandwidth(r["bytes"], d.world_size, r["seconds"]) / 1e9
            dist.print0(
                f"{r['algo']:>8} {r['bytes'] / 2**20:8.2f} MiB {r['seconds'] * 1e3:8.3f} ms "
                f"bus {r['busbw_GBps']:7.1f} GB/s"
            )
        write_metrics({"world_size": d.world_size, "device": dist.device_name(d.device),
                       "backend": d.backend, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
