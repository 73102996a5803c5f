"""FSDP + TP training of Llama 2: one program for a laptop (gloo) and a cluster (NCCL).

    python -m helpers.programs.train_llama                          # 1 process, no parallelism
    torchrun --nproc-per-node 4 helpers/programs/train_llama.py --tp 2   # 2 x 2 on one node
    srun torchrun --nnodes 2 ... train_llama.py --tp 4 --model 7B          # seed 001's recipe

The mesh is (dp, tp) with TP inside a node (helpers.parallel.composed.mesh); dp = world / tp.
Each DP group reads its own slice of the global batch; the TP ranks of a group read the
same tokens (they hold halves of the same layers).

The model is built on the meta device, sharded (TP, then FSDP), materialised with
``to_empty`` on the rank's device and only then initialised, parameter by parameter: no rank
ever holds the whole model (a 7B model in fp32 is 27 GB). On a GPU with native bf16 it
trains in mixed precision as torchtitan does: FSDP2's MixedPrecisionPolicy computes in bf16
with fp32 master weights and fp32 gradient reductions (``--dtype auto``); on CPU ranks in
fp32, so the losses equal one process's. Rank 0 writes tokens/s and

    MFU = tokens/s x model FLOPs per token / (ranks x peak FLOP/s per rank)

Model FLOPs count 6 per parameter per token plus attention, and no recomputation (with
activation recomputation, hardware FLOPs utilisation, HFU, would count the recomputed
forward too; this program recomputes nothing, so HFU = MFU). The peak is the GPU's dense
rate for the dtype it trains in (``helpers.gpus``: 989 TFLOP/s bf16 on an H100, 312 on an
A100), or on CPU ranks this machine's measured float32 matmul rate; ``--peak-flops``
overrides it.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as tdist
import torch.nn.functional as F

from helpers import devices, dist, gpus
from helpers.config import parse
from helpers.models import llama2
from helpers.parallel.composed import llama_parallel
from helpers.parallel.composed.mesh import ParallelDims
from helpers.runs import write_metrics
from helpers.training.loop import phase

__all__ = ["LlamaConfig", "synthetic_tokens", "train", "serial_losses", "matmul_flops", "main"]


@dataclass
class LlamaConfig:
    """Llama 2 with FSDP + TP on synthetic tokens (see the module docstring)."""

    # "small": the laptop size the dry run's device-strict check runs (helpers.config)
    model: str = field(default="tiny", metadata={"choices": tuple(llama2.CONFIGS), "small": "tiny"})
    n_layers: int = field(default=0, metadata={"small": 0})  # > 0: override the model's depth
    dim: int = field(default=0, metadata={"small": 0})  # > 0: override the width (keeps its heads)
    tp: int = 2  # tensor-parallel degree (inside a node); 1 = FSDP only
    batch_size: int = field(default=8, metadata={"small": 8})  # global, split over dp
    seq_len: int = field(default=32, metadata={"small": 32})
    steps: int = 5
    lr: float = 0.1
    seed: int = 0
    # auto: bf16 compute (fp32 master weights and reductions) on a GPU with native bf16
    dtype: str = field(default="auto", metadata={"choices": ("auto", "fp32", "bf16")})
    peak_flops: float = 0.0  # per rank; 0 = the GPU's datasheet peak, or measured on CPU
    loss_parallel: bool = False


def synthetic_tokens(vocab: int, batch: int, seq_len: int, step: int, seed: int) -> torch.Tensor:
    """(batch, seq_len + 1) token rows that a model can learn: x_t+1 = x_t + stride (mod vocab)."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def matmul_flops(n: int = 512, seconds: float = 0.5) -> float:
    """Achievable float32 matmul FLOP/s on this process's threads: n x n products for ~seconds.

    Long enough that ranks sharing the cores overlap (start them after a barrier): they slow
    each other here as they do in training, so the figure is a fair per-rank peak.
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start)


def _model_args(cfg: LlamaConfig) -> llama2.ModelArgs:
    over = {k: getattr(cfg, k) for k in ("n_layers", "dim") if getattr(cfg, k)}
    base = llama2.config(cfg.model, **over)
    # the rotary tables must cover the sequences trained on (the tiny config stops at 64)
    return llama2.config(cfg.model, **over, max_seq_len=max(base.max_seq_len, cfg.seq_len))


def compute_dtype(d: dist.Dist, cfg: LlamaConfig) -> torch.dtype:
    """bf16 on a GPU with native bf16 (auto), else fp32; ``--dtype`` forces one."""
    if cfg.dtype == "auto":
        return (
            torch.bfloat16
            if d.device.type != "cpu" and dist.supports_bf16(d.device)
            else torch.float32
        )
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[cfg.dtype]


def _loss(logits, targets) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # fp32 softmax


def _loss_context(loss_parallel: bool):
    """With loss_parallel the logits are a vocab-sharded DTensor: cross-entropy (forward AND
    backward) runs inside torch's loss_parallel() context, never gathering the full logits."""
    if not loss_parallel:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel as lp

    return lp()


def serial_losses(cfg: LlamaConfig) -> list[float]:
    """The 1-rank reference: the same model, data and SGD steps, no parallelism."""
    model = llama2.Transformer(_model_args(cfg)).init_weights(cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    losses = []
    for step in range(cfg.steps):
        rows = synthetic_tokens(model.args.vocab_size, cfg.batch_size, cfg.seq_len, step, cfg.seed)
        loss = _loss(model(rows[:, :-1]), rows[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def build(d: dist.Dist, cfg: LlamaConfig):
    """Mesh (dp, tp), then the model: init on every rank the same way, TP, then FSDP."""
    dims = ParallelDims(dp=-1, tp=cfg.tp, world_size=d.world_size)
    if cfg.batch_size % dims.dp or cfg.seq_len % cfg.tp:
        raise ValueError(
            f"batch_size={cfg.batch_size} must divide by dp={dims.dp} and seq_len={cfg.seq_len} "
            f"by tp={cfg.tp} (sequence parallelism)"
        )
    mesh = dims.build_mesh(d.device.type, names=("dp", "tp"))
    # FSDP2 warns that the root returns a view (the logits); we never modify them in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    with torch.device("meta"):  # shapes only: no memory until each rank holds its shards
        model = llama2.Transformer(_model_args(cfg))
    llama_parallel.apply_tp(model, mesh["tp"], cfg.loss_parallel)
    llama_parallel.apply_fsdp(model, mesh["dp"], mixed_precision=compute_dtype(d, cfg))
    model.to_empty(device=d.device)
    model.init_weights(cfg.seed)
    return dims, mesh, model


def train(d: dist.Dist, cfg: LlamaConfig) -> dict:
    """Train; every rank returns its losses (the global-batch mean) and rank 0's throughput."""
    dims, mesh, model = build(d, cfg)
    dp_rank = mesh["dp"].get_local_rank()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    local = cfg.batch_size // dims.dp  # rows per DP group; its TP ranks read the same rows
    losses, times = [], []
    for step in range(cfg.steps):
        rows = synthetic_tokens(model.args.vocab_size, cfg.batch_size, cfg.seq_len, step, cfg.seed)
        rows = rows[dp_rank * local : (dp_rank + 1) * local].to(d.device)
        dist.synchronize(d.device)  # GPU work is queued: wait for it before reading the clock
        t = time.perf_counter()
        opt.zero_grad()
        # named phases: torch.profiler ranges here, NVTX ranges in the nsys job on GPUs
        with _loss_context(cfg.loss_parallel):
            with phase("forward"):
                loss = _loss(model(rows[:, :-1]), rows[:, 1:])
            with phase("backward"):
                loss.backward()  # FSDP reduce-scatters (averages) gradients over dp
        with phase("optimizer"):
            opt.step()
        loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        mean = loss.detach().clone()
        tdist.all_reduce(mean, group=mesh["dp"].get_group())  # the global batch's mean loss
        losses.append(mean.item() / dims.dp)  # .item() waits for the device too
        dist.synchronize(d.device)
        times.append(time.perf_counter() - t)
    return {"losses": losses, "step_times": times, **throughput(d, cfg, model.args, times)}


def throughput(d: dist.Dist, cfg: LlamaConfig, args, times: list[float]) -> dict:
    """tokens/s and MFU, leaving out the first step (allocation, first all-gathers)."""
    timed = times[1:] or times
    step = sorted(timed)[len(timed) // 2]  # median: robust to a slow step on a shared machine
    tokens_per_s = cfg.batch_size * cfg.seq_len / step
    flops = llama2.flops_per_token(args, cfg.seq_len)
    peak, source = peak_flops(d, cfg)
    return {
        "tokens_per_s": tokens_per_s,
        "flops_per_token": flops,
        "peak_flops_per_rank": peak,
        "peak_source": source,
        "mfu": tokens_per_s * flops / (d.world_size * peak) if peak else None,
        "mfu_counts": "model FLOPs (6 per parameter per token + attention), no recomputation",
        "dtype": str(compute_dtype(d, cfg)).removeprefix("torch."),
        "device": dist.device_name(d.device),
        "gpu": devices.is_gpu(d.device),  # which lesson the notebook checks: a GPU's or a CPU's
        "world_size": d.world_size,
        "config": asdict(cfg),
    }


def peak_flops(d: dist.Dist, cfg: LlamaConfig) -> tuple[float | None, str]:
    """(per-rank peak FLOP/s, where it comes from) for the dtype this run computes in; None
    for a GPU that helpers/gpus.py does not know (the run goes on without an MFU)."""
    if cfg.peak_flops:
        return cfg.peak_flops, "--peak-flops"
    if d.device.type == "cpu":
        return matmul_flops(), "measured float32 matmul on this CPU"
    dtype = {torch.bfloat16: "bf16", torch.float32: "fp32"}[compute_dtype(d, cfg)]
    if dtype == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        dtype = "tf32"  # fp32 matmuls on tensor cores
    name = dist.device_name(d.device)
    gpu = gpus.find(name)
    if gpu is None or dtype not in gpu.tflops:
        return (
            None,
            f"unknown peak for {name} ({dtype}): add it to helpers/gpus.py or pass --peak-flops",
        )
    return gpu.peak(dtype), f"{gpu.name} dense {dtype} (helpers/gpus.py)"


def main(argv: list[str] | None = None) -> None:
    cfg = parse(LlamaConfig, argv)
    with dist.session() as d:
        dist.print0(f"{d}; Llama 2 {cfg.model}, tp={cfg.tp}, global batch {cfg.batch_size}")
        out = train(d, cfg)
        dist.print0(f"losses {[round(x, 4) for x in out['losses']]}")
        mfu = f"{100 * out['mfu']:.1f} %" if out["mfu"] is not None else out["peak_source"]
        dist.print0(f"{out['tokens_per_s']:.0f} tokens/s, MFU: {mfu}")
        if d.is_main:
            write_metrics(out)


if __name__ == "__main__":
    main()
