"""The planner's vocabulary: a cluster and a layout (helpers.parallel.composed.planner;
the workload's blocks are in helpers.parallel.composed.workloads).

    Cluster    GPUs, links and the rates the planner assumes (A100_EFFICIENCY, H100_EFFICIENCY)
    Layout     one (pp, dp, tp) costed: memory by kind, time by kind, why it cannot run
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers import gpus
from helpers.parallel.composed import frameworks
from helpers.parallel.composed.mesh import ParallelDims

__all__ = ["Cluster", "Layout", "CLUSTERS", "RECOMPUTE", "SCHEDULES", "TIE", "GB", "GIB",
           "A100_EFFICIENCY", "H100_EFFICIENCY", "ELEMENTWISE_PASSES"]  # fmt: skip

GB = 1e9  # the planner's estimates are in GB (10^9 bytes)
GIB = 2**30  # a GPU's memory is in GiB (helpers.gpus, nvidia-smi): an "80 GB" A100 has 80 GiB
RECOMPUTE = ("none", "selective", "full")  # selective: Korthikanti et al.'s (the s x s scores)
SCHEDULES = ("1f1b", "gpipe", "interleaved")  # interleaved: 1F1B with ``virtual`` chunks per rank
TIE = 0.05  # step times closer than this are a tie: finer than the model can tell
# Fraction of the dense bf16 peak a large matmul reaches, fitted once each to a published run
# (helpers.parallel.composed.published): torchtitan's Llama 2 70B on A100-80GB, and the
# workbook's own eager Llama run on one H100 (an eager program: framework code reaches more)
A100_EFFICIENCY = 0.69
H100_EFFICIENCY = 0.48
# Passes over a block's saved bytes that the memory-bound work around the matmuls makes per
# micro-batch: each saved byte written forward and read backward, its gradient written and read.
# A count from that argument, not measured on a GPU; notebook 07 section 7.4 shows how much
# Megatron-LM's Table 1 trend depends on it (2 to 6 passes, and none).
ELEMENTWISE_PASSES = 4


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_memory_gib: float = 80  # per GPU, in GiB as helpers.gpus and nvidia-smi give it
    peak_tflops: float = 312  # per GPU, dense bf16 (A100)
    intra_gbs: float = 300  # GB/s per GPU inside a node (NVLink 3: 600 GB/s both ways)
    inter_gbs: float = 25  # GB/s per GPU between nodes (200 Gb/s InfiniBand HDR per GPU)
    efficiency: float = A100_EFFICIENCY  # fraction of peak a large matmul reaches
    latency_s: float = 0.0  # per message step of a collective (alpha); ~us on GPUs: left out
    overlap: bool = True  # DP / FSDP traffic runs during compute (NCCL has its own stream)
    memory_gbs: float = 1555  # GB/s of GPU memory (A100-40GB SXM; the optimizer step reads it)
    cores: int | None = None  # ranks of a node share this many cores (CPU ranks); None: 1 each
    layer_overhead_s: float = 0.0  # fixed cost of one block's forward + backward (launches)
    ddp_overhead_s: float = 0.0  # DDP's bookkeeping per step: its synced backward (CPU ranks)
    fsdp_overhead_s: float = 0.0  # FSDP's bookkeeping per block and micro-batch (CPU ranks)
    reserve_gb: float = frameworks.CONTEXT_NCCL_GIB * 2**30 / GB  # CUDA context, NCCL buffers
    margin: float = frameworks.MARGIN  # of the rest, kept free for the allocator (fragmentation)
    gemm_model: bool = True  # matmuls at efficiency x their roofline share, which falls with few
    # tokens per micro-batch and a narrow TP split (plancost.gemm_efficiency); False: fixed
    elementwise: bool = True  # add the memory-bound work around the matmuls (plancost);
    # False where the rates are measured on the block itself (CPU ranks)
    elementwise_passes: float = ELEMENTWISE_PASSES  # passes over the saved bytes (above)
    name: str = ""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu_memory_gb(self) -> float:
        """The GPU's memory in GB (10^9 bytes), the planner's unit: 80 GiB = 85.9 GB."""
        return self.gpu_memory_gib * GIB / GB

    @property
    def capacity_gb(self) -> float:
        """What tensors may use: the GPU's memory less the CUDA context and NCCL's buffers."""
        return self.gpu_memory_gb - self.reserve_gb

    @property
    def usable_gb(self) -> float:
        """The fit criterion: capacity less the allocator's margin."""
        return self.capacity_gb * (1 - self.margin)


CLUSTERS = {
    "2x8 A100-40GB": Cluster(
        nodes=2,
        gpus_per_node=8,
        name="2 x 8 A100-40GB",
        gpu_memory_gib=gpus.lookup("a100-40").memory_gib,
    ),  # fmt: skip
    "2x8 A100-80GB": Cluster(
        nodes=2,
        gpus_per_node=8,
        memory_gbs=2039,
        name="2 x 8 A100-80GB",
        gpu_memory_gib=gpus.lookup("a100-80").memory_gib,
    ),  # fmt: skip
    "128x8 H100": Cluster(
        nodes=128,
        gpus_per_node=8,
        gpu_memory_gib=gpus.lookup("h100").memory_gib,
        peak_tflops=989,
        intra_gbs=450,
        inter_gbs=50,
        memory_gbs=3350,
        efficiency=H100_EFFICIENCY,
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
    framework: str = ""  # whose memory rules (frameworks.FRAMEWORKS, or the ZeRO paper's count)
    schedule: str = "1f1b"
    virtual: int = 1  # chunks of layers per rank (interleaved 1F1B; Megatron's v)
    scatter_gather: bool = False  # PP sends split over the TP ranks, all-gathered on arrival
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
