"""Checking the planner against measurement: this machine as a Cluster, and a ranking test.

    clusters = machines(probe_rounds, workload, ...)   the planner's rates, measured here
    pairs = ranking(names, predicted_rounds, measured_rounds)

``machines`` turns each round of probes, measured with every rank busy at once
(helpers.course.bench.planner), into a ``planner.Cluster``: the compute rate and a fixed cost
per block (two sizes of the same forward + backward: t = cost + FLOPs / rate, alpha-beta for
compute), the memory bandwidth the optimizer step sees, DDP's and FSDP's bookkeeping, and
alpha and beta of the links (helpers.parallel.collectives.costmodel, fitted to all-reduces of two sizes).
The planner predicts every layout with each round's cluster: its predictions have a spread,
as the measurements do.

``ranking`` compares layouts two by two on the rounds they were measured in: round k of a
and round k of b ran one after the other, under the same load, so the ratio of their times
in each round is what the load disturbs least. A measured order is decisive when every
round orders the pair the same way (the ratio's whole spread stays on one side of 1);
otherwise the pair is a measured tie. A pair is a predicted tie by the rule the planner
applies to GPU plans (``planner.ties``) and nothing else: its predicted ratio (the median over
the rounds' rates) lies within ``band`` of 1 (``planner.TIE``, 5 %). A decisive measured order
that the planner predicts outside the band the other way round is a violation.
``ratio_error`` is how far a predicted ratio is from the measured one: the error a tie band
has to cover, which a common factor in every step time does not enter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helpers.parallel.collectives import costmodel
from helpers.parallel.composed import planner

__all__ = ["machines", "median_cluster", "Pair", "ranking", "errors", "ADAM_TRAFFIC"]

ADAM_TRAFFIC = 28  # bytes an fp32 Adam step reads and writes per parameter (w, g, m, v; w, m, v)


def _rates(p: dict, workload: planner.Workload, rows: tuple[int, int]) -> dict:
    """The machine's figures from one round of probes (seconds, slowest rank)."""
    layers, flops = workload.layers, workload.blocks[0].flops
    t1, t2 = (p[f"rows {r}"] / layers for r in rows)
    rate = (rows[1] - rows[0]) * flops / max(t2 - t1, 1e-9)
    return {
        "rate": rate,
        "block": max(0.0, t1 - rows[0] * flops / rate),
        "ddp": max(0.0, p["ddp"] - p[f"rows {rows[0]}"]),
        "memory_gbs": workload.params * ADAM_TRAFFIC / p["adam"] / 1e9,
        "fsdp": max(0.0, (p["fsdp"] - p[f"rows {rows[1]}"] - p["adam"]) / layers),
    }


def machines(rounds: list[dict], workload: planner.Workload, rows: tuple[int, int],
             sizes: tuple[int, int], world: int, cores: int | None) -> list[planner.Cluster]:  # fmt: skip
    """One Cluster of one node of ``world`` ranks per round of probes.

    Each round's probes (seconds): ``rows r`` (the stack's forward + backward on r samples),
    ``ddp`` (the same on ``rows[0]`` under DDP), ``adam``, ``fsdp`` (forward + backward + Adam
    under FSDP, ``rows[1]`` samples) and ``all-reduce n`` (n bytes over every rank). Each
    round's figures come from that round alone, measured under the same load.
    """
    if len(rounds) < 3:
        raise ValueError(f"need probes from >= 3 rounds, got {len(rounds)}")
    out = []
    for p in rounds:
        r = _rates(p, workload, rows)
        links = costmodel.fit("builtin", list(sizes), [world] * len(sizes),
                              [p[f"all-reduce {n}"] for n in sizes])  # fmt: skip
        gbs = links.bandwidth / 1e9
        out.append(planner.Cluster(
            nodes=1, gpus_per_node=world, gpu_memory_gib=1e6, peak_tflops=r["rate"] / 1e12,
            efficiency=1.0, intra_gbs=gbs, inter_gbs=gbs, latency_s=links.alpha, overlap=False,
            cores=cores, layer_overhead_s=r["block"], ddp_overhead_s=r["ddp"],
            memory_gbs=r["memory_gbs"], fsdp_overhead_s=r["fsdp"], reserve_gb=0.0, margin=0.0,
            gemm_model=False, elementwise=False,  # the rates are the block's own, measured
            name=f"{world} CPU ranks on {cores} cores (measured)",
        ))  # fmt: skip
    return out


def median_cluster(clusters: list[planner.Cluster]) -> planner.Cluster:
    """The cluster whose every measured figure is the median over rounds (for display)."""
    from dataclasses import fields, replace

    numbers = [f.name for f in fields(planner.Cluster) if f.name not in ("nodes", "gpus_per_node",
               "overlap", "cores", "name")]  # fmt: skip
    return replace(clusters[0], **{k: float(np.median([getattr(c, k) for c in clusters]))
                                   for k in numbers})  # fmt: skip


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    predicted: float  # median over rounds of (predicted a / predicted b), each round's rates
    measured: float  # median over rounds of (time of a / time of b)
    low: float  # smallest and largest per-round measured ratio
    high: float
    predicted_low: float  # smallest and largest per-round predicted ratio
    predicted_high: float

    @property
    def decisive(self) -> bool:
        """Every round ordered a and b the same way: the ratio's spread excludes 1."""
        return self.high < 1 or self.low > 1

    def tie(self, band: float = planner.TIE) -> bool:
        """The planner's own rule: predicted within ``band`` of each other."""
        return abs(self.predicted - 1) <= band

    @property
    def predicted_tie(self) -> bool:
        return self.tie()

    def wrong(self, band: float = planner.TIE) -> bool:
        """A decisive measured order that the planner, outside ``band``, predicts the other way."""
        if not self.decisive or self.tie(band):
            return False
        return (self.predicted < 1) != (self.measured < 1)

    @property
    def violation(self) -> bool:
        return self.wrong()

    @property
    def ratio_error(self) -> float:
        """|predicted ratio / measured ratio - 1|: what a tie band must cover."""
        return abs(self.predicted / self.measured - 1)


def errors(rows: list[dict], pairs: list[Pair]) -> dict:
    """The check's error figures: step times (|predicted / measured - 1| per layout, median and
    worst, and the median signed one: a common factor), the ratios of the decisive pairs
    (median and worst) and the band that would have made every wrong order a tie."""
    step = sorted(abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows)
    signed = float(np.median([r["predicted_s"] / r["measured_s"] - 1 for r in rows]))
    decisive = [p for p in pairs if p.decisive]
    ratio = sorted(p.ratio_error for p in decisive) or [0.0]
    wrong = [abs(p.predicted - 1) for p in decisive if (p.predicted < 1) != (p.measured < 1)]
    return {"step_median": float(np.median(step)), "step_worst": step[-1], "step_signed": signed,
            "ratio_median": float(np.median(ratio)), "ratio_worst": ratio[-1],
            "band_needed": max(wrong, default=0.0)}  # fmt: skip


def ranking(names: list[str], predicted, rounds) -> list[Pair]:
    """Every pair of layouts. predicted and rounds: [layout][round] seconds, predicted with
    each round's rates and measured in that round."""
    times = np.asarray(rounds, dtype=float)
    pred = np.asarray(predicted, dtype=float)
    if times.ndim != 2 or times.shape[0] != len(names) or times.shape[1] < 3:
        raise ValueError("rounds must hold >= 3 rounds of measured seconds per layout")
    if pred.shape != times.shape:
        raise ValueError(f"predicted {pred.shape} and measured {times.shape} rounds differ")
    out = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            ratio, guess = times[i] / times[j], pred[i] / pred[j]
            out.append(Pair(names[i], names[j], float(np.median(guess)), float(np.median(ratio)),
                            float(ratio.min()), float(ratio.max()), float(guess.min()),
                            float(guess.max())))  # fmt: skip
    return out
