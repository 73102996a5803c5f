"""Llama 2 cut into pipeline stages (torch.distributed.pipelining) x data parallelism.

    torchrun --nproc-per-node 2 helpers/programs/train_pipeline.py              # 2 stages, here
    torchrun --nproc-per-node 4 train_pipeline.py --pp 2      # 1 node: 2 stages x 2 replicas
    srun torchrun --nnodes 2 --nproc-per-node 4 ... --pp 2    # 2 nodes: 2 stages x 4 replicas

The mesh is ("pp", "dp") with pp outermost, as DeepSpeed and torchtitan order it: the
ranks of one stage are neighbours (one node), so the gradient all-reduce over "dp" stays on
the node's fast links, and only the pipeline's activations and gradients, b x S x dim
numbers per micro-batch, cross between nodes. Global batch = dp x microbatches x micro-batch.

Each rank builds the model on the meta device, keeps only its stages (``LlamaStage``:
stage 0 also embeds, the last also applies the norm and the output layer), materialises
them with ``to_empty`` on its device and initialises them: no rank holds the whole model.
It trains in fp32 (TF32 matmuls on GPUs), plain SGD. Every rank prints the global batch's
mean loss (the last stages' means, averaged over dp); rank 0 writes tokens/s and the losses
to metrics.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from helpers import dist
from helpers.config import parse
from helpers.models import llama2
from helpers.parallel.pipeline.pipeline_llama import LlamaStage, even_bounds
from helpers.runs import write_metrics

__all__ = ["PipelineConfig", "build_stages", "train", "main"]

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zb": ScheduleInterleavedZeroBubble}  # fmt: skip


@dataclass
class PipelineConfig:
    """Llama 2 in pp stages x dp replicas on synthetic tokens (see the module docstring)."""

    model: str = field(default="7B", metadata={"choices": tuple(llama2.CONFIGS), "small": "tiny"})
    n_layers: int = field(default=0, metadata={"small": 4})  # > 0: override the model's depth
    dim: int = field(default=0, metadata={"small": 0})  # > 0: override the width
    pp: int = 2  # pipeline stages (ranks per pipeline); dp = world / pp
    schedule: str = field(default="1f1b", metadata={"choices": tuple(SCHEDULES)})
    chunks: int = 1  # model chunks per rank: 2 or more for interleaved (and zb)
    microbatches: int = field(default=8, metadata={"small": 4})
    batch_size: int = field(default=32, metadata={"small": 8})  # global: dp x m x micro-batch
    seq_len: int = field(default=1024, metadata={"small": 32})
    steps: int = 5
    lr: float = 0.1
    seed: int = 0


def _check(cfg: PipelineConfig, world: int, n_layers: int) -> tuple[int, int]:
    """(dp, micro-batch size), or a ValueError that says what to change."""
    if cfg.pp < 2 or world % cfg.pp:
        raise ValueError(f"--pp {cfg.pp} must be >= 2 and divide the {world} ranks")
    if (cfg.schedule == "interleaved") != (cfg.chunks > 1) and cfg.schedule != "zb":
        raise ValueError(f"--schedule {cfg.schedule} with --chunks {cfg.chunks}: interleaved "
                         "needs --chunks >= 2, gpipe and 1f1b --chunks 1")  # fmt: skip
    if n_layers < cfg.pp * cfg.chunks:
        raise ValueError(f"{n_layers} layers cannot fill {cfg.pp} x {cfg.chunks} stages")
    dp = world // cfg.pp
    if cfg.batch_size % (dp * cfg.microbatches):
        raise ValueError(
            f"--batch-size {cfg.batch_size} must be dp ({dp}) x --microbatches "
            f"({cfg.microbatches}) x a micro-batch size"
        )
    return dp, cfg.batch_size // (dp * cfg.microbatches)


def _model_args(cfg: PipelineConfig) -> llama2.ModelArgs:
    over = {k: getattr(cfg, k) for k in ("n_layers", "dim") if getattr(cfg, k)}
    base = llama2.config(cfg.model, **over)
    return llama2.config(cfg.model, **over, max_seq_len=max(base.max_seq_len, cfg.seq_len))


def build_stages(d: dist.Dist, cfg: PipelineConfig, pp_rank: int, micro: int, group):
    """This rank's PipelineStages: model stages pp_rank, pp_rank + pp, ... (one per chunk)."""
    args = _model_args(cfg)
    n_stages = cfg.pp * cfg.chunks
    bounds = even_bounds(args.n_layers, n_stages)
    with torch.device("meta"):  # shapes only: each rank materialises its own stages
        whole = llama2.Transformer(args)
    stages = []
    for ms in range(pp_rank, n_stages, cfg.pp):
        module = LlamaStage(whole, bounds[ms], bounds[ms + 1])
        module.to_empty(device=d.device)
        module.init_weights(cfg.seed)
        # shapes and dtypes given up front ("static" metadata): no shape-inference messages
        # requires_grad: the received h needs a gradient, which goes back to the stage before
        h = torch.empty(micro, cfg.seq_len, args.dim, device="meta", requires_grad=True)
        first, last = ms == 0, ms == n_stages - 1
        meta = {
            "input_args": torch.empty(micro, cfg.seq_len, dtype=torch.long, device="meta")
            if first
            else h,
            "output_args": torch.empty(micro, cfg.seq_len, args.vocab_size, device="meta")
            if last
            else h,
            "input_grads": None if first else h,  # tokens have no gradient
            "output_grads": None if last else h,  # the loss starts the backward
        }
        stages.append(PipelineStage(module, ms, n_stages, d.device, group=group, **meta))
    return args, stages


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def train(d: dist.Dist, cfg: PipelineConfig) -> dict:
    """Train; returns the losses (the global batch's mean, on every rank) and the step times."""
    from helpers.programs.train_llama import synthetic_tokens

    dp, micro = _check(cfg, d.world_size, _model_args(cfg).n_layers)
    mesh = init_device_mesh(d.device.type, (cfg.pp, dp), mesh_dim_names=("pp", "dp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    args, stages = build_stages(d, cfg, pp_rank, micro, mesh["pp"].get_group())
    cls = SCHEDULES[cfg.schedule]
    multi = cfg.schedule in ("interleaved", "zb")
    sched = cls(stages if multi else stages[0], n_microbatches=cfg.microbatches, loss_fn=_loss)
    params = [p for s in stages for p in s.submod.parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr)
    first, last = pp_rank == 0, pp_rank == cfg.pp - 1
    local = cfg.batch_size // dp  # this replica's rows, cut into microbatches by the schedule
    losses, times = [], []
    for step in range(cfg.steps):
        rows = synthetic_tokens(args.vocab_size, cfg.batch_size, cfg.seq_len, step, cfg.seed)
        rows = rows[dp_rank * local : (dp_rank + 1) * local].to(d.device)
        dist.synchronize(d.device)
        t = time.perf_counter()
        opt.zero_grad()
        mb_losses: list = []
        kwargs = {"target": rows[:, 1:], "losses": mb_losses} if last else {}
        sched.step(rows[:, :-1], **kwargs) if first else sched.step(**kwargs)
        for p in params:  # the copies of a stage average their gradients (DDP's all-reduce)
            tdist.all_reduce(p.grad, group=mesh["dp"].get_group())
            p.grad /= dp
        opt.step()
        mean = torch.zeros((), device=d.device)
        if last:  # each replica's mean over its micro-batches
            mean += torch.stack(mb_losses).mean().detach()
        tdist.all_reduce(mean)  # the dp last stages' sum, on every rank (rank 0 writes it)
        losses.append(mean.item() / dp)
        dist.synchronize(d.device)
        times.append(time.perf_counter() - t)
    timed = sorted(times[1:] or times)
    return {"losses": losses, "step_times": times, "pp": cfg.pp, "dp": dp, "micro_batch": micro,
            "tokens_per_s": cfg.batch_size * cfg.seq_len / timed[len(timed) // 2],
            "device": dist.device_name(d.device), "world_size": d.world_size}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    cfg = parse(PipelineConfig, argv)
    with dist.session() as d:
        out = train(d, cfg)
        dist.print0(f"{d}; Llama 2 {cfg.model}: pp={out['pp']} x dp={out['dp']}, {cfg.schedule}, "
                    f"global batch {cfg.batch_size} = {out['dp']} x {cfg.microbatches} x {out['micro_batch']}")  # fmt: skip
        dist.print0(
            f"losses {[round(x, 4) for x in out['losses']]}, {out['tokens_per_s']:.0f} tokens/s"
        )
        if d.is_main:
            write_metrics(out)


if __name__ == "__main__":
    main()
