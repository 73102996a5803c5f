"""Model parallelism for CoAtNet (seed 004's lab): its stages on two ranks, pipelined, and TP.

    flat(model) = Sequential(stem, MBConv..., Transformer..., PoolHead)
    split(model) -> (conv part, transformer part)     the cut seed 004's lab makes:
                                                       rank 0 convolutions, rank 1 attention
    rank 0: stem, S1, S2 (B, C, H, W) --send activation--> rank 1: S3, S4, head -> loss
            <---------------- its gradient ----------------

``run_pipeline(d, model, x, y, m)`` pipelines that cut with torch.distributed.pipelining
(m = 1 is naive model parallelism: one rank always waits); ``apply_tp(model, tp_mesh)``
shards the transformer blocks Megatron's way and leaves the convolutions replicated.
Every variant equals ``serial_step`` (tests/distributed/test_coatnet_parallel.py).

BatchNorm normalises each micro-batch by its own statistics, so the serial twin of an
m-micro-batch pipeline is gradient accumulation over the same m micro-batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage

from helpers.dist import Dist
from helpers.models.coatnet import CoAtNet, TransformerBlock
from helpers.parallel.pipeline import TORCH_SCHEDULES, timed

__all__ = ["PoolHead", "flat", "split", "serial_step", "run_pipeline", "apply_tp", "tp_traffic"]


class PoolHead(nn.Module):
    """Mean over the feature map, then CoAtNet's head: (B, C, H, W) -> (B, classes)."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean((2, 3)))


def flat(model: CoAtNet) -> nn.Sequential:
    """The model as one Sequential of blocks (shares the model's modules and parameters)."""
    blocks = [model.stem] + [b for stage in model.stages for b in stage]
    return nn.Sequential(*blocks, PoolHead(model.head))


def split(model: CoAtNet, at: int | None = None) -> list[nn.Sequential]:
    """Two consecutive pieces of flat(model); default cut: before the first transformer block."""
    seq = flat(model)
    if at is None:
        at = next(i for i, b in enumerate(seq) if isinstance(b, TransformerBlock))
    if not 0 < at < len(seq):
        raise ValueError(f"cut at block {at}: choose 1..{len(seq) - 1} (the model has {len(seq)})")
    return [nn.Sequential(*seq[:at]), nn.Sequential(*seq[at:])]


def serial_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int = 1) -> dict:
    """One process, the same m micro-batches, gradients accumulated: loss and grads by name."""
    model.zero_grad(set_to_none=True)
    losses = []
    for xs, ys in zip(x.chunk(m), y.chunk(m), strict=True):
        loss = F.cross_entropy(model(xs), ys)
        (loss / m).backward()
        losses.append(loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": torch.stack(losses).mean(), "grads": grads}


def run_pipeline(
    d: Dist, model: CoAtNet, x: torch.Tensor, y: torch.Tensor, m: int = 4,
    schedule: str = "gpipe", at: int | None = None, steps: int = 1,
) -> dict:  # fmt: skip
    """This rank's part of ``steps`` pipelined steps over 2 ranks (grads only, no optimizer).

    x: (B, 3, H, W) images, y: (B,) labels, split into m micro-batches by the schedule.
    Returns ``grads`` {name in model: grad} of the parameters this rank holds, ``loss``
    (last rank, mean over micro-batches; None elsewhere), ``events`` of the last step.
    """
    if d.world_size != 2:
        raise ValueError(
            f"run_pipeline cuts CoAtNet in 2 stages: launch 2 ranks, not {d.world_size}"
        )
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule {schedule!r}: choose 'gpipe' or '1f1b'")
    if x.shape[0] % m:
        raise ValueError(f"batch {x.shape[0]} does not split into m={m} equal micro-batches")
    piece = split(model, at)[d.rank]
    events: list = []
    stage = timed(PipelineStage(piece, d.rank, 2, d.device), d.rank, events)
    sched = TORCH_SCHEDULES[schedule](stage, n_microbatches=m, loss_fn=F.cross_entropy)
    for _ in range(steps):
        events.clear()
        model.zero_grad(set_to_none=True)
        losses: list = []
        if d.rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=losses)
    mine = {id(p) for p in piece.parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if id(p) in mine}
    loss = torch.stack(losses).mean().detach() if d.rank == 1 else None
    return {"grads": grads, "loss": loss, "events": sorted(events, key=lambda e: e.start)}


def apply_tp(model: CoAtNet, tp_mesh) -> CoAtNet:
    """Megatron's pairing on every transformer block; convolutional blocks stay replicated.

    attention q, k, v column-wise (each rank: heads/tp heads), proj row-wise (all-reduce);
    MLP fc1 column-wise, fc2 row-wise (all-reduce); the relative-position table is split
    by heads like q. Every TP rank must see the same images.
    """
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    for block in model.modules():
        if not isinstance(block, TransformerBlock):
            continue
        if block.attn.heads % tp:
            raise ValueError(f"tp={tp} does not divide a block's {block.attn.heads} heads")
        parallelize_module(block, tp_mesh, {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel(),
        })  # fmt: skip
        table = distribute_tensor(block.attn.rel_table.data, tp_mesh, [Shard(0)])
        block.attn.rel_table = nn.Parameter(table)  # (heads/tp, (2 side - 1)^2) per rank
    return model


def tp_traffic(cfg, batch: int = 1) -> list[dict]:
    """Per stage: forward FLOPs and the bytes Megatron-style TP would all-reduce (fp32).

    TP pairs one column- and one row-wise layer and all-reduces the pair's output: two
    all-reduces per block (attention + MLP for a transformer block; expand 1x1 + project
    1x1 for an MBConv), each of the block's output activation, (B, C, H, W) values.
    """
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = CoAtNet(cfg)
        x = torch.empty(batch, 3, cfg.image_size, cfg.image_size)
    rows = []
    x = model.stem(x)
    for i, stage in enumerate(model.stages):
        with FlopCounterMode(display=False) as counter:
            out = stage(x)
        act = out[0].numel() * batch
        rows.append({"stage": f"S{i + 1}", "kind": cfg.kinds[i], "flops": counter.get_total_flops(),
                     "allreduce_bytes": 2 * len(stage) * 4 * act, "width": cfg.dims[i + 1],
                     "side": out.shape[-1]})  # fmt: skip
        x = out
    for r in rows:
        r["bytes_per_flop"] = r["allreduce_bytes"] / r["flops"]
    return rows
