"""``python -m helpers.course.bench planner``: the planner's predictions against 4 CPU ranks.

Every layout the planner can express (helpers.parallel.composed.layouts.TRIALS: DP, DP with
accumulation, ZeRO-3, GPipe and 1F1B pipelines, TP and the 2 x 2 hybrids) trains a small
stack of Llama 2 blocks on 4 gloo ranks. The planner predicts each one's step time and peak
memory per rank from this machine's rates, measured in the same run (plancheck.machine).

Step times are measured in rounds: every layout once per round after a warm-up round, with
the probes at the start of each round, so a burst of load lands on all of them alike; a
step's time is its slowest rank's. Peak memory per rank: the CPU allocator's, one step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as tdist

from helpers import launch
from helpers.config import parse
from helpers.models import llama2
from helpers.parallel.composed import layouts, plancheck, planner
from helpers.parallel.composed.layouts import PROBE_BYTES, PROBE_ROWS, TRIALS, Trial

__all__ = ["BenchConfig", "SMALL", "model_args", "workload", "measure", "validate", "main"]


@dataclass
class BenchConfig:
    """python -m helpers.course.bench planner [--dim 256 --rounds 7 ...]"""

    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    seq_len: int = 64
    batch: int = 16  # sequences per step (global)
    rounds: int = 7  # timed rounds, after one warm-up round
    world: int = 4
    cores: int = field(default=0, metadata={"help": "cores the ranks share; 0: this machine's"})


SMALL = BenchConfig(dim=128, rounds=5)  # the test's and SMOKE's size


def model_args(cfg: BenchConfig) -> llama2.ModelArgs:
    return llama2.ModelArgs(dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                            vocab_size=cfg.dim, multiple_of=32, max_seq_len=cfg.seq_len)  # fmt: skip


def saved_bytes(cfg: BenchConfig, tp: int = 1) -> int:
    """Bytes one block saves for backward on one sample, counted by autograd's saved-tensor
    hooks; tp > 1: on one rank of Megatron TP, in this process (a fake process group)."""
    from helpers.parallel.composed.simulate import fake_rank
    from helpers.parallel.sharded.memory import saved_activation_bytes

    torch.manual_seed(0)
    layer = layouts.Layer(model_args(cfg))
    x = torch.randn(1, cfg.seq_len, cfg.dim, requires_grad=True)
    if tp == 1:
        return saved_activation_bytes(layer, x, params=layer)
    with fake_rank(0, tp):  # collectives return at once: shapes and saved tensors, no numbers
        layouts.megatron_tp(layer.block, None)
        return saved_activation_bytes(layer, x, params=layer)


def workload(cfg: BenchConfig) -> planner.Workload:
    """The block stack for the planner: fp32 Adam (4 + 4 + 8 bytes per parameter), DDP with
    its gradients as views of its buckets (no bucket copy) and FSDP2 in fp32, and the
    activations this block saves (workloads.llama_block_bytes, fp32; without sequence
    parallelism the norms and linear inputs stay whole on every TP rank): the rule 7.2 uses
    for GPUs, for the block that runs. ``hook_counted`` counts them again, for comparison."""
    return planner.Workload.llama(
        model_args(cfg), cfg.seq_len, name="Llama 2 blocks", bytes_per_value=4,
        state_bytes=(4, 4, 8), embeddings=False, sequence_parallel=False,
        framework=((0, "ddp-bucket-view"), (3, "fsdp2-fp32")),
    )  # fmt: skip


def hook_counted(cfg: BenchConfig) -> dict:
    """Bytes one block saves per sample, counted by autograd's hooks (whole, and what TP leaves
    whole on each of 2 ranks: what 2 ranks save beyond half the whole), beside the planner's
    rule for this block and Korthikanti et al.'s 34 s h (at 4-byte values)."""
    from helpers.parallel.composed import workloads

    whole, half = saved_bytes(cfg), saved_bytes(cfg, tp=2)
    rule = workloads.llama_block_bytes(model_args(cfg), cfg.seq_len, 4)
    formula = planner.activation_bytes(cfg.dim, cfg.seq_len, 4, sequence_parallel=False)
    return {
        "counted": whole,
        "counted_replicated": 2 * half - whole,
        "rule": rule["block"],
        "rule_replicated": rule["norms"],
        **formula,
    }


def _rank(d, cfg: BenchConfig, trials: tuple[Trial, ...]) -> dict:
    from helpers.launch import cores

    torch.set_num_threads(1)
    args, meshes = model_args(cfg), {}
    runs = [layouts.LayoutRun(d, t, args, cfg.batch, cfg.seq_len, meshes) for t in trials]
    probes = layouts.Probes(d, args, cfg.seq_len)
    times, calib = [[] for _ in runs], []
    with cores.clock() as clock:  # the cores this rank had during the timed rounds
        _rounds(cfg, runs, probes, times, calib)
    peaks = []
    for run in runs:
        resident = run.resident_bytes()
        tdist.barrier()
        peaks.append(resident + layouts.allocator_peak(run.step)[0])
    return {"times": times, "peaks": peaks, "probes": calib, "reading": clock.reading}


def _rounds(cfg: BenchConfig, runs, probes, times: list, calib: list) -> None:
    for r in range(cfg.rounds + 1):
        got = probes.measure()
        for i, run in enumerate(runs):
            tdist.barrier()
            t0 = time.perf_counter()
            run.step()
            if r:  # round 0 warms up (buffers, optimizer state, first messages)
                times[i].append(time.perf_counter() - t0)
        if r:
            calib.append(got)


def measure(cfg: BenchConfig, trials: tuple[Trial, ...] = TRIALS) -> dict:
    """``rounds[i][k]``: seconds of trial i in round k (slowest rank); ``peaks[i]``: bytes of
    the fullest rank; ``probes[k]``: each probe of round k (slowest rank)."""
    per_rank = launch.spawn(_rank, cfg.world, args=(cfg, trials), timeout=900)
    rounds = [[max(s) for s in zip(*(r["times"][i] for r in per_rank), strict=True)]
              for i in range(len(trials))]  # fmt: skip
    probes = [{k: max(r["probes"][j][k] for r in per_rank) for k in per_rank[0]["probes"][j]}
              for j in range(cfg.rounds)]  # fmt: skip
    peaks = [max(r["peaks"][i] for r in per_rank) for i in range(len(trials))]
    return {"rounds": rounds, "peaks": peaks, "probes": probes,
            "readings": [r["reading"] for r in per_rank]}  # fmt: skip


def cores_of(cfg: BenchConfig) -> int:
    import os

    return cfg.cores or len(os.sched_getaffinity(0))


def validate(cfg: BenchConfig, trials: tuple[Trial, ...] = TRIALS) -> dict:
    """Measure, then predict every trial with each round's measured rates: rows of predicted
    (median over rounds) and measured step time and memory, and the pairwise ranking check."""
    got = measure(cfg, trials)
    w = workload(cfg)
    clusters = plancheck.machines(got["probes"], w, PROBE_ROWS, PROBE_BYTES, cfg.world,
                                  cores_of(cfg))  # fmt: skip

    def predict(t: Trial, c: planner.Cluster) -> planner.Layout:
        return planner.evaluate(w, c, cfg.batch, t.dp, t.tp, t.pp, zero=t.zero,
                                micro_batch=cfg.batch // (t.dp * t.micro_batches),
                                schedule=t.schedule)  # fmt: skip

    predicted = [[predict(t, c).step_time for c in clusters] for t in trials]
    middle = plancheck.median_cluster(clusters)
    rows = []
    for t, guess, times, peak in zip(trials, predicted, got["rounds"], got["peaks"], strict=True):
        lay = predict(t, middle)
        q1, med, q3 = np.quantile(times, [0.25, 0.5, 0.75])
        rows.append({"name": t.name, "trial": t, "layout": lay,
                     "predicted_s": float(np.median(guess)), "measured_s": float(med),
                     "q1": float(q1), "q3": float(q3), "times": times,
                     "predicted_mb": lay.memory_gb * 1e3, "measured_mb": peak / 1e6})  # fmt: skip
    pairs = plancheck.ranking([r["name"] for r in rows], predicted, got["rounds"])
    return {
        "rows": rows,
        "pairs": pairs,
        "cluster": middle,
        "clusters": clusters,
        "probes": got["probes"],
        "rounds": got["rounds"],
        "predicted": predicted,
        "activations": hook_counted(cfg),
        "errors": plancheck.errors(rows, pairs),
        "premise": _premise(got["readings"], cfg),
    }


def _premise(readings, cfg: BenchConfig):
    """Whether the ranks had the cores the check assumes (the measured rates are per core)."""
    from helpers.launch import cores

    return cores.premise(readings, cores=cores_of(cfg))


def main(argv: list[str] | None = None) -> None:
    from helpers.viz.common import machine_label

    cfg = parse(BenchConfig, argv)
    out = validate(cfg)
    c = out["cluster"]
    print(f"measured on {machine_label('gloo', cfg.world)}: {c.peak_tflops * 1e3:.1f} GFLOP/s "
          f"per rank + {1e3 * c.layer_overhead_s:.1f} ms per block, alpha "
          f"{1e6 * c.latency_s:.0f} us, {c.intra_gbs:.2f} GB/s, memory {c.memory_gbs:.1f} GB/s")  # fmt: skip
    print(f"{'layout':>22} {'predicted ms':>12} {'measured ms (quartiles)':>24} {'MB pred':>8} "
          f"{'MB meas':>8}")  # fmt: skip
    for r in out["rows"]:
        print(f"{r['name']:>22} {1e3 * r['predicted_s']:>12.0f} {1e3 * r['measured_s']:>9.0f} "
              f"({1e3 * r['q1']:.0f}-{1e3 * r['q3']:.0f}){'':>6} {r['predicted_mb']:>8.1f} "
              f"{r['measured_mb']:>8.1f}")  # fmt: skip
    decisive = [p for p in out["pairs"] if p.decisive]
    bad = [p for p in out["pairs"] if p.violation]
    tied = [p for p in decisive if p.predicted_tie]
    e = out["errors"]
    print(
        f"{len(decisive)} of {len(out['pairs'])} pairs ordered alike in every round; the planner "
        f"orders {len(decisive) - len(tied) - len(bad)} of them right, calls {len(tied)} ties "
        f"(predicted within {planner.TIE:.0%}) and predicts {len(bad)} the other way round: "
        + ", ".join(f"{p.a} / {p.b}" for p in bad)
    )
    print(f"step times off by {e['step_median']:.0%} (median), {e['step_worst']:.0%} (worst); "
          f"ratios of decisive pairs off by {e['ratio_median']:.0%} (median), "
          f"{e['ratio_worst']:.0%} (worst)")  # fmt: skip
