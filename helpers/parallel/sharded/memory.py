"""How many bytes each GPU holds when training: predicted (estimate) and measured (measure).

Model states, per parameter (the ZeRO paper, Rajbhandari et al. 2020, section 3):

    precision   weights  grads  optimizer (Adam)                   (SGD)   (SGD+momentum)
    fp32          4        4     8  (m, v)                           0      4
    mixed         2        2    12  (fp32 master 4 + m 4 + v 4)      4      8

    24 B/param for fp32 with Adam counts 8 more for activations (seed 000's table); the model
    states alone are 16 B/param in both precisions.

A data-parallel group of N ranks divides what the ZeRO stage shards by N:

    stage 0 (DDP)      nothing sharded                  P x (w + g + o)
    stage 1            optimizer states                 P x (w + g) + P x o / N
    stage 2            + gradients                      P x w + P x (g + o) / N
    stage 3 (FSDP)     + weights                        P x (w + g + o) / N  (+ one gathered layer)

CPU offload moves what is sharded to host memory (DeepSpeed's ZeRO-Offload; FSDP2's
CPUOffloadPolicy): the GPU then holds only what is replicated plus, at stage 3, the layer
being gathered.

Activations of one transformer block (``GPTBlock`` below), per sample, in values saved for
backward, with s tokens, hidden size h, a heads, MLP width f = 4h, flash-style attention
(scaled_dot_product_attention keeps q, k, v, its output and a log-sum-exp, never the s x s
scores; Korthikanti et al. 2022 count the same tensors):

    LayerNorm 1 input and output  2 s h     (+ mean and 1/std: 2 s)
    q, k, v (one qkv tensor)      3 s h
    attention output, logsumexp   s h + a s (also the output projection's input: the kernel
                                            lays its output out as (S, heads, h/heads),
                                            so transposing the heads back copies nothing)
    LayerNorm 2 input and output  2 s h     (+ 2 s)
    MLP: GELU input, fc2 input    2 s f
                                  = s (8h + 2f + a + 4)   = s (16h + a + 4) for f = 4h

Eager attention (softmax written out, ``GPTBlock(attention="eager")``) keeps its a x s x s
probabilities instead of the log-sum-exp, and the heads' output is copied back into (s, h)
for the output projection (the same s h as above): s (16h + a s + 4). The s x s term is why
long sequences need flash attention: for Llama 2 7B at s = 4096 it is 32 x 4096^2 = 537 M
values per layer and sequence, 1.07 GB in bf16, more than the 0.63 GB the rest of its block
keeps (notebook 04 prints both).

With activation checkpointing a block keeps only its input (s h) and recomputes the rest
during backward, one block at a time: peak = L s h + one block's activations.

    estimate(model_or_params, dp=4, stage=3, precision="mixed", optimizer="adam") -> States
    activations(batch, seq, hidden, heads, layers, checkpoint=False) -> Activations
    measure_states(model, optimizer) -> States       bytes this rank really holds (local shards)
    saved_activation_bytes(fn, *inputs) -> int       bytes autograd saves for backward
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "BYTES",
    "States",
    "Activations",
    "GPTBlock",
    "estimate",
    "activations",
    "count_params",
    "largest_layer",
    "llama_largest_unit",
    "local_tensor",
    "measure_states",
    "saved_activation_bytes",
]

GB = 1e9

# bytes per parameter: (weights, gradients, optimizer states) by precision and optimizer
BYTES = {
    "fp32": {"w": 4, "g": 4, "adam": 8, "sgd": 0, "momentum": 4},
    "mixed": {"w": 2, "g": 2, "adam": 12, "sgd": 4, "momentum": 8},
}
STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class States:
    """Bytes of model states on one GPU (and, with offload, in its host's memory)."""

    params: float
    grads: float
    optimizer: float
    gathered: float = 0.0  # stage 3: one layer's full weights + grads while it computes
    cpu: float = 0.0  # offloaded to host memory

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.gathered

    def as_dict(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "gathered": self.gathered}  # fmt: skip


@dataclass(frozen=True)
class Activations:
    stored: float  # bytes kept between forward and backward
    peak: float  # stored + what backward recomputes at once (checkpointing), else = stored


def count_params(model_or_params: nn.Module | int) -> int:
    if isinstance(model_or_params, nn.Module):
        return sum(p.numel() for p in model_or_params.parameters())
    if isinstance(model_or_params, int) and model_or_params > 0:
        return model_or_params
    raise TypeError(f"give an nn.Module or a positive parameter count, not {model_or_params!r}")


def largest_layer(model: nn.Module) -> int:
    """Parameters of the largest leaf module (what ZeRO-3 gathers at one time, at least)."""
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


def llama_largest_unit(args) -> int:
    """Parameters of the largest FSDP unit of a Llama 2 shape (helpers.models.llama2.ModelArgs)
    wrapped block by block: a decoder block (202 M for 7B), or the embedding or output matrix
    (vocab x dim: 131 M for 7B) when that is larger."""
    from helpers.models import llama2

    n = llama2.param_count(args)
    block = (n - 2 * args.vocab_size * args.dim - args.dim) // args.n_layers
    return max(block, args.vocab_size * args.dim)


def _check(dp: int, stage: int, precision: str, optimizer: str, offload: bool) -> None:
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}: use 0 (DDP), 1, 2 or 3 (FSDP)")
    if not (isinstance(dp, int) and dp >= 1):
        raise ValueError(f"dp={dp!r}: the data-parallel degree is a whole number >= 1")
    if precision not in BYTES:
        raise ValueError(f"precision={precision!r}: use one of {sorted(BYTES)}")
    if optimizer not in ("adam", "sgd", "momentum"):
        raise ValueError(f"optimizer={optimizer!r}: use 'adam', 'sgd' or 'momentum' (SGD)")
    if offload and stage == 0:
        raise ValueError("offload=True needs stage >= 1: offloading moves the shards to the CPU")


def estimate(
    model_or_params: nn.Module | int,
    dp: int = 1,
    stage: int = 0,
    precision: str = "fp32",
    optimizer: str = "adam",
    offload: bool = False,
    largest: int | None = None,
    fp32_grad_shard: bool = False,
) -> States:
    """Model-state bytes per GPU. ``largest``: parameters gathered at once at stage 3
    (default: the largest leaf module of a model, 0 for a bare count). ``fp32_grad_shard``:
    also count an fp32 copy of the gradient shard (DeepSpeed keeps one in mixed precision)."""
    _check(dp, stage, precision, optimizer, offload)
    p = count_params(model_or_params)
    if largest is None:
        largest = largest_layer(model_or_params) if isinstance(model_or_params, nn.Module) else 0
    b = BYTES[precision]
    w, g, o = p * b["w"], p * b["g"], p * b[optimizer]
    if fp32_grad_shard and precision == "mixed":
        o += 4 * p  # counted with the optimizer: it lives and is sharded with it
    sharded = {"o": stage >= 1, "g": stage >= 2, "w": stage >= 3}
    parts = {k: v / dp if sharded[k] else v for k, v in (("w", w), ("g", g), ("o", o))}
    cpu = 0.0
    if offload:
        cpu = sum(v for k, v in parts.items() if sharded[k])
        parts = {k: 0.0 if sharded[k] else v for k, v in parts.items()}
    gathered = largest * (b["w"] + b["g"]) if stage == 3 else 0.0
    return States(params=parts["w"], grads=parts["g"], optimizer=parts["o"],
                  gathered=gathered, cpu=cpu)  # fmt: skip


def block_values(seq: int, hidden: int, heads: int, ffn: int | None = None,
                 eager: bool = False) -> int:  # fmt: skip
    """Values one GPTBlock saves for backward, per sample (module docstring)."""
    f = 4 * hidden if ffn is None else ffn
    attention = heads * seq if eager else heads  # s x s probabilities, or the log-sum-exp
    return seq * (8 * hidden + 2 * f + attention + 4)


def activations(
    batch: int,
    seq: int,
    hidden: int,
    heads: int,
    layers: int,
    checkpoint: bool = False,
    bytes_per_value: int = 4,
    ffn: int | None = None,
    eager: bool = False,
) -> Activations:
    """Activation bytes of ``layers`` GPTBlocks for ``batch`` samples of ``seq`` tokens
    (flash attention; ``eager=True``: attention that stores its s x s probabilities)."""
    if min(batch, seq, hidden, heads, layers, bytes_per_value) < 1:
        raise ValueError("batch, seq, hidden, heads, layers and bytes_per_value must be >= 1")
    one_block = batch * block_values(seq, hidden, heads, ffn, eager) * bytes_per_value
    if not checkpoint:
        full = layers * one_block
        return Activations(stored=full, peak=full)
    inputs = layers * batch * seq * hidden * bytes_per_value  # each block's input only
    return Activations(stored=inputs, peak=inputs + one_block)


class GPTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(.)). Input (B, S, h).
    ``attention="flash"``: scaled_dot_product_attention; ``"eager"``: the softmax written
    out, which keeps the (B, heads, S, S) probabilities for backward."""

    def __init__(self, hidden: int, heads: int, ffn: int | None = None, attention="flash"):
        super().__init__()
        if attention not in ("flash", "eager"):
            raise ValueError(f"attention={attention!r}: use 'flash' or 'eager'")
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.fc1 = nn.Linear(hidden, ffn or 4 * hidden)
        self.fc2 = nn.Linear(ffn or 4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        # (B, S, 3h) -> three (B, heads, S, h/heads) views of one tensor
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.attention == "flash":
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # an additive mask saves nothing; softmax saves its output, (B, heads, S, S)
            mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
            scores = q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5 + mask
            out = scores.softmax(-1) @ v  # (B, heads, S, h/heads): the reshape below copies
        x = x + self.proj(out.transpose(1, 2).reshape(b, s, h))  # flash: a view (S, heads, .)
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


# --------------------------------------------------------------------------- measurement


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank stores: a DTensor's local shard, else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(tensors) -> int:
    """Bytes of distinct storages (views of one tensor are counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel() > 0:
            t = local_tensor(t)
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _optimizer_tensors(optimizer) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps a local one
    return [v for st in inner.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def measure_states(model: nn.Module, optimizer=None) -> States:
    """Bytes this rank really holds: local parameter shards, their gradients, optimizer state."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    optim = _optimizer_tensors(optimizer) if optimizer is not None else []
    optim = [t for t in optim if t.dim() > 0]  # Adam's step counters: one number per tensor
    return States(params=_nbytes(params), grads=_nbytes(grads), optimizer=_nbytes(optim))


def saved_activation_bytes(fn, *inputs, params: nn.Module | None = None) -> int:
    """Run ``fn(*inputs)`` and return the bytes autograd keeps for backward: every tensor
    packed by ``torch.autograd.graph.saved_tensors_hooks``, distinct storages only, not
    counting the parameters of ``params`` (saved by matmuls, but not activations)."""
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    exclude = set()
    if params is not None:
        exclude = {p.untyped_storage().data_ptr() for p in params.parameters()}
    kept = [t for t in saved if t.untyped_storage().data_ptr() not in exclude]
    del out
    return _nbytes(kept)
