"""FSDP + TP for Llama 2 (seed 001's recipe; the PyTorch TP tutorial and torchtitan's plan).

    mesh (dp, tp), TP innermost = inside a node:

            tp=0  tp=1
     dp=0 [  0     1  ]   <- a TP pair: same tokens, half of every weight matrix each
     dp=1 [  2     3  ]   <- another pair, other tokens; FSDP shards over dp (the columns)

Order (as torchtitan's parallelize): apply_tp first, then apply_fsdp. TP turns the weights
into DTensors sharded over "tp"; fully_shard then shards those again over "dp", giving 2D
parameters. The other way round, FSDP's flat shards would hide the rows and columns TP needs.

The TP plan (Megatron's pairing: column-wise then row-wise, one all-reduce per pair):

    attention.wq / wk / wv   ColwiseParallel   each rank owns n_heads / tp heads
    attention.wo             RowwiseParallel   partial sums, reduce-scattered on the sequence
    feed_forward.w1 / w3     ColwiseParallel   each rank owns ffn_hidden / tp of SwiGLU
    feed_forward.w2          RowwiseParallel
    *_norm, norm             SequenceParallel  norms run on S / tp tokens (activations sharded)

Between blocks the activations are (B, S/tp, dim) on each rank (sequence parallel); each
attention / FFN all-gathers the sequence at its input (Megatron's g) and reduce-scatters at its
output (its g-bar).
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

__all__ = ["block_plan", "outer_plan", "apply_tp", "apply_fsdp", "check_tp_degree"]


def block_plan() -> dict:
    """The TP plan of one TransformerBlock, module name -> style (reads as a table)."""
    return {
        "attention_norm": SequenceParallel(),
        # all-gather the sequence before attention; the rotary table (2nd input) is left alone
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }


def outer_plan(loss_parallel: bool = False) -> dict:
    """Embedding, final norm and output layer.

    loss_parallel=True keeps the logits sharded over the vocabulary (Shard(-1) DTensor): the
    cross-entropy must then run under torch.distributed.tensor.parallel.loss_parallel().
    """
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }


def check_tp_degree(args, tp: int) -> None:
    """Every sharded dimension must split evenly into tp pieces."""
    need = {
        "n_heads": args.n_heads,
        "n_kv_heads": args.kv_heads,
        "ffn_hidden": args.ffn_hidden,
        "vocab_size": args.vocab_size,
    }
    bad = {k: v for k, v in need.items() if v % tp}
    if bad:
        raise ValueError(f"tp={tp} does not divide {bad}; choose tp dividing all of {need}")


def apply_tp(model: nn.Module, tp_mesh, loss_parallel: bool = False) -> nn.Module:
    """Shard a helpers.models.llama2.Transformer over tp_mesh (1D) in place.

    Sequences fed to the model must have a length divisible by tp (sequence parallelism).
    A mesh of one rank leaves the model as it is: nothing to split.
    """
    if tp_mesh.size() == 1:
        return model
    check_tp_degree(model.args, tp_mesh.size())
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan())
    # a pipeline stage may lack the embedding (not first) or the norm and output (not last)
    outer = {k: v for k, v in outer_plan(loss_parallel).items() if getattr(model, k) is not None}
    parallelize_module(model, tp_mesh, outer)
    return model


def apply_fsdp(
    model: nn.Module, dp_mesh, reshard_after_forward: bool = True, mixed_precision=None
) -> nn.Module:
    """FSDP2: each block is one all-gather unit (sharded over dp_mesh), then the root.

    Wrapping block by block lets block i+1's all-gather overlap block i's compute, and frees
    each block's full weights after use, so a rank holds one unsharded block at a time.
    ``mixed_precision=torch.bfloat16``: gather and compute in bf16, keep fp32 shards (the
    optimizer's master weights) and reduce-scatter gradients in fp32, as torchtitan does.
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if mixed_precision is not None and mixed_precision != torch.float32:
        policy = MixedPrecisionPolicy(param_dtype=mixed_precision, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
                    mp_policy=policy)  # fmt: skip
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    return model
