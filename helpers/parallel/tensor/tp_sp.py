"""Sequence parallelism by hand (Megatron-LM, Korthikanti et al. 2022) for the small decoder.

Between the layer pairs each rank keeps only its tokens, [B, T/N, d]; the norms, residuals
and whatever else sits there run on T/N tokens. Around each pair:

    x_r [B, T/N, d] --norm--> --f': all-gather T--> q, k, v (column) -> attention -> o (row)
        --g': reduce-scatter T--> [B, T/N, d] (+ o's bias) + x_r          and the same for the MLP

    rank 0:  tokens 0 .. T/N-1   norm  --+                    +--> tokens 0 .. T/N-1
    rank 1:  tokens T/N .. 2T/N  norm  --+-- all-gather ...  -+--> tokens T/N .. 2T/N
                                         (whole sequence in the pair, heads/features split)

f' and g' send what f and g sent (an all-reduce = a reduce-scatter + an all-gather). What
changes is memory: as in Megatron, the column layers keep
only this rank's shard of their input and gather it again in the backward pass, so every
activation a block saves is divided by N: Korthikanti's 34/t instead of 10 + 24/t.

The norms' weights and the row layers' biases see only this rank's tokens, so their
gradients are partial sums over the sequence: ``sync_sequence_parallel_grads`` all-reduces
them over the TP group in one flat message (Megatron does the same after backward).
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn

from helpers.parallel.tensor.tp import ColumnParallelLinear, RowParallelLinear, check_tp_size
from helpers.parallel.tensor.tp_async import column_parallel
from helpers.parallel.tensor.tp_comm import CommLog, gather_from_sp, split_to_sp, tp_rank_size

__all__ = [
    "SequenceParallelAttention",
    "SequenceParallelMLP",
    "sequence_parallel_params",
    "shard_decoder_sp",
    "sync_sequence_parallel_grads",
]


def _columns(module, names, group, log, prefix):
    for n in names:
        col = ColumnParallelLinear(getattr(module, n), group, log=log, name=f"{prefix}.{n}",
                                   sync_input_grad=False)  # fmt: skip
        setattr(module, n, col)  # holds this rank's shard; its forward is not used


class SequenceParallelAttention(nn.Module):
    """Attention by heads on a sequence-split input: f' once for q, k and v, then g'."""

    def __init__(self, attn: nn.Module, group=None, log=None, name="attn", overlap=True):
        super().__init__()
        check_tp_size(tp_rank_size(group)[1], heads=attn.n_heads)
        _columns(attn, ("q", "k", "v"), group, log, name)
        attn.o = RowParallelLinear(attn.o, group, log=log, name=f"{name}.o", sequence_parallel=True)
        self.inner, self.group, self.log, self.name, self.overlap = attn, group, log, name, overlap

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        if cache is not None:
            raise ValueError("sequence parallelism is for training: generate with shard_decoder")
        a = self.inner
        q, k, v = column_parallel(x, [a.q, a.k, a.v], self.group, self.log, self.name,
                                  sequence_parallel=True, overlap=self.overlap)  # fmt: skip
        return a.o(a.attend(q, k, v))  # o: row-parallel, reduce-scatter to this rank's tokens


class SequenceParallelMLP(nn.Module):
    """fc1 column-parallel behind f', fc2 row-parallel followed by g'."""

    def __init__(self, mlp: nn.Module, group=None, log=None, name="mlp", overlap=True):
        super().__init__()
        _columns(mlp, ("fc1",), group, log, name)
        mlp.fc2 = RowParallelLinear(mlp.fc2, group, log=log, name=f"{name}.fc2",
                                    sequence_parallel=True)  # fmt: skip
        self.inner, self.group, self.log, self.name, self.overlap = mlp, group, log, name, overlap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.inner
        (h,) = column_parallel(x, [m.fc1], self.group, self.log, self.name,
                               sequence_parallel=True, overlap=self.overlap)  # fmt: skip
        return m.fc2(m.act(h))


def shard_decoder_sp(model: nn.Module, group=None, log: CommLog | None = None,
                     overlap: bool = True) -> nn.Module:  # fmt: skip
    """Make a helpers.parallel.tensor.tp_inference.Decoder tensor- and sequence-parallel in place.

    The embedding stays replicated; the first block keeps this rank's tokens (its input's
    gradient is all-gathered back); the final norm gathers the sequence again (its gradient
    is replicated, so the backward keeps this rank's slice: no message).
    """
    tp = tp_rank_size(group)[1]
    check_tp_size(tp, heads=model.cfg.n_heads, hidden=model.cfg.hidden)
    for i, block in enumerate(model.blocks):
        block.attn = SequenceParallelAttention(block.attn, group, log, f"blocks.{i}.attn", overlap)
        block.mlp = SequenceParallelMLP(block.mlp, group, log, f"blocks.{i}.mlp", overlap)
        for norm in (block.norm1, block.norm2):
            for p in norm.parameters():
                p.sequence_parallel = True  # sees T/N tokens: a partial gradient

    def enter(_module, args):
        return (split_to_sp(args[0], group, log, "enter"), *args[1:])

    def leave(_module, args):
        return (gather_from_sp(args[0], group, log, "leave", grad_is_partial=False), *args[1:])

    model.blocks[0].register_forward_pre_hook(enter)
    model.norm.register_forward_pre_hook(leave)
    return model


def sequence_parallel_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if getattr(p, "sequence_parallel", False)]


def sync_sequence_parallel_grads(model: nn.Module, group=None, log: CommLog | None = None):
    """Sum the partial gradients of the norms and row biases over the TP group: one
    all-reduce of all of them, flattened (call it after backward, before the optimizer)."""
    params = [p for p in sequence_parallel_params(model) if p.grad is not None]
    if not params:
        return 0
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    tdist.all_reduce(flat, group=group)
    if log is not None:
        log.record("all_reduce", "after backward", "sequence-parallel grads",
                   flat.numel() * flat.element_size(), tp_rank_size(group)[1])  # fmt: skip
    for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad.copy_(g.view_as(p.grad))
    return len(params)
