"""The planner's rules: a layout's stages, memory per GPU and step time (helpers.parallel.composed.planner).

Memory of one pipeline stage on one GPU (bytes):

    states       its blocks' parameters (divided by tp where TP splits a block) times the bytes
                 per parameter of weights, gradients and optimizer; ZeRO divides the optimizer
                 (stage >= 1), gradients (>= 2) and weights (3) by dp, and ZeRO-3 holds one
                 block's gathered weights and gradients while it computes
    activations  micro-batches in flight x micro-batch x its blocks' saved bytes: 1 without a
                 pipeline (gradient accumulation runs one micro-batch at a time), m with GPipe,
                 pp - stage with 1F1B; TP splits what it shards (all of it with sequence
                 parallelism); full recomputation keeps each block's input and rebuilds one
                 block at a time; the last stage adds the loss's fp32 logits (Workload.logits_bytes)

Step time (seconds), per micro-batch on a stage: compute (FLOPs / (peak x efficiency), the
efficiency times a GEMM's share of the roofline when the cluster asks for it: ``gemm_efficiency``; plus a
fixed cost per block; full recomputation runs the forward twice: x 4/3; DDP's bookkeeping once
per step, in the backward that syncs), TP's all-reduces
(2 per transformer block forward and 2 backward, 3 + 3 with full recomputation: 6 instead of 4)
and PP's two sends (the activation forward, its gradient back). Then

    pipeline     (m + pp - 1) x the slowest stage: a pipeline runs at its slowest stage, and
                 its fill and drain idle pp - 1 slots (interleaved: (pp - 1) / v slots, for v
                 times the sends) (on CPU ranks that share c cores, a
                 rank that waits lends its core to a busy one: the cores idle only while
                 fewer than c ranks compute, min(pp, c / (dp x tp)) - 1 slots)
    DP           an all-reduce of the stage's gradients (ring: 2 (n-1)/n x bytes), hidden
                 behind the last micro-batch's backward when the cluster overlaps
    ZeRO-3       per micro-batch an all-gather of the weights forward, another backward and a
                 reduce-scatter of the gradients: 1.5 x an all-reduce's bytes, m times over
                 (FSDP re-gathers for every micro-batch), hidden behind compute when it can be
    optimizer    memory-bound: every state read once, weights and optimizer states written back
"""

from __future__ import annotations

import functools
import math

__all__ = ["stages", "balanced_cuts", "memory", "step_time", "allreduce", "gather",
           "gemm_efficiency", "in_flight_microbatches"]  # fmt: skip

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: one all-reduce per bucket


def balanced_cuts(flops: list[float], parts: int) -> tuple[int, ...]:
    """Start indices of parts 1.. of the contiguous split that minimises the largest sum."""
    return _balanced_cuts(tuple(flops), parts)


@functools.lru_cache(maxsize=256)
def _balanced_cuts(flops: tuple[float, ...], parts: int) -> tuple[int, ...]:
    n = len(flops)
    prefix = [0.0]
    for f in flops:
        prefix.append(prefix[-1] + f)
    inf = float("inf")
    cost = [[inf] * (n + 1) for _ in range(parts + 1)]  # cost[k][i]: first i blocks in k parts
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    cost[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                c = max(cost[k - 1][j], prefix[i] - prefix[j])
                if c < cost[k][i] - 1e-12:
                    cost[k][i], cut[k][i] = c, j
    bounds, i = [], n
    for k in range(parts, 0, -1):
        bounds.append(cut[k][i])
        i = cut[k][i]
    return tuple(sorted(bounds)[1:])


def stages(blocks, pp: int, cuts: tuple[int, ...] | None = None) -> list[tuple]:
    """The blocks of each of the pp stages (cuts: where stages 1.. start; default balanced)."""
    if cuts is None:
        cuts = balanced_cuts([b.flops for b in blocks], pp)
    bounds = (0, *cuts, len(blocks))
    if len(bounds) != pp + 1 or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"cuts={cuts} must give {pp} non-empty stages of {len(blocks)} blocks")
    return [tuple(blocks[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


def _split(b, tp: int) -> int:
    return tp if b.tp else 1


def _act(b, tp: int) -> float:
    return b.act_replicated + (b.act_bytes - b.act_replicated) / _split(b, tp)


def in_flight_microbatches(lay, s: int) -> float:
    """Micro-batches whose activations stage s holds at its fullest (in whole-stage units)."""
    if lay.pp == 1:
        return 1
    if lay.schedule == "gpipe":
        return lay.micro_batches
    if lay.schedule == "interleaved":  # Megatron's warm-up chunks, plus the one in its forward
        v = lay.virtual
        chunks = (lay.pp - s - 1) * 2 + (v - 1) * lay.pp + 1
        return min(lay.micro_batches, chunks / v)
    return min(lay.micro_batches, lay.pp - s)


def gemm_efficiency(c, tokens: float, width: float, split_width: float) -> float:
    """A [tokens x width] @ [width x split_width] product's share of the peak, by the roofline:
    FLOPs 2 M K N over bytes 2 (M K + K N + M N) (16-bit values) against the GPU's ridge,
    peak FLOP/s / memory bytes/s. 1 when the product is compute-bound."""
    m, k, n = tokens, width, split_width
    intensity = m * k * n / (m * k + k * n + m * n)
    ridge = c.peak_tflops * 1e12 / (c.memory_gbs * 1e9)
    return min(1.0, intensity / ridge)


def _stage_memory(w, lay, blocks, s: int) -> dict:
    wb, gb, ob = w.state_bytes
    local = sum(b.params / _split(b, lay.tp) for b in blocks)
    shard = {k: lay.dp if lay.zero >= k else 1 for k in (1, 2, 3)}
    in_flight = in_flight_microbatches(lay, s)
    if lay.recompute == "full":  # keep block inputs, rebuild one block's activations at a time
        kept = sum(b.out_bytes / (_split(b, lay.tp) if b.act_replicated == 0 else 1)
                   for b in blocks)  # fmt: skip
        act = in_flight * lay.micro_batch * kept + lay.micro_batch * max(
            _act(b, lay.tp) for b in blocks
        )
    else:
        act = in_flight * lay.micro_batch * sum(_act(b, lay.tp) for b in blocks)
    if s == lay.pp - 1:  # the loss's fp32 logits, whole on every TP rank (the plan gathers them)
        act += in_flight * lay.micro_batch * w.logits_bytes
    largest = max(b.params / _split(b, lay.tp) for b in blocks)
    return {
        "weights": wb * local / shard[3],
        "gradients": gb * local / shard[2],
        "optimizer": ob * local / shard[1],
        "gathered": (wb + gb) * largest if lay.zero >= 3 else 0.0,
        "activations": act,
    }


def memory(w, lay, stage_blocks: list[tuple]) -> dict:
    """Bytes per GPU by kind on the fullest stage (all stages in ``lay.stage_gb``)."""
    per = [_stage_memory(w, lay, blocks, s) for s, blocks in enumerate(stage_blocks)]
    lay.stage_gb = [sum(m.values()) / 1e9 for m in per]
    return max(per, key=lambda m: sum(m.values()))


def allreduce(nbytes: float, n: int, gbs: float, latency: float, messages: int = 1) -> float:
    """Ring all-reduce of nbytes over n ranks: 2 (n-1) latencies per message + 2 (n-1)/n bytes."""
    if n == 1:
        return 0.0
    return 2 * (n - 1) * latency * messages + 2 * (n - 1) / n * nbytes / (gbs * 1e9)


def gather(nbytes: float, n: int, gbs: float, latency: float, messages: int = 1) -> float:
    """Ring all-gather (or reduce-scatter) of a whole of nbytes: half an all-reduce."""
    return allreduce(nbytes, n, gbs, latency, messages) / 2


def _links(c, lay) -> dict:
    def link(dim):
        return c.inter_gbs if lay.dims.crosses_nodes(dim) else c.intra_gbs

    return {d: link(d) for d in ("tp", "pp", "dp")}


def _per_microbatch(w, c, lay, blocks, links) -> tuple[float, float, float]:
    """(compute, TP, PP) seconds of one micro-batch's forward + backward on one stage."""
    again = 4 / 3 if lay.recompute == "full" else 1.0  # the forward runs twice
    mb = lay.micro_batch

    def rate(b) -> float:
        peak = c.peak_tflops * 1e12 * c.efficiency
        if not (c.gemm_model and b.width):
            return peak
        return peak * gemm_efficiency(c, mb * w.seq_len, b.width, b.width / _split(b, lay.tp))

    compute = sum(
        mb * b.flops * again / _split(b, lay.tp) / rate(b) + c.layer_overhead_s * again
        for b in blocks
    )
    rounds = 3 if lay.recompute == "full" else 2  # forward, (forward again), backward
    tp = sum(rounds * allreduce(mb * b.tp_bytes, lay.tp, links["tp"], c.latency_s, b.tp_messages)
             for b in blocks if b.tp and b.tp_messages)  # fmt: skip
    boundary = max(blocks[-1].out_bytes, blocks[0].out_bytes)
    sends = 2 * (lay.virtual if lay.schedule == "interleaved" else 1)  # each chunk's boundary
    pp = 0.0 if lay.pp == 1 else sends * (c.latency_s + mb * boundary / (links["pp"] * 1e9))
    return compute, tp, pp


def _data_parallel(w, c, lay, blocks, compute: float, links) -> float:
    """Exposed seconds of DP's (or ZeRO-3's) traffic for one stage."""
    wb, gb, _ = w.state_bytes
    local = sum(b.params / _split(b, lay.tp) for b in blocks)
    m = lay.micro_batches
    if lay.zero >= 3:  # all-gather forward and backward, reduce-scatter: per block, per mb
        n = len(blocks)
        traffic = m * (2 * gather(wb * local, lay.dp, links["dp"], c.latency_s, n)
                       + gather(gb * local, lay.dp, links["dp"], c.latency_s, n)
                       + n * c.fsdp_overhead_s)  # fmt: skip
        window = m * compute  # prefetched behind every block's compute
    else:
        grads = gb * local
        buckets = max(1, math.ceil(grads / BUCKET_BYTES))
        traffic = allreduce(grads, lay.dp, links["dp"], c.latency_s, buckets)
        window = compute * 2 / 3  # buckets go while the last micro-batch's backward runs
    return max(0.0, traffic - window) if c.overlap else traffic


def optimizer_time(w, c, lay, blocks) -> float:
    """The optimizer step: memory-bound, it reads every state once and writes back the
    weights and optimizer states (ZeRO >= 1: this rank's shard of them)."""
    wb, gb, ob = w.state_bytes
    local = sum(b.params / _split(b, lay.tp) for b in blocks)
    shard = lay.dp if lay.zero >= 1 else 1
    return local / shard * (wb + gb + ob + wb + ob) / (c.memory_gbs * 1e9)


def step_time(w, c, lay, stage_blocks: list[tuple]) -> dict:
    """Seconds per step by kind: compute, bubble, tp, pp, dp, optimizer (they add up)."""
    links = _links(c, lay)
    per = [_per_microbatch(w, c, lay, blocks, links) for blocks in stage_blocks]
    slowest = max(range(len(per)), key=lambda s: sum(per[s]))
    compute, tp, pp = per[slowest]
    idle = lay.pp  # slots of fill and drain
    if c.cores is not None:  # CPU ranks: a stage's dp x tp ranks may already fill the cores
        idle = min(lay.pp, max(1, math.ceil(c.cores / (lay.dp * lay.tp))))
    if lay.schedule == "interleaved":  # the fill and drain go in chunks of 1/v of a stage
        idle = 1 + (idle - 1) / lay.virtual
    m = lay.micro_batches
    dp = max(_data_parallel(w, c, lay, blocks, per[s][0], links)
             for s, blocks in enumerate(stage_blocks))  # fmt: skip
    # DDP's bookkeeping (its hooks filling the buckets) runs in the one backward that syncs:
    # the other micro-batches run under no_sync, as torch's pipeline stages also do.
    ddp = c.ddp_overhead_s if lay.dp > 1 and lay.zero < 3 else 0.0
    return {
        "compute": m * compute + ddp,
        "bubble": (idle - 1) * (compute + tp + pp),
        "tp": m * tp,
        "pp": m * pp,
        "dp": dp,
        "optimizer": max(optimizer_time(w, c, lay, blocks) for blocks in stage_blocks),
    }
