"""A 3D-parallelism planner: which (pp, dp, tp) layouts fit, and which is fastest (estimated).

    plan(workload, cluster, global_batch) -> fitting layouts, fastest first
    evaluate(workload, cluster, global_batch, dp=, tp=, pp=) -> one Layout, with .reason if not

Memory per GPU (bytes), mixed precision with Adam (the ZeRO paper's 2 + 2 + 12 per parameter):

    states      = params / (tp * pp) * (2 weights + 2 grads + 12 optimizer), the optimizer part
                  (zero>=1), the gradients (zero>=2) and the weights (zero=3, FSDP) divided by dp
    activations = min(m, pp) micro-batches in flight (1F1B) x layers / pp x per-layer bytes,
                  per layer mb * s * h * 34 / tp (Korthikanti et al. 2022, sequence parallel,
                  flash attention; "full" recompute keeps only the layer input, 2 mb s h / tp)

Step time (seconds), nothing overlapped (a pessimistic, readable model):

    compute = 6 N tokens (+ attention) / (gpus x peak x efficiency) x (m + pp - 1) / m   [bubble]
    tp      = m x layers/pp x 4 all-reduces of mb*s*h*2 bytes on the tp ring, intra-node links
    pp      = m x 2 sends of mb*s*h*2 bytes (activations forward, their gradients back)
    dp      = one all-reduce of the stage's bf16 gradients over dp, inter-node when dp spans nodes

This is a teaching estimate, it has its own formula for now (TODO: use helpers.parallel.memory
once it lands); helpers.parallel.simulate checks its shard shapes on a fake cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.parallel.mesh import ParallelDims, divisors

__all__ = ["Workload", "Cluster", "Layout", "CLUSTERS", "evaluate", "candidates", "plan"]

GB = 1e9


@dataclass(frozen=True)
class Workload:
    """What the planner needs to know about a model and its inputs (one sample = one sequence)."""

    name: str
    params: int
    layers: int
    hidden: int
    heads: int
    seq_len: int  # tokens per sample (for an image model: tokens of its transformer stages)
    flops_per_sample: float  # training FLOPs (forward + backward)
    act_bytes_per_layer: float | None = None  # per sample, unsharded; None = transformer formula

    @classmethod
    def llama(cls, args, seq_len: int = 4096, name: str = "Llama 2") -> Workload:
        from helpers.models import llama2

        return cls(
            name=name,
            params=llama2.param_count(args),
            layers=args.n_layers,
            hidden=args.dim,
            heads=args.kv_heads,  # TP must split the kv heads too
            seq_len=seq_len,
            flops_per_sample=llama2.flops_per_token(args, seq_len) * seq_len,
        )

    def activation_bytes(self, micro_batch: int, tp: int, recompute: str) -> float:
        """Bytes one layer keeps for backward, per micro-batch, on one TP rank."""
        if recompute == "full":
            return 2 * micro_batch * self.seq_len * self.hidden / tp
        per_sample = self.act_bytes_per_layer or 34 * self.seq_len * self.hidden
        return micro_batch * per_sample / tp


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_memory_gb: float = 80
    peak_tflops: float = 312  # per GPU, dense bf16 (A100)
    intra_gbs: float = 300  # GB/s per GPU inside a node (NVLink)
    inter_gbs: float = 25  # GB/s per GPU between nodes (200 Gb/s InfiniBand)
    efficiency: float = 0.5  # fraction of peak a large matmul-bound step reaches

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


CLUSTERS = {
    "2x8 A100-40GB": Cluster(nodes=2, gpus_per_node=8, gpu_memory_gb=40),
    "2x8 A100-80GB": Cluster(nodes=2, gpus_per_node=8),
    "128x8 H100": Cluster(nodes=128, gpus_per_node=8, peak_tflops=989, intra_gbs=450, inter_gbs=50),
}


@dataclass
class Layout:
    dims: ParallelDims | None
    dp: int
    tp: int
    pp: int
    micro_batches: int = 0
    memory: dict = field(default_factory=dict)  # bytes per GPU by kind
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

    def __str__(self) -> str:
        head = f"pp={self.pp} dp={self.dp} tp={self.tp}"
        if not self.fits:
            return f"{head}: no - {self.reason}"
        return f"{head} m={self.micro_batches}: {self.memory_gb:.1f} GB, {self.step_time:.2f} s"


def _ring(nbytes: float, n: int, gbs: float) -> float:
    """All-reduce time on a ring of n ranks: 2 (n-1)/n x bytes / bandwidth (helpers.costmodel)."""
    return 0.0 if n == 1 else 2 * (n - 1) / n * nbytes / (gbs * GB)


def _memory(w: Workload, c: Cluster, lay: Layout, mb: int, zero: int, recompute: str) -> dict:
    local = w.params / (lay.tp * lay.pp)
    shard = [lay.dp if zero >= k else 1 for k in (3, 2, 1)]  # weights, grads, optimizer
    in_flight = min(lay.micro_batches, lay.pp)
    layers = w.layers / lay.pp
    return {
        "weights": 2 * local / shard[0],
        "gradients": 2 * local / shard[1],
        "optimizer": 12 * local / shard[2],
        "activations": in_flight * layers * w.activation_bytes(mb, lay.tp, recompute),
    }


def _time(w: Workload, c: Cluster, lay: Layout, mb: int, global_batch: int, recompute: str):
    m, dims = lay.micro_batches, lay.dims
    flops = w.flops_per_sample * global_batch * (4 / 3 if recompute == "full" else 1)
    ideal = flops / (c.world_size * c.peak_tflops * 1e12 * c.efficiency)  # full: forward twice
    act = mb * w.seq_len * w.hidden * 2  # one micro-batch's activations in bf16
    pp_gbs = c.inter_gbs if dims.crosses_nodes("pp") else c.intra_gbs
    dp_gbs = c.inter_gbs if dims.crosses_nodes("dp") else c.intra_gbs
    return {
        "compute": ideal,
        "bubble": ideal * (lay.pp - 1) / m,
        "tp": m * w.layers / lay.pp * 4 * _ring(act, lay.tp, c.intra_gbs),
        "pp": 0.0 if lay.pp == 1 else m * 2 * act / (pp_gbs * GB),
        "dp": _ring(2 * w.params / (lay.tp * lay.pp), lay.dp, dp_gbs),
    }


def evaluate(
    w: Workload,
    c: Cluster,
    global_batch: int,
    dp: int,
    tp: int,
    pp: int,
    micro_batch: int = 1,
    zero: int = 0,
    recompute: str = "selective",
) -> Layout:
    """One layout, costed; ``reason`` says why it cannot run (and what would)."""
    lay = Layout(None, dp, tp, pp)
    try:
        lay.dims = ParallelDims(
            dp=dp, tp=tp, pp=pp, world_size=c.world_size, gpus_per_node=c.gpus_per_node
        )
    except ValueError as e:
        lay.reason = str(e)
        return lay
    if w.heads % tp:
        lay.reason = f"tp={tp} does not divide the {w.heads} (kv) heads; tp in {divisors(w.heads)}"
    elif w.layers % pp:
        lay.reason = f"pp={pp} does not divide {w.layers} layers; pp in {divisors(w.layers)}"
    elif global_batch % (dp * micro_batch):
        lay.reason = (
            f"global batch {global_batch} does not split into dp={dp} x micro-batches "
            f"of {micro_batch}"
        )
    if lay.reason:
        return lay
    lay.micro_batches = global_batch // (dp * micro_batch)
    lay.memory = _memory(w, c, lay, micro_batch, zero, recompute)
    lay.time = _time(w, c, lay, micro_batch, global_batch, recompute)
    if lay.memory_gb > c.gpu_memory_gb:
        lay.reason = (
            f"needs {lay.memory_gb:.1f} GB per GPU > {c.gpu_memory_gb:g} GB "
            f"(states {sum(v for k, v in lay.memory.items() if k != 'activations') / GB:.1f}"
            f" GB, activations {lay.memory['activations'] / GB:.1f} GB)"
        )
    return lay


def candidates(w: Workload, c: Cluster, global_batch: int, **kw) -> list[Layout]:
    """Every (pp, dp, tp) whose product is the world size, fitting or not."""
    out = []
    for tp in divisors(c.world_size):
        for pp in divisors(c.world_size // tp):
            out.append(evaluate(w, c, global_batch, c.world_size // (tp * pp), tp, pp, **kw))
    return out


def plan(w: Workload, c: Cluster, global_batch: int, **kw) -> list[Layout]:
    """The layouts that fit, fastest first (ties: less memory first)."""
    ok = [lay for lay in candidates(w, c, global_batch, **kw) if lay.fits]
    return sorted(ok, key=lambda lay: (round(lay.step_time, 9), lay.memory_gb))
