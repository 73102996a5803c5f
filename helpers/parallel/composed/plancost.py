"""The planner's rules: a layout's stages, memory per GPU and step time (helpers.parallel.composed.planner).

Memory of one pipeline stage on one GPU (bytes):

    states       its blocks' parameters (divided by tp where TP splits a block), as its framework
                 holds them (helpers.parallel.composed.frameworks: weights, main gradients, fp32
                 master, Adam, DDP's bucket copy, FSDP's gathered blocks, DeepSpeed's buckets),
                 plus the embedding on the first stage and the output layer on the last
    activations  micro-batches in flight x micro-batch x its blocks' saved bytes (the count for
                 the block that runs): 1 without a pipeline (accumulation runs one micro-batch at
                 a time), m with GPipe, pp - stage with 1F1B; TP splits what it shards; full
                 recomputation keeps each block's input and rebuilds one block at a time;
                 selective recomputation drops the s x s scores; the last stage adds the loss's
                 buffers (Workload.logits_bytes)

Step time (seconds), per micro-batch on a stage: compute = the matmuls' FLOPs at the cluster's
efficiency times their shape's share of it (``gemm_efficiency``: time = FLOPs / rate + bytes /
bandwidth, so few tokens or a narrow TP split run slower) plus the memory-bound work around
them (``Cluster.elementwise_passes``, 4 by a count, x the saved bytes / bandwidth: norms,
activations, softmax, the attention scores when they are stored), plus a fixed cost per block;
full recomputation runs the forward again (4/3 of the FLOPs, one more pass over the saved
bytes), selective the attention scores; DDP's bookkeeping once per step; TP's all-reduces (2 per
transformer block forward and 2 backward, 3 + 3 with full recomputation) and PP's two sends
(with Megatron's scatter/gather, Narayanan et al. section 4.1, each TP rank sends 1/tp of the
boundary across the nodes and the TP group all-gathers it on arrival). Then

    pipeline     (m + pp - 1) x the slowest stage: a pipeline runs at its slowest stage, and
                 its fill and drain idle pp - 1 slots (interleaved: (pp - 1) / v slots, for v
                 times the sends) (on CPU ranks that share c cores, a
                 rank that waits lends its core to a busy one: the cores idle only while
                 fewer than c ranks compute, min(pp, c / (dp x tp)) - 1 slots)
    DP           an all-reduce of the stage's gradients in the framework's gradient bytes
                 (ring: 2 (n-1)/n x bytes), hidden behind the last micro-batch's backward when
                 the cluster overlaps
    ZeRO-3       per micro-batch an all-gather of the weights forward, another backward and a
                 reduce-scatter of the gradients, m times over (FSDP re-gathers for every
                 micro-batch), hidden behind compute when it can be
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
    n = len(blocks)
    if cuts is None and n % pp == 0 and all(b is blocks[0] for b in blocks):
        return [tuple(blocks[: n // pp])] * pp  # identical blocks: equal stages, one tuple
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
    """A [tokens x width] @ [width x split_width] product's share of the compute-bound rate.

    Its time is the FLOPs at the rate a large product reaches (peak x efficiency) plus the
    bytes it moves at the memory bandwidth: 2 M K N FLOPs over 2 (M K + K N + M N) bytes
    (16-bit values), so share = 1 / (1 + ridge / intensity), the ridge being rate / bandwidth.
    It falls with few tokens per micro-batch (the weights are read for fewer rows) and with a
    narrow split; a bound, no tile or wave quantisation (notebook 07 fits it on this CPU)."""
    m, k, n = tokens, width, split_width
    intensity = m * k * n / (m * k + k * n + m * n)
    ridge = c.peak_tflops * 1e12 * c.efficiency / (c.memory_gbs * 1e9)
    return 1 / (1 + ridge / intensity)


def _sums(lay, blocks) -> dict:
    """What a stage's memory needs from its blocks (computed once per distinct stage)."""
    act = [_act(b, lay.tp) for b in blocks]
    return {"local": sum(b.params / _split(b, lay.tp) for b in blocks),
            "largest": max(b.params / _split(b, lay.tp) for b in blocks),
            "act": sum(act), "act_max": max(act),
            "scores": sum(b.score_bytes / _split(b, lay.tp) for b in blocks),
            "kept": sum(b.out_bytes / (_split(b, lay.tp) if b.act_replicated == 0 else 1)
                        for b in blocks)}  # fmt: skip


def _activations(w, lay, sums: dict, s: int, unsharded: float = 0.0) -> float:
    """Bytes at the start of the backward: the activations of the micro-batches in flight, and
    on the last stage the loss's buffers, or the first block's unsharded gradient (ZeRO-3)
    once the loss has been freed, whichever is larger."""
    in_flight = in_flight_microbatches(lay, s) * lay.micro_batch
    if lay.recompute == "full":  # keep block inputs, rebuild one block's activations at a time
        act = in_flight * sums["kept"] + lay.micro_batch * sums["act_max"]
    elif lay.recompute == "selective":  # the scores are dropped, rebuilt in backward
        act = in_flight * (sums["act"] - sums["scores"])
    else:
        act = in_flight * sums["act"]
    loss = 0.0
    if s == lay.pp - 1:  # the loss's buffers (whole on every TP rank unless vocabulary-parallel)
        loss = in_flight * w.logits_bytes / (lay.tp if w.loss_split else 1)
    return act + max(loss, unsharded)


def _stage_memory(w, lay, sums: dict, s: int, fw) -> dict:
    """Bytes by kind at the stage's peak: the start of a backward (every activation in flight,
    the loss's buffers or the first block's unsharded gradient, the transient gradients too
    once a step has more than one micro-batch) or the end of the backward (gradients, with one
    block's activations or the optimizer step's temporaries), whichever is larger."""
    edge = (w.edge_params[0] if s == 0 else 0) + (w.edge_params[1] if s == lay.pp - 1 else 0)
    local = sums["local"] + edge / lay.tp
    held = fw.states(local, sums["largest"], lay.dp)
    late = fw.late(local, sums["largest"], lay.dp)
    grads = held["gradients"] + (late["grads"] if lay.micro_batches > 1 else 0.0)
    act = _activations(w, lay, sums, s, late["unsharded"])
    forward = {**held, "gradients": grads, "activations": act}
    # the end of the backward (a block's activations) or the optimizer step (its temporaries)
    last = max(lay.micro_batch * sums["act_max"], late["step"])
    backward = {**held, "gradients": held["gradients"] + late["grads"] + late["unsharded"],
                "activations": last}  # fmt: skip
    return max(forward, backward, key=lambda m: sum(m.values()))


def memory(w, lay, stage_blocks: list[tuple], fw) -> dict:
    """Bytes per GPU by kind on the fullest stage (all stages in ``lay.stage_gb``)."""
    memo: dict[int, dict] = {}
    per = []
    for s, blocks in enumerate(stage_blocks):
        if id(blocks) not in memo:
            memo[id(blocks)] = _sums(lay, blocks)
        sums = memo[id(blocks)]
        per.append(_stage_memory(w, lay, sums, s, fw))
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


def _compute(w, c, lay, b) -> float:
    """Seconds of one block's forward + backward on one micro-batch, on one GPU."""
    mb, split = lay.micro_batch, _split(b, lay.tp)
    rate = c.peak_tflops * 1e12 * c.efficiency
    if c.gemm_model and b.width:
        rate *= gemm_efficiency(c, mb * w.seq_len, b.width, b.width / split)
    flops, passes = b.flops, c.elementwise_passes
    if lay.recompute == "full":  # the forward runs again, and writes its activations again
        flops, passes = flops * 4 / 3, passes + 1
    elif lay.recompute == "selective":  # the attention scores are rebuilt in backward
        flops = flops + b.score_flops
    moved = passes * _act(b, lay.tp) + (
        b.score_bytes / split if lay.recompute == "selective" else 0
    )
    memory_bound = moved * mb / (c.memory_gbs * 1e9) if c.elementwise else 0.0
    fixed = c.layer_overhead_s * (4 / 3 if lay.recompute == "full" else 1)
    return mb * flops / split / rate + memory_bound + fixed


def _per_microbatch(w, c, lay, blocks, links) -> tuple[float, float, float]:
    """(compute, TP, PP) seconds of one micro-batch's forward + backward on one stage."""
    mb = lay.micro_batch
    compute = sum(_compute(w, c, lay, b) for b in blocks)
    rounds = 3 if lay.recompute == "full" else 2  # forward, (forward again), backward
    tp = sum(rounds * allreduce(mb * b.tp_bytes, lay.tp, links["tp"], c.latency_s, b.tp_messages)
             for b in blocks if b.tp and b.tp_messages)  # fmt: skip
    sends = 2 * (lay.virtual if lay.schedule == "interleaved" else 1)  # each chunk's boundary
    boundary = mb * max(blocks[-1].out_bytes, blocks[0].out_bytes)
    pp = sends * _send(c, lay, links, boundary) if lay.pp > 1 else 0.0
    return compute, tp, pp


def _send(c, lay, links, nbytes: float) -> float:
    """One stage boundary crossed once: the whole tensor, or (scatter/gather) 1/tp of it from
    each TP rank, then an all-gather inside the TP group."""
    if not lay.scatter_gather or lay.tp == 1:
        return c.latency_s + nbytes / (links["pp"] * 1e9)
    return (c.latency_s + nbytes / lay.tp / (links["pp"] * 1e9)
            + gather(nbytes, lay.tp, links["tp"], c.latency_s))  # fmt: skip


def _data_parallel(w, c, lay, blocks, compute: float, links, fw) -> float:
    """Exposed seconds of DP's (or ZeRO-3's) traffic for one stage, in the framework's bytes."""
    local = sum(b.params / _split(b, lay.tp) for b in blocks)
    m = lay.micro_batches
    if lay.zero >= 3:  # all-gather forward and backward, reduce-scatter: per block, per mb
        n, wb = len(blocks), fw.gathered_weight or fw.weights
        traffic = m * (2 * gather(wb * local, lay.dp, links["dp"], c.latency_s, n)
                       + gather(fw.grads * local, lay.dp, links["dp"], c.latency_s, n)
                       + n * c.fsdp_overhead_s)  # fmt: skip
        window = m * compute  # prefetched behind every block's compute
    else:
        grads = fw.grads * local
        buckets = max(1, math.ceil(grads / BUCKET_BYTES))
        traffic = allreduce(grads, lay.dp, links["dp"], c.latency_s, buckets)
        window = compute * 2 / 3  # buckets go while the last micro-batch's backward runs
    return max(0.0, traffic - window) if c.overlap else traffic


def optimizer_time(w, c, lay, blocks, fw) -> float:
    """The optimizer step: memory-bound, it reads every state once and writes back the
    weights, master weights and moments (sharded ones: this rank's shard of them)."""
    local = sum(b.params / _split(b, lay.tp) for b in blocks)

    def held(part):
        return getattr(fw, part) / (lay.dp if part in fw.sharded else 1)

    read = sum(held(p) for p in ("weights", "grads", "master", "moments"))
    write = sum(held(p) for p in ("weights", "master", "moments"))
    return local * (read + write) / (c.memory_gbs * 1e9)


def step_time(w, c, lay, stage_blocks: list[tuple], fw) -> dict:
    """Seconds per step by kind: compute, bubble, tp, pp, dp, optimizer (they add up)."""
    links = _links(c, lay)
    memo: dict[int, tuple] = {}  # identical stages (one tuple object) are costed once
    per = [memo[id(b)] if id(b) in memo else memo.setdefault(id(b), _per_microbatch(w, c, lay, b, links))
           for b in stage_blocks]  # fmt: skip
    slowest = max(range(len(per)), key=lambda s: sum(per[s]))
    compute, tp, pp = per[slowest]
    idle = lay.pp  # slots of fill and drain
    if c.cores is not None:  # CPU ranks: a stage's dp x tp ranks may already fill the cores
        idle = min(lay.pp, max(1, math.ceil(c.cores / (lay.dp * lay.tp))))
    if lay.schedule == "interleaved":  # the fill and drain go in chunks of 1/v of a stage
        idle = 1 + (idle - 1) / lay.virtual
    m = lay.micro_batches
    distinct = {id(b): (b, p) for b, p in zip(stage_blocks, per, strict=True)}.values()
    dp = max(_data_parallel(w, c, lay, b, p[0], links, fw) for b, p in distinct)
    # DDP's bookkeeping (its hooks filling the buckets) runs in the one backward that syncs:
    # the other micro-batches run under no_sync, as torch's pipeline stages also do.
    ddp = c.ddp_overhead_s if lay.dp > 1 and lay.zero < 3 else 0.0
    return {
        "compute": m * compute + ddp,
        "bubble": (idle - 1) * (compute + tp + pp),
        "tp": m * tp,
        "pp": m * pp,
        "dp": dp,
        "optimizer": max(optimizer_time(w, c, lay, b, fw) for b, _ in distinct),
    }
