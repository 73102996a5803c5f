"""A 3D-parallelism planner: which (pp, dp, tp) layouts fit, and which is fastest (estimated).

    plan(workload, cluster, global_batch)            fitting layouts, fastest first, each with
                                                     the micro-batch size and recomputation it
                                                     searched for; ties(...) = the ones within 5 %
    evaluate(workload, cluster, global_batch, dp=, tp=, pp=, micro_batch=, recompute=, zero=,
             schedule=, framework=)                  one layout, costed; .reason if it cannot run

A workload is a sequence of blocks (``Block``: parameters, FLOPs, saved activations, output
and TP traffic per sample), so a transformer (identical layers) and CoAtNet (cheap wide
convolutions, then expensive attention) are costed by the same rules (``plancost``):

    memory per GPU = the fullest stage's states as its framework holds them (frameworks: DDP's
                     bucket copy, FSDP2's gathered blocks, Megatron's fp32 main gradients, ...)
                     + micro-batches in flight x the activations of the block that runs
                     + on the first and last stage the embedding and output, on the last the loss
    step time      = (m + pp - 1) x the slowest stage's time per micro-batch (its matmuls at an
                     efficiency that depends on their shape, the memory-bound work around them,
                     TP's collectives, PP's sends)  + what DP's traffic leaves exposed

A layout fits when its memory stays under (GPU memory - the CUDA context and NCCL's buffers)
x (1 - a margin for the allocator): ``Cluster.usable_gb``. A cluster can also be this laptop:
``Cluster.cores`` says that its ranks share fewer cores than there are ranks (a rank that waits
lends its core), and its rates are measured (helpers.course.bench.planner).
"""

from __future__ import annotations

from helpers.parallel.composed import frameworks, plancost
from helpers.parallel.composed.mesh import ParallelDims, divisors
from helpers.parallel.composed.plantypes import (  # noqa: F401  (the planner's names)
    A100_EFFICIENCY,
    CLUSTERS,
    GB,
    H100_EFFICIENCY,
    RECOMPUTE,
    SCHEDULES,
    TIE,
    Cluster,
    Layout,
)
from helpers.parallel.composed.workloads import Block, Workload, activation_bytes  # noqa: F401

__all__ = ["Block", "Workload", "Cluster", "Layout", "CLUSTERS", "RECOMPUTE", "SCHEDULES",
           "evaluate", "candidates", "plan", "ties", "TIE", "activation_bytes",
           "framework_of"]  # fmt: skip


def _check(w: Workload, c: Cluster, global_batch: int, lay: Layout) -> str | None:
    try:
        lay.dims = ParallelDims(dp=lay.dp, tp=lay.tp, pp=lay.pp, world_size=c.world_size,
                                gpus_per_node=c.gpus_per_node)  # fmt: skip
    except ValueError as e:
        return str(e)
    first = w.blocks[0]
    uniform = all(b is first or b == first for b in w.blocks)
    if w.heads % lay.tp:
        return f"tp={lay.tp} does not divide the {w.heads} (kv) heads; tp in {divisors(w.heads)}"
    if uniform and w.layers % lay.pp:
        return f"pp={lay.pp} does not divide {w.layers} layers; pp in {divisors(w.layers)}"
    if lay.pp > w.layers:
        return f"pp={lay.pp} > {w.layers} blocks: a stage needs at least one"
    if global_batch % (lay.dp * lay.micro_batch):
        return (f"global batch {global_batch} does not split into dp={lay.dp} x micro-batches "
                f"of {lay.micro_batch}")  # fmt: skip
    if lay.recompute not in RECOMPUTE or lay.schedule not in SCHEDULES:
        return f"recompute in {RECOMPUTE}, schedule in {SCHEDULES}"
    if lay.schedule == "interleaved" and lay.pp > 1:
        if w.layers % (lay.pp * lay.virtual):
            return f"{w.layers} layers do not split into pp={lay.pp} x v={lay.virtual} chunks"
        if (global_batch // (lay.dp * lay.micro_batch)) % lay.pp:
            return f"interleaved 1F1B needs the micro-batches per step divisible by pp={lay.pp}"
    return None


def framework_of(w: Workload, zero: int, name=None) -> frameworks.Framework:
    """The memory rules of a layout: ``name`` (or a Framework), else the workload's for this
    ZeRO stage, else the ZeRO paper's count of ``w.state_bytes`` (no framework buffers)."""
    name = name or w.framework_for(zero)
    if name is None:
        return frameworks.zero_paper(w.state_bytes, zero)
    fw = name if isinstance(name, frameworks.Framework) else frameworks.lookup(name)
    if fw.zero != zero:
        raise ValueError(f"framework {name!r} is ZeRO-{fw.zero}, the layout asks zero={zero}: "
                         f"pass zero={fw.zero}, or another framework")  # fmt: skip
    return fw


def evaluate(w: Workload, c: Cluster, global_batch: int, dp: int, tp: int, pp: int,
             micro_batch: int = 1, zero: int = 0, recompute: str = "none",
             schedule: str = "1f1b", cuts: tuple[int, ...] | None = None,
             virtual: int = 2, framework: str | None = None,
             scatter_gather: bool = False) -> Layout:  # fmt: skip
    """One layout, costed; ``reason`` says why it cannot run (and what would).

    cuts: where the stages start (block indices after 0); default: balanced by FLOPs.
    virtual: chunks of layers per rank when schedule="interleaved" (Megatron's v).
    framework: whose memory rules (helpers.parallel.composed.frameworks, a name or a
    Framework); default the workload's for this ZeRO stage.
    scatter_gather: Megatron's pipeline sends (each TP rank sends 1/tp, all-gathered on arrival).
    """
    fw = framework_of(w, zero, framework)
    lay = Layout(None, dp, tp, pp, micro_batch=micro_batch, recompute=recompute, zero=zero,
                 framework=fw.name, schedule=schedule, scatter_gather=scatter_gather,
                 virtual=virtual if schedule == "interleaved" else 1)  # fmt: skip
    lay.reason = _check(w, c, global_batch, lay)
    if lay.reason:
        return lay
    lay.micro_batches = global_batch // (dp * micro_batch)
    stages = plancost.stages(w.blocks, pp, cuts)
    lay.memory = plancost.memory(w, lay, stages, fw)
    lay.time = plancost.step_time(w, c, lay, stages, fw)
    if lay.memory_gb > c.usable_gb:
        states = sum(v for k, v in lay.memory.items() if k != "activations") / GB
        lay.reason = (f"needs {lay.memory_gb:.1f} GB per GPU > {c.usable_gb:.1f} GB usable "
                      f"({c.gpu_memory_gib:g} GiB = {c.gpu_memory_gb:.1f} GB, less "
                      f"{c.reserve_gb:.2f} for the CUDA context and "
                      f"NCCL, less {c.margin:.0%} for the allocator; states {states:.1f} GB, "
                      f"activations {lay.memory['activations'] / GB:.1f} GB)")  # fmt: skip
    return lay


def _micro_batches(global_batch: int, dp: int, most: int = 64) -> list[int]:
    per_replica = global_batch // dp if global_batch % dp == 0 else 0
    return [b for b in divisors(per_replica) if b <= most] if per_replica else [1]


def best(w: Workload, c: Cluster, global_batch: int, dp: int, tp: int, pp: int,
         micro_batch: int | None = None, recompute: str | None = None, **kw) -> Layout:  # fmt: skip
    """The fastest fitting (micro-batch size, recomputation) of one (pp, dp, tp); ties: less memory.

    None searches that knob; if nothing fits, the layout that needs the least memory says why.
    """
    sizes = [micro_batch] if micro_batch else _micro_batches(global_batch, dp)
    modes = [recompute] if recompute else _modes(w)
    tried = [evaluate(w, c, global_batch, dp, tp, pp, micro_batch=b, recompute=r, **kw)
             for b in sizes for r in modes]  # fmt: skip
    ok = [lay for lay in tried if lay.fits]
    if ok:
        return min(ok, key=lambda lay: (round(lay.step_time, 9), lay.memory_gb))
    costed = [lay for lay in tried if lay.memory]
    return min(costed, key=lambda lay: lay.memory_gb) if costed else tried[0]


def _modes(w: Workload) -> list[str]:
    """Recomputation modes worth searching: selective only where it frees something."""
    return [r for r in RECOMPUTE if r != "selective" or any(b.score_bytes for b in w.blocks)]


def candidates(w: Workload, c: Cluster, global_batch: int, **kw) -> list[Layout]:
    """Every (pp, dp, tp) whose product is the world size, fitting or not (knobs searched)."""
    out = []
    for tp in divisors(c.world_size):
        for pp in divisors(c.world_size // tp):
            out.append(best(w, c, global_batch, c.world_size // (tp * pp), tp, pp, **kw))
    return out


def plan(w: Workload, c: Cluster, global_batch: int, **kw) -> list[Layout]:
    """The layouts that fit, fastest first (ties: less memory first)."""
    ok = [lay for lay in candidates(w, c, global_batch, **kw) if lay.fits]
    return sorted(ok, key=lambda lay: (round(lay.step_time, 9), lay.memory_gb))


def ties(layouts: list[Layout], rel: float = TIE) -> list[Layout]:
    """The layouts whose step time is within ``rel`` of the fastest: the model cannot tell them apart."""
    if not layouts:
        return []
    fastest = min(lay.step_time for lay in layouts)
    return [lay for lay in layouts if lay.step_time <= fastest * (1 + rel)]
