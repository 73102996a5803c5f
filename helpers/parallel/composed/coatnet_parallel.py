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
from helpers.parallel.pipeline.pipeline import TORCH_SCHEDULES, timed

__all__ = ["PoolHead", "flat", "split", "serial_step", "run_pipeline", "apply_tp", "blocks",
           "workload", "tp_traffic"]  # fmt: skip


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


def _blocks_on_meta(cfg):
    """(name, block, kind) for the stem, every block in order, and the head, on the meta device."""
    with torch.device("meta"):
        model = CoAtNet(cfg)
    out = [("stem", model.stem, "C")]
    for name, kind, stage in zip(cfg.stage_names(), cfg.kinds, model.stages, strict=True):
        out += [(f"{name}.{j}", b, kind) for j, b in enumerate(stage)]
    return out + [("head", PoolHead(model.head), "H")]


def _saved_bytes(block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(output, bytes autograd saves for backward, parameters excluded), on the meta device."""
    params = {id(p) for p in block.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        base = t._base if t._base is not None else t
        if id(t) not in params and id(base) not in params:  # weights (or views) are not activations
            saved[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x.requires_grad_())
    return out.detach(), sum(saved.values())


def blocks(cfg, batch: int = 1) -> list[dict]:
    """Per block of CoAtNet (stem, MBConv and transformer blocks, head), for one image:
    parameters, forward FLOPs, bytes saved for backward, output bytes and TP traffic.

    TP traffic per forward, Megatron's pairing: a transformer block all-reduces its attention
    output and its MLP output (2 x its output); an MBConv block split the same way (expand
    1 x 1 column-wise, project 1 x 1 row-wise; depthwise 3 x 3 and BatchNorm per channel)
    all-reduces its output once, plus squeeze-excite's small vector (its first 1 x 1 reads
    every channel). Counted on the meta device: exact shapes, no memory.
    """
    from torch.utils.flop_counter import FlopCounterMode

    from helpers.models.coatnet import MBConv

    with torch.device("meta"):
        x = torch.empty(batch, 3, cfg.image_size, cfg.image_size)
    rows = []
    for name, block, kind in _blocks_on_meta(cfg):
        with FlopCounterMode(display=False) as counter:
            out, act = _saved_bytes(block, x)
        value = out.numel() * out.element_size()
        tp_bytes, messages = 0, 0
        if isinstance(block, TransformerBlock):
            tp_bytes, messages = 2 * value, 2
        elif isinstance(block, MBConv):
            se = block.body[7].fc1.out_channels * batch * out.element_size()
            tp_bytes, messages = value + se, 2
        rows.append({"name": name, "kind": kind, "params": sum(p.numel() for p in block.parameters()),
                     "flops": counter.get_total_flops(), "act_bytes": act, "out_bytes": value,
                     "tp_bytes": tp_bytes, "tp_messages": messages,
                     "width": out.shape[1], "side": out.shape[-1] if out.dim() == 4 else 1})  # fmt: skip
        x = out
    return rows


def workload(cfg, name: str = "CoAtNet", state_bytes=(4, 4, 8)):
    """CoAtNet as the planner sees it (helpers.parallel.composed.planner), per image, FP32 with Adam.

    TP splits the transformer blocks only (as ``apply_tp`` does); the stem, MBConv blocks and
    head stay whole on every TP rank, their FLOPs and activations undivided. Of a transformer
    block's activations, TP without sequence parallelism leaves the two LayerNorms' inputs and
    outputs whole (4 x its output). Memory rules: torch DDP (its bucket copy of the gradients)
    and FSDP2 in fp32 (workloads.default_frameworks).
    """
    import math

    from helpers.parallel.composed import planner, workloads

    rows, out = blocks(cfg), []
    for r in rows:
        t = r["kind"] == "T"
        out.append(planner.Block(params=r["params"], flops=3 * r["flops"], act_bytes=r["act_bytes"],
                                 out_bytes=r["out_bytes"], tp_bytes=r["tp_bytes"] if t else 0.0,
                                 tp_messages=r["tp_messages"] if t else 0,
                                 act_replicated=4 * r["out_bytes"] if t else 0.0, tp=t))  # fmt: skip
    heads = [w // cfg.head_dim for w, k in zip(cfg.dims[1:], cfg.kinds, strict=True) if k == "T"]
    tokens = max(r["side"] ** 2 for r in rows if r["kind"] == "T")
    return planner.Workload(name, tuple(out), seq_len=tokens, heads=math.gcd(*heads),
                            state_bytes=tuple(state_bytes),
                            framework=workloads.default_frameworks(state_bytes))  # fmt: skip


def tp_traffic(cfg, batch: int = 1) -> list[dict]:
    """Per stage: forward FLOPs and the bytes Megatron-style TP would all-reduce (fp32).

    A transformer block all-reduces twice (attention and MLP outputs); an MBConv block once
    (the project 1 x 1's output) plus squeeze-excite's small vector (``blocks``).
    """
    rows = {}
    for r in blocks(cfg, batch):
        if r["name"] in ("stem", "head"):
            continue
        stage = r["name"].split(".")[0]
        row = rows.setdefault(stage, {"stage": stage, "kind": r["kind"], "flops": 0,
                                      "allreduce_bytes": 0, "width": r["width"],
                                      "side": r["side"]})  # fmt: skip
        row["flops"] += r["flops"]
        row["allreduce_bytes"] += r["tp_bytes"]
    for r in rows.values():
        r["bytes_per_flop"] = r["allreduce_bytes"] / r["flops"]
    return list(rows.values())
