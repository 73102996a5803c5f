"""What one tensor-parallel rank holds: model states and saved activations, counted and measured.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4) count the bytes a transformer layer saves for backward, with s tokens per sequence,
b sequences, width h, a heads, 16-bit values, dropout and stored attention scores:

    no parallelism       s b h (34 + 5 a s / h)
    tensor parallel t    s b h (10 + 24 / t + 5 a s / (h t))
    + sequence parallel  s b h (34 / t + 5 a s / (h t))

Per token, in values, the 34 are: each norm's input and output (4 h, the "10" with the two
dropout masks of 1 byte), q, k, v (3 h), the attention output (h), the MLP's GeLU input and
output (2 x 4 h); the 5 a s are the softmax's output, its dropout mask and output. The
workbook's decoder has no dropout, keeps 4-byte values, and its attention
(scaled_dot_product_attention) saves a log-sum-exp per head and token instead of the s x s
scores; LayerNorm saves a mean and 1/std per token. Per block, in values, with MLP width f:

    layout                     replicated on every rank    divided by t
    tp                         s b (4 h + 4)               s b (4 h + 2 f + a)
    sp (Megatron)              0                           s b (8 h + 2 f + 4 + a)
    sp, keeping the gathered   s b (2 h)                   s b (6 h + 2 f + 4 + a)
        input (DTensor's plan)

DTensor's ``ColwiseParallel`` saves its all-gathered input (the whole sequence, on every
rank) for the weight gradient; Megatron saves the shard and all-gathers it again in the
backward pass, which is what the 34 / t assumes. Model states: a weight split by columns or
rows is divided by t, the rest (norms, row biases, embeddings, head) is replicated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from helpers.parallel.sharded.memory import local_tensor, measure_states

__all__ = [
    "LAYOUTS",
    "activation_values",
    "korthikanti_bytes",
    "measure_rank",
    "saved_bytes",
    "state_values",
]

LAYOUTS = {
    "tp": "TP",
    "sp": "TP+SP by hand (Megatron: gathers again in backward)",
    "sp-dtensor": "TP+SP with DTensor (keeps the gathered input)",
}
SHARDED = ("q", "k", "v", "o", "fc1", "fc2")  # the linear layers split by columns or rows


def activation_values(tokens: int, dim: int, hidden: int, heads: int, tp: int, layout: str):
    """Values one block saves for backward on one rank: (replicated, divided by tp) parts."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: use one of {list(LAYOUTS)}")
    h, f, a = dim, hidden, heads
    per_token = {
        "tp": (4 * h + 4, 4 * h + 2 * f + a),
        "sp": (0, 8 * h + 2 * f + 4 + a),
        "sp-dtensor": (2 * h, 6 * h + 2 * f + 4 + a),
    }[layout]
    if tp == 1:  # one process: everything, once
        per_token = (0, 8 * h + 2 * f + 4 + a)
    replicated, split = per_token
    return tokens * replicated, tokens * split / tp


def korthikanti_bytes(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel=False):
    """Section 4's bytes per layer, as published (16-bit values, dropout, stored scores)."""
    scores = 5 * a * s / (h * t)
    if t == 1:
        return s * b * h * (34 + scores)
    if sequence_parallel:
        return s * b * h * (34 / t + scores)
    return s * b * h * (10 + 24 / t + scores)


def state_values(model: nn.Module, tp: int) -> dict[str, float]:
    """Parameters one rank holds, from the unsharded model: split layers' weights (and the
    column layers' biases) divided by tp, everything else replicated."""
    out = {"split": 0.0, "replicated": 0.0}
    for name, p in model.named_parameters():
        layer, kind = name.split(".")[-2:] if name.count(".") else ("", name)
        column = layer in ("q", "k", "v", "fc1")
        split = layer in SHARDED and (kind == "weight" or column)
        out["split" if split else "replicated"] += p.numel() / (tp if split else 1)
    return out


def saved_bytes(fn, *args, exclude: nn.Module | None = None) -> int:
    """Bytes autograd keeps for backward while ``fn(*args)`` runs: distinct local storages
    (a DTensor counts its shard), leaving out the parameters of ``exclude``."""
    seen: dict[int, int] = {}

    def pack(t):
        local = local_tensor(t)
        if local.numel():
            seen[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    params = set()
    if exclude is not None:
        params = {local_tensor(p).untyped_storage().data_ptr() for p in exclude.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


def _build(d, cfg, layout: str):
    from helpers.parallel.tensor import tp_inference as TI
    from helpers.parallel.tensor import tp_sp

    model = TI.tiny_decoder(cfg)
    if d.world_size == 1:
        return model
    if layout == "tp":
        return TI.shard_decoder(model)
    if layout == "sp":
        return tp_sp.shard_decoder_sp(model)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(d.device.type, (d.world_size,))
    return TI.apply_dtensor_tp(model, mesh, sequence_parallel=True)


def measure_rank(d, cfg, batch: int, seq: int, layout: str) -> dict[str, float]:
    """On every rank of a TP group: bytes this rank holds after one AdamW step (parameters,
    gradients, optimizer states) and the bytes all the blocks save for backward (activations)."""
    from helpers.parallel.tensor import tp_inference as TI
    from helpers.parallel.tensor import tp_sp
    from helpers.parallel.tensor.tp import param_groups

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab, (batch, seq + 1), generator=g)
    model = _build(d, cfg, layout)
    x = torch.randn(batch, seq, cfg.dim, generator=g).requires_grad_()

    def blocks(h):
        for block in model.blocks:
            h = block(h, None)
        return h

    activations = saved_bytes(blocks, x, exclude=model)
    model.zero_grad(set_to_none=True)
    # DTensors apart from plain tensors: a GPU's foreach step refuses the two in one group
    opt = torch.optim.AdamW(param_groups(model.parameters()), lr=1e-3)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    if layout == "sp" and d.world_size > 1:
        tp_sp.sync_sequence_parallel_grads(model)
    elif layout == "sp-dtensor" and d.world_size > 1:
        TI.sync_partial_grads(model)
    opt.step()
    states = measure_states(model, opt)
    return {"params": states.params, "grads": states.grads, "optimizer": states.optimizer,
            "activations": activations}  # fmt: skip
