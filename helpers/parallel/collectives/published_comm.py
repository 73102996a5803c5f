"""Published all-reduce measurements on GPUs, as their sources print them, and the links.

Notebook 02 measures collectives on CPU ranks that share two cores, where the alpha-beta
model's assumptions (a processor and a link per rank) do not hold. These are figures measured
by others on GPU nodes, where they do, so the model can be checked against them. Every number
is copied from the source named beside it; nothing here is measured by the workbook.

    RING_VS_RANKS   all-reduce bus bandwidth on 4..8 H200 of one node, 8 GiB, NCCL's ring
                    forced (NVLS off) and NCCL's own choice (NVLS from 5 GPUs on)
    SWEEP_H200      nccl-tests all_reduce_perf on 8 H200 of one node, 32 KiB .. 16 GiB
    SWEEP_B200      the same sweep through torch.distributed on 1 node (8 B200) and on
                    4 nodes (32 B200, EFA between nodes)
    LINKS           the links of the three sites' GPU nodes (4-GPU NVLink meshes, 8-GPU
                    NVSwitch nodes, PCIe, the networks), their spec bandwidth and the
                    published all-reduce bus bandwidths over them; link_shares divides each
                    by the spec of the link it was measured on

``fit_sweep`` fits the ring formula's alpha and beta to a published sweep the way 02 fits
its ping-pong: beta from the largest messages, alpha from the smallest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from helpers.parallel.collectives.costmodel import AlphaBeta, fit_pingpong

__all__ = ["ML_ENGINEERING", "RING_VS_RANKS", "SWEEP_H200", "SWEEP_B200", "LINKS", "fit_sweep",
           "link_shares", "sweep_times"]  # fmt: skip

KIB, MIB, GIB = 2**10, 2**20, 2**30
GB = 1e9  # the sources' GBps are decimal: 1 GBps = 1e9 bytes per second

ML_ENGINEERING = (
    "S. Bekman, Machine Learning Engineering, github.com/stas00/ml-engineering, network/README.md "
    "and network/benchmarks/README.md (commit 744d01e, 2026-08)"
)

# network/README.md, "SHARP": nccl-tests all_reduce_perf -b 8G -g N on an 8x H200 node
# (NVLink 4), once as NCCL chooses and once with NCCL_NVLS_ENABLE=0 (the ring).
RING_VS_RANKS = {
    "gpu": "H200 SXM (NVLink 4, NVSwitch)",
    "bytes": 8 * GIB,
    "ranks": [4, 5, 6, 7, 8],
    "ring_GBps": [363.3, 364.4, 365.1, 365.7, 365.6],
    "nccl_choice_GBps": [363.3, 414.2, 435.6, 460.0, 473.1],
    "source": ML_ENGINEERING + ', section "SHARP"',
}

_SWEEP_SIZES = [32 * KIB * 2**k for k in range(15)] + [GIB * 2**k for k in range(5)]
# fmt: off
_H200_NCCL_TESTS = [3.20, 6.26, 12.40, 24.63, 48.30, 72.45, 91.48, 139.97, 182.03, 242.45,
                    298.44, 369.82, 411.21, 442.27, 455.82, 464.00, 468.31, 473.10, 475.16,
                    480.70]
_B200_ONE_NODE = [1.20, 2.17, 4.86, 9.54, 18.71, 36.06, 63.09, 76.48, 126.49, 254.96, 325.97,
                  400.60, 568.38, 646.11, 688.99, 723.34, 734.97, 740.64, 839.07, 845.67]
_B200_FOUR_NODES = [0.01, 0.04, 0.45, 1.33, 2.84, 5.37, 10.38, 18.90, 35.12, 64.43, 91.19,
                    156.74, 197.94, 229.09, 326.90, 361.99, 372.42, 377.34, 380.39, 381.80]
# fmt: on

# network/benchmarks/README.md, "How the calls are timed": the nccl-tests column, 8x H200.
SWEEP_H200 = {
    "label": "1 node, 8x H200 (nccl-tests)",
    "ranks": 8,
    "bytes": _SWEEP_SIZES,
    "busbw_GBps": _H200_NCCL_TESTS,
    "note": "on this node type NCCL (2.27.7, NCCL_DEBUG=INFO) chose Ring with the LL protocol "
    "up to 1 MiB and NVLS (NVLink SHARP) with the Simple protocol from 2 MiB up",
    "source": ML_ENGINEERING + ', benchmarks section "How the calls are timed"',
}

# network/README.md, "Inter-node speed depends on intra-node speed": all_reduce_bench.py
# (torch.distributed) on P6-B200 nodes, 8x B200 with NVLink 5 inside, 8x 50 GBps EFA v4 out.
SWEEP_B200 = {
    "gpu": "B200 (NVLink 5 inside a node, 8x 400 Gb/s EFA v4 between nodes)",
    "bytes": _SWEEP_SIZES,
    "runs": {"1 node, 8x B200": (8, _B200_ONE_NODE), "4 nodes, 32x B200": (32, _B200_FOUR_NODES)},
    "link_GBps": {"NVLink 5 per GPU": 900.0, "EFA per GPU": 50.0},
    "source": ML_ENGINEERING + ', section "Inter-node speed depends on intra-node speed"',
}

# The links of the sites' GPU nodes, per GPU and direction, and the all-reduce bus bandwidths
# published over each. "spec_GBps" is the link a measurement ran on, so "busbw_GBps / spec_GBps"
# is the share of its own link a ring reached; a row with busbw_GBps None has no published
# measurement (helpers.cluster.nccl_tests writes the job that measures it). Node shapes:
# slurm/profiles/ and helpers/gpus.py. Spec figures: ML Engineering's tables; NVLink 3 and 4
# carry 25 GB/s per link and direction (A100: 12 links, H100/H200 SXM: 18); a 4-GPU HGX board
# joins its GPUs directly, all links split among the 3 peers, with no NVSwitch (so no NVLink
# SHARP), while 8-GPU boards go through NVSwitches. PCIe x16 per direction: 4.0 31.5 GB/s,
# 5.0 63 GB/s.
LINKS = [
    {"link": "PCIe 4.0 x16", "sites": "Engaging L40S nodes (PCIe only between GPUs)",
     "spec_GBps": 31.5, "busbw_GBps": None,
     "measured": "none found for L40S; on a PCIe 4.0 node NCCL's own topology search rated the "
     "path 24 GB/s (NCCL_DEBUG=INFO, NVIDIA/nccl-tests#307)"},
    {"link": "PCIe 5.0 x16", "sites": "none of the three (for comparison)", "spec_GBps": 63,
     "busbw_GBps": 28, "measured": "28 GB/s on 8 GeForce RTX 5090 over PCIe 5.0, 35 on 4 (NVIDIA/nccl#1639), "
     "without peer-to-peer (GeForce drivers do not enable it): staged through host memory, where "
     "the CPU and memory set the limit; no figure for data-center GPUs with P2P over PCIe"},
    {"link": "NVLink 3, 4 A100 in a direct mesh (no NVSwitch)",
     "sites": "Perlmutter (4 A100 SXM4 40 GB per node: 4 links, 100 GB/s, to each peer)",
     "spec_GBps": 300, "busbw_GBps": None, "measured": "none found: the nccl-tests job below"},
    {"link": "NVLink 3 through NVSwitch, 8 A100", "sites": "Jean Zay A100 nodes (gpu_p5, 8 per node)",
     "spec_GBps": 300, "busbw_GBps": 232, "measured": "232 GB/s on 8 A100 (NVIDIA/nccl-tests#175)"},
    {"link": "NVLink 4, 4 H100/H200 in a direct mesh (no NVSwitch)",
     "sites": "Jean Zay H100 nodes (gpu_p6, 4 per node: 6 links, 150 GB/s, to each peer); "
     "Engaging H200 nodes (4 per node; `nvidia-smi topo -m` says how they are joined)",
     "spec_GBps": 450, "busbw_GBps": None, "measured": "none found: the nccl-tests job below"},
    {"link": "NVLink 4 through NVSwitch, 8 H100/H200", "sites": "none of the three (8-GPU nodes)",
     "spec_GBps": 450, "busbw_GBps": 367, "measured": "367 GB/s ring, 482 GB/s with NVLink SHARP "
     "(NVLS: the NVSwitch reduces), on 8 H200 (ML Engineering)"},
    {"link": "InfiniBand HDR, 200 Gb/s per NIC", "sites": "between nodes (Jean Zay: InfiniBand)",
     "spec_GBps": 25, "busbw_GBps": 24, "measured": "96 GB/s peak with 4 NICs per node, about 24 "
     "per NIC (NVIDIA/nccl-tests#119)"},
    {"link": "InfiniBand NDR, 400 Gb/s per NIC", "sites": "between nodes", "spec_GBps": 50,
     "busbw_GBps": 47, "measured": "46-48 GB/s per NIC expected (NVIDIA, nccl-tests#290)"},
    {"link": "Slingshot-11, 200 Gb/s per NIC", "sites": "Perlmutter: 4 NICs per GPU node, "
     "NCCL through the aws-ofi-nccl plugin", "spec_GBps": 25, "busbw_GBps": None,
     "measured": "none found: the nccl-tests job below"},
]  # fmt: skip


def link_shares(links=None) -> dict[str, float]:
    """{link: published bus bandwidth / the spec of the link it was measured on}, measured rows."""
    rows = LINKS if links is None else links
    return {r["link"]: r["busbw_GBps"] / r["spec_GBps"] for r in rows if r["busbw_GBps"]}


def sweep_times(n_bytes: Sequence[float], busbw_GBps: Sequence[float], ranks: int) -> np.ndarray:
    """All-reduce seconds behind published bus bandwidths: t = 2(N-1)/N n / busbw."""
    n = np.asarray(n_bytes, dtype=float)
    return 2 * (ranks - 1) / ranks * n / (np.asarray(busbw_GBps, dtype=float) * GB)


def fit_sweep(
    n_bytes, busbw_GBps, ranks: int, small_upto: float = 256 * KIB, large_from: float = GIB
) -> AlphaBeta:
    """The ring formula's alpha and beta for a published all-reduce sweep.

    Per ring step ``T / 2(N-1) = alpha + (n / N) beta``: the ping-pong fit applied to one
    step, on the two ends of the sweep only: beta from messages of ``large_from`` bytes and
    more, alpha from messages up to ``small_upto``. The sizes in between are left out of
    the fit, so the model's curve there is a prediction.
    """
    n = np.asarray(n_bytes, dtype=float)
    t = sweep_times(n, busbw_GBps, ranks)
    ends = (n <= small_upto) | (n >= large_from)
    return fit_pingpong(n[ends] / ranks, t[ends] / (2 * (ranks - 1)), large_from=large_from / ranks)
