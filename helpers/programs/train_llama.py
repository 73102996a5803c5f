"""FSDP + TP training of Llama 2: one program for a laptop (gloo) and a cluster (NCCL).

    python -m helpers.programs.train_llama                          # 1 process, no parallelism
    torchrun --nproc-per-node 4 helpers/programs/train_llama.py --tp 2   # 2 x 2 on one node
    srun torchrun --nnodes 2 ... train_llama.py --tp 4 --model 7B          # seed 001's recipe

The mesh is (dp, tp) with TP inside a node (helpers.parallel.mesh); dp = world / tp.
Each DP group reads its own slice of the global batch; the TP ranks of a group read the
same tokens (they hold halves of the same layers). Rank 0 writes tokens/s and MFU:

    MFU = tokens/s x FLOPs per token / (ranks x peak FLOP/s per rank)

``--peak-flops`` is the per-rank peak: a GPU's datasheet figure (989e12 for an H100's dense
BF16), or 0 to measure this machine's achievable float32 matmul rate first (on CPU).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as tdist
import torch.nn.functional as F

from helpers import dist
from helpers.config import parse
from helpers.models import llama2
from helpers.parallel import llama_parallel
from helpers.parallel.mesh import ParallelDims
from helpers.runs import write_metrics
from helpers.training.loop import phase

__all__ = ["LlamaConfig", "synthetic_tokens", "train", "serial_losses", "matmul_flops", "main"]


@dataclass
class LlamaConfig:
    """Llama 2 with FSDP + TP on synthetic tokens (see the module docstring)."""

    model: str = field(default="tiny", metadata={"choices": tuple(llama2.CONFIGS)})
    n_layers: int = 0  # > 0: override the model's depth (cheap experiments)
    dim: int = 0  # > 0: override the model's width (keeps its heads)
    tp: int = 2  # tensor-parallel degree (inside a node); 1 = FSDP only
    batch_size: int = 8  # global, split over dp
    seq_len: int = 32
    steps: int = 5
    lr: float = 0.1
    seed: int = 0
    peak_flops: float = 0.0  # per rank; 0 = measure a float32 matmul here
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
    return llama2.config(cfg.model, **over)


def _loss(logits, targets) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


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
    model = llama2.Transformer(_model_args(cfg)).init_weights(cfg.seed).to(d.device)
    llama_parallel.apply_tp(model, mesh["tp"], cfg.loss_parallel)
    llama_parallel.apply_fsdp(model, mesh["dp"])
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
        losses.append(mean.item() / dims.dp)
        times.append(time.perf_counter() - t)
    return {"losses": losses, "step_times": times, **throughput(d, cfg, model.args, times)}


def throughput(d: dist.Dist, cfg: LlamaConfig, args, times: list[float]) -> dict:
    """tokens/s and MFU, leaving out the first step (allocation, first all-gathers)."""
    timed = times[1:] or times
    step = sorted(timed)[len(timed) // 2]  # median: robust to a slow step on a shared machine
    tokens_per_s = cfg.batch_size * cfg.seq_len / step
    flops = llama2.flops_per_token(args, cfg.seq_len)
    peak = cfg.peak_flops or matmul_flops()
    return {
        "tokens_per_s": tokens_per_s,
        "flops_per_token": flops,
        "peak_flops_per_rank": peak,
        "mfu": tokens_per_s * flops / (d.world_size * peak),
        "world_size": d.world_size,
        "config": asdict(cfg),
    }


def main(argv: list[str] | None = None) -> None:
    cfg = parse(LlamaConfig, argv)
    with dist.session() as d:
        dist.print0(f"{d}; Llama 2 {cfg.model}, tp={cfg.tp}, global batch {cfg.batch_size}")
        out = train(d, cfg)
        dist.print0(f"losses {[round(x, 4) for x in out['losses']]}")
        dist.print0(f"{out['tokens_per_s']:.0f} tokens/s, MFU {100 * out['mfu']:.1f} %")
        if d.is_main:
            write_metrics(out)


if __name__ == "__main__":
    main()
