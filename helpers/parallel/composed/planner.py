"""A 3D-parallelism planner: which (pp, dp, tp) layouts fit, and which is fastest (estimated).

    plan(workload, cluster, global_batch)            fitting layouts, fastest first, each with
                                                     the micro-batch size and recomputation it
                                                     searched for; ties(...) = the ones within 5 %
    evaluate(workload, cluster, global_batch, dp=, tp=, pp=, micro_batch=, recompute=, zero=,
             schedule=)                              one layout, costed; .reason if it cannot run

A workload is a sequence of blocks (``Block``: parameters, FLOPs, saved activations, output
and TP traffic per sample), so a transformer (identical layers) and CoAtNet (cheap wide
convolutions, then expensive attention) are costed by the same rules (``plancost``):

    memory per GPU = the largest stage's states (weights, gradients, optimizer: divided by tp
                     for the blocks TP splits, by dp as far as the ZeRO stage shards them)
                     + micro-batches in flight x their activations (GPipe m, 1F1B pp - stage)
                     + on the last stage, the loss's fp32 logits of the micro-batches in flight
    step time      = (m + pp - 1) x the slowest stage's time per micro-batch
                     (compute, TP's all-reduces, PP's sends)  + what DP's traffic leaves exposed

One fit criterion: memory <= the GPU's memory minus a reserve for the CUDA context and NCCL
(helpers.gpus.RESERVE_GIB). A cluster can also be this laptop: ``Cluster.cores`` says that
its ranks share fewer cores than there are ranks (a rank that waits lends its core), and its
rates are measured (helpers.course.bench.planner).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.gpus import RESERVE_GIB
from helpers.parallel.composed import plancost
from helpers.parallel.composed.mesh import ParallelDims, divisors

__all__ = ["Block", "Workload", "Cluster", "Layout", "CLUSTERS", "RECOMPUTE", "SCHEDULES",
           "evaluate", "candidates", "plan", "ties", "TIE", "activation_bytes"]  # fmt: skip

GB = 1e9
RECOMPUTE = ("none", "full")  # "selective" (Korthikanti et al.) = "none" with flash attention
SCHEDULES = ("1f1b", "gpipe", "interleaved")  # interleaved: 1F1B with ``virtual`` chunks per rank
TIE = 0.05  # step times closer than this are a tie: finer than the model can tell


@dataclass(frozen=True)
class Block:
    """One layer as the planner sees it, per sample (one sequence or one image)."""

    params: float
    flops: float  # training FLOPs: forward + backward (3 x forward), no recomputation
    act_bytes: float  # what autograd saves for backward
    out_bytes: float  # its output: what a pipeline sends, what full recomputation keeps
    tp_bytes: float = 0.0  # all-reduced per forward under TP (summed over its collectives)
    tp_messages: int = 0  # collectives per forward under TP
    act_replicated: float = 0.0  # of act_bytes, what TP leaves whole on every TP rank
    tp: bool = True  # TP splits its weights and matmuls (False: replicated over the tp ranks)
    width: float = 0.0  # its matmuls' width (model dim), for Cluster.gemm_model; 0: not modelled


@dataclass(frozen=True)
class Workload:
    """What the planner needs to know about a model and its inputs (one sample = one sequence)."""

    name: str
    blocks: tuple[Block, ...]
    seq_len: int  # tokens per sample (for an image model: tokens of its transformer stages)
    heads: int  # TP must divide them (the kv heads)
    state_bytes: tuple[float, float, float] = (2, 2, 12)  # weights, grads, optimizer per param
    logits_bytes: float = 0.0  # per sample, held by the last stage only (the loss's fp32 logits)

    @property
    def params(self) -> float:
        return sum(b.params for b in self.blocks)

    @property
    def layers(self) -> int:
        return len(self.blocks)

    @property
    def flops_per_sample(self) -> float:
        return sum(b.flops for b in self.blocks)

    @classmethod
    def llama(cls, args, seq_len: int = 4096, name: str = "Llama 2", act_bytes=None,
              act_replicated=None, bytes_per_value: int = 2, state_bytes=(2, 2, 12),
              embeddings: bool = True, sequence_parallel: bool = True) -> Workload:  # fmt: skip
        """Llama 2 in mixed precision with Adam, layers of equal cost.

        FLOPs: 6 per parameter per token, plus the attention scores as a causal kernel computes
        them, 6 L d S (half of PaLM's 12 L d S: the masked half is skipped). Activations: one
        formula everywhere, ``activation_bytes``: Korthikanti et al.'s 34 s h per layer (2-byte
        values, flash attention), all split by TP with sequence parallelism, 10 s h of it whole
        on every TP rank without; plus, on the last pipeline stage, the fp32 logits the loss
        keeps (S x vocabulary x 4 bytes per sample; not split by TP: the plan gathers them).
        ``act_bytes``/``act_replicated`` override the formula (a count of your own). The
        embedding and output weights are spread evenly over the layers (``embeddings=False``: a
        stack of blocks only, as the CPU validation runs: no embedding, no logits).
        """
        from dataclasses import replace

        from helpers.models import llama2

        outer = llama2.param_count(replace(args, n_layers=1)) - llama2.param_count(
            replace(args, n_layers=0)
        )  # one block's parameters
        shared = llama2.param_count(args) - args.n_layers * outer if embeddings else 0
        matmul = outer + (args.vocab_size * args.dim if embeddings else 0) / args.n_layers
        flops = 6 * matmul * seq_len + 6 * args.dim * seq_len * seq_len
        value = seq_len * args.dim * bytes_per_value  # one (S, dim) activation
        formula = activation_bytes(args.dim, seq_len, bytes_per_value, sequence_parallel)
        act = formula["block"] if act_bytes is None else act_bytes
        whole = formula["replicated"] if act_replicated is None else act_replicated
        block = Block(params=outer + shared / args.n_layers, flops=flops, act_bytes=act,
                      out_bytes=value, tp_bytes=2 * value, tp_messages=2,
                      act_replicated=whole, width=args.dim)  # fmt: skip
        logits = seq_len * args.vocab_size * 4 if embeddings else 0.0
        return cls(name, (block,) * args.n_layers, seq_len, args.kv_heads, tuple(state_bytes),
                   logits)  # fmt: skip


def activation_bytes(dim: int, seq_len: int, bytes_per_value: int = 2,
                     sequence_parallel: bool = True) -> dict:  # fmt: skip
    """The planner's one activation formula, per layer and sample (Korthikanti et al. 2022,
    flash attention: no s^2 term): 34 s h bytes at 2 bytes a value; without sequence
    parallelism 10 s h of it (the norms' and dropout's share) stays whole on every TP rank."""
    per_value = bytes_per_value / 2
    block = 34 * seq_len * dim * per_value
    return {
        "block": block,
        "replicated": 0.0 if sequence_parallel else 10 * seq_len * dim * per_value,
    }


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_memory_gb: float = 80
    peak_tflops: float = 312  # per GPU, dense bf16 (A100)
    intra_gbs: float = 300  # GB/s per GPU inside a node (NVLink 3: 600 GB/s both ways)
    inter_gbs: float = 25  # GB/s per GPU between nodes (200 Gb/s InfiniBand HDR per GPU)
    efficiency: float = 0.5  # fraction of peak a large matmul-bound step reaches
    latency_s: float = 0.0  # per message step of a collective (alpha); ~us on GPUs: left out
    overlap: bool = True  # DP / FSDP traffic runs during compute (NCCL has its own stream)
    memory_gbs: float = 1555  # GB/s of GPU memory (A100-40GB SXM; the optimizer step reads it)
    cores: int | None = None  # ranks of a node share this many cores (CPU ranks); None: 1 each
    layer_overhead_s: float = 0.0  # fixed cost of one block's forward + backward (launches)
    ddp_overhead_s: float = 0.0  # DDP's bookkeeping per step: its synced backward (CPU ranks)
    fsdp_overhead_s: float = 0.0  # FSDP's bookkeeping per block and micro-batch (CPU ranks)
    reserve_gb: float = RESERVE_GIB * 2**30 / GB  # CUDA context, NCCL buffers, allocator slack
    gemm_model: bool = False  # True: efficiency x the roofline share of each block's matmuls,
    # which falls with few tokens per micro-batch and a narrow TP split (plancost.gemm_efficiency)
    name: str = ""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def usable_gb(self) -> float:
        return self.gpu_memory_gb - self.reserve_gb


CLUSTERS = {
    "2x8 A100-40GB": Cluster(nodes=2, gpus_per_node=8, gpu_memory_gb=40, name="2 x 8 A100-40GB"),
    "2x8 A100-80GB": Cluster(nodes=2, gpus_per_node=8, memory_gbs=2039, name="2 x 8 A100-80GB"),
    "128x8 H100": Cluster(
        nodes=128,
        gpus_per_node=8,
        peak_tflops=989,
        intra_gbs=450,
        inter_gbs=50,
        memory_gbs=3350,
        name="128 x 8 H100",
    ),  # fmt: skip
}


@dataclass
class Layout:
    dims: ParallelDims | None
    dp: int
    tp: int
    pp: int
    micro_batches: int = 0  # per replica and step (m)
    micro_batch: int = 1  # samples per micro-batch
    recompute: str = "none"
    zero: int = 0
    schedule: str = "1f1b"
    virtual: int = 1  # chunks of layers per rank (interleaved 1F1B; Megatron's v)
    memory: dict = field(default_factory=dict)  # bytes per GPU by kind (the fullest stage)
    stage_gb: list = field(default_factory=list)  # GB per GPU of each stage
    time: dict = field(default_factory=dict)  # seconds per step by kind
    reason: str | None = None  # why it does not work; None when it does

    @property
    def fits(self) -> bool:
        return self.reason is None

    @property
    def memory_gb(self) -> float:
        return sum(self.memory.values()) / GB

    @property
    def step_time(self) -> float:
        return sum(self.time.values())

    def shares(self) -> dict[str, float]:
        """Each part of the step time as a fraction of the whole."""
        return {k: v / self.step_time for k, v in self.time.items()} if self.time else {}

    @property
    def name(self) -> str:
        return f"pp={self.pp} dp={self.dp} tp={self.tp}"

    def __str__(self) -> str:
        if not self.fits:
            return f"{self.name}: no - {self.reason}"
        over = ", ".join(f"{k} {100 * v:.1f} %" for k, v in self.shares().items()
                         if k != "compute" and v >= 0.0005)  # fmt: skip
        sched = f" interleaved v={self.virtual}" if self.schedule == "interleaved" else ""
        return (f"{self.name}{sched} m={self.micro_batches} x {self.micro_batch} {self.recompute}: "
                f"{self.memory_gb:.1f} GB, {self.step_time:.2f} s ({over or 'all compute'})")  # fmt: skip


def _check(w: Workload, c: Cluster, global_batch: int, lay: Layout) -> str | None:
    try:
        lay.dims = ParallelDims(dp=lay.dp, tp=lay.tp, pp=lay.pp, world_size=c.world_size,
                                gpus_per_node=c.gpus_per_node)  # fmt: skip
    except ValueError as e:
        return str(e)
    uniform = len(set(w.blocks)) == 1
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


def evaluate(w: Workload, c: Cluster, global_batch: int, dp: int, tp: int, pp: int,
             micro_batch: int = 1, zero: int = 0, recompute: str = "none",
             schedule: str = "1f1b", cuts: tuple[int, ...] | None = None,
             virtual: int = 2) -> Layout:  # fmt: skip
    """One layout, costed; ``reason`` says why it cannot run (and what would).

    cuts: where the stages start (block indices after 0); default: balanced by FLOPs.
    virtual: chunks of layers per rank when schedule="interleaved" (Megatron's v).
    """
    recompute = "none" if recompute == "selective" else recompute
    lay = Layout(None, dp, tp, pp, micro_batch=micro_batch, recompute=recompute, zero=zero,
                 schedule=schedule, virtual=virtual if schedule == "interleaved" else 1)  # fmt: skip
    lay.reason = _check(w, c, global_batch, lay)
    if lay.reason:
        return lay
    lay.micro_batches = global_batch // (dp * micro_batch)
    stages = plancost.stages(w.blocks, pp, cuts)
    lay.memory = plancost.memory(w, lay, stages)
    lay.time = plancost.step_time(w, c, lay, stages)
    if lay.memory_gb > c.usable_gb:
        states = sum(v for k, v in lay.memory.items() if k != "activations") / GB
        lay.reason = (f"needs {lay.memory_gb:.1f} GB per GPU > {c.usable_gb:.1f} GB usable of "
                      f"{c.gpu_memory_gb:g} GB (states {states:.1f} GB, activations "
                      f"{lay.memory['activations'] / GB:.1f} GB)")  # fmt: skip
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
    modes = [recompute] if recompute else list(RECOMPUTE)
    tried = [evaluate(w, c, global_batch, dp, tp, pp, micro_batch=b, recompute=r, **kw)
             for b in sizes for r in modes]  # fmt: skip
    ok = [lay for lay in tried if lay.fits]
    if ok:
        return min(ok, key=lambda lay: (round(lay.step_time, 9), lay.memory_gb))
    costed = [lay for lay in tried if lay.memory]
    return min(costed, key=lambda lay: lay.memory_gb) if costed else tried[0]


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
