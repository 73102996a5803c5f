"""Llama 2, written to be read (Touvron et al. 2023; Meta's reference model.py).

    tokens (B, S)
      -> tok_embeddings                      (B, S, dim)
      -> n_layers x TransformerBlock:
             h = x + attention(attention_norm(x))     RMSNorm, rotary q/k, causal, GQA
             out = h + feed_forward(ffn_norm(h))      SwiGLU: w2(silu(w1 x) * w3 x)
      -> norm (RMSNorm) -> output (Linear)   (B, S, vocab) logits

The module names (``attention.wq``, ``feed_forward.w1``, ``attention_norm`` ...)
are Meta's, so the tensor-parallel plan in helpers.parallel.composed.llama_parallel reads
like the PyTorch TP tutorial's. Attention reshapes with ``-1`` heads, so the same
code runs on a tensor-parallel shard that holds only n_heads / tp heads.

``ModelArgs`` holds a tiny CPU config and the published 7B / 13B / 70B shapes;
``param_count(args)`` and ``flops_per_token(args, seq_len)`` work from the shapes
alone, so a 70B model can be costed without building it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import devices

__all__ = [
    "ModelArgs",
    "CONFIGS",
    "Transformer",
    "RMSNorm",
    "Attention",
    "FeedForward",
    "TransformerBlock",
    "param_count",
    "flops_per_token",
    "config",
]


@dataclass(frozen=True)
class ModelArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None  # None: as many as n_heads (no grouped-query attention)
    vocab_size: int = 32000
    multiple_of: int = 256  # the SwiGLU hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    max_seq_len: int = 4096
    rope_theta: float = 10000.0

    def __post_init__(self):
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} must be a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.kv_heads}"
            )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_hidden(self) -> int:
        """Meta's rule: 2/3 of 4*dim (SwiGLU has three matrices), scaled, rounded up."""
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)


CONFIGS: dict[str, ModelArgs] = {
    # small enough to train on 4 CPU ranks in seconds; 4 heads and 2 KV heads so TP=2 splits both
    "tiny": ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=32, max_seq_len=64
    ),
    "7B": ModelArgs(dim=4096, n_layers=32, n_heads=32),
    "13B": ModelArgs(dim=5120, n_layers=40, n_heads=40),
    "70B": ModelArgs(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3, multiple_of=4096
    ),
}

# Published sizes (Llama 2 paper / model cards), for tests and notebooks.
PUBLISHED_PARAMS = {"7B": 6_738_415_616, "13B": 13_015_864_320, "70B": 68_976_648_192}


def config(name: str, **overrides) -> ModelArgs:
    """CONFIGS[name] with fields replaced, e.g. config("tiny", n_layers=4)."""
    if name not in CONFIGS:
        raise KeyError(f"unknown Llama 2 config {name!r}; choose one of {sorted(CONFIGS)}")
    return replace(CONFIGS[name], **overrides)


def param_count(args: ModelArgs) -> int:
    """Parameters from the shapes alone (embedding and output are not tied in Llama 2)."""
    d, kv = args.dim, args.kv_heads * args.head_dim
    attention = d * d + 2 * d * kv + d * d  # wq, wk, wv, wo
    ffn = 3 * d * args.ffn_hidden  # w1, w2, w3
    block = attention + ffn + 2 * d  # two RMSNorm weights
    return args.n_layers * block + 2 * args.vocab_size * d + d


def flops_per_token(args: ModelArgs, seq_len: int) -> int:
    """Training FLOPs per token: 6 x (non-embedding params) + attention scores.

    6N: each weight does a multiply-add (2 FLOPs) forward and twice that backward.
    12 * L * dim * S: q @ k^T and scores @ v (PaLM paper, appendix B; torchtitan's count).
    The embedding is a lookup, not a matmul, so it is left out of N.
    """
    n = param_count(args) - args.vocab_size * args.dim
    return 6 * n + 12 * args.n_layers * args.dim * seq_len


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without the mean and the bias."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * rms).type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rotary_tables(head_dim: int, seq_len: int, theta: float) -> torch.Tensor:
    """(seq_len, head_dim // 2, 2): cos and sin of position * theta^(-2i/head_dim)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), inv_freq)  # (S, head_dim/2)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rotary(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Rotate each (even, odd) pair of x (B, S, heads, head_dim) by its position's angle."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (B, S, H, head_dim/2, 2)
    cos = tables[: x.shape[1], None, :, 0]  # (S, 1, head_dim/2): broadcast over heads
    sin = tables[: x.shape[1], None, :, 1]
    a, b = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal self-attention with rotary q/k and grouped-query attention (n_kv_heads < n_heads)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.n_rep = args.n_heads // args.kv_heads  # query heads per key/value head
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under TP this rank holds n_heads/tp query heads and kv_heads/tp kv heads
        q = self.wq(x).view(b, s, -1, self.head_dim)  # (B, S, H, hd)
        k = self.wk(x).view(b, s, -1, self.head_dim)  # (B, S, KV, hd)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        # GQA: each kv head serves n_rep query heads
        k = k.repeat_interleave(self.n_rep, dim=2)
        v = v.repeat_interleave(self.n_rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, hd)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), hidden size args.ffn_hidden."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_hidden, bias=False)
        self.w2 = nn.Linear(args.ffn_hidden, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The Llama 2 decoder. forward(tokens (B, S)) -> logits (B, S, vocab)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        # a ModuleDict keyed "0", "1", ... keeps names stable when pipeline stages drop layers
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # not a parameter: rebuilt from args, so it is never sharded nor saved
        tables = rotary_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope", tables, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.args.max_seq_len:
            raise ValueError(
                f"sequence of {tokens.shape[1]} tokens > max_seq_len={self.args.max_seq_len}"
            )
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> Transformer:
        """Deterministic init (normal(0, 0.02) matrices, unit norms), the same on every rank.

        Works on a model built on the meta device and materialised with ``to_empty`` after
        tensor parallelism and FSDP sharded it (torchtitan's order): each parameter is drawn
        whole, one at a time, and each rank keeps only its own shard of it, so no rank ever
        holds the whole model. On a GPU the draws come from the GPU's generator (the same
        on every rank, not the CPU's numbers), and each whole parameter is drawn there;
        elsewhere from the CPU's, on the host.
        """
        device = next(self.parameters()).device
        g = _generator(device, seed)
        for name, p in sorted(self.named_parameters()):
            if name.endswith("norm.weight"):
                full = torch.ones(p.shape, device=g.device)
            else:
                full = torch.randn(p.shape, generator=g, device=g.device) * 0.02
            _assign(p, full)
        tables = rotary_tables(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta)
        self.rope = tables.to(device)  # a buffer beside the weights: on their device
        return self


def _generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on ``device`` if it is a GPU, else the CPU's, seeded with ``seed``.

    The dry run's stand-in GPU has no generator of its own (torch asks its backend for
    one, and it has none): there the draws are made on the host, as on the CPU.
    """
    if devices.is_gpu(device):
        try:
            return torch.Generator(device=device).manual_seed(seed)
        except NotImplementedError:  # the stand-in: "implement getNewGenerator"
            pass
    return torch.Generator(device="cpu").manual_seed(seed)


def _assign(p: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a whole parameter's values into ``p``, or into this rank's shard of it."""
    from torch.distributed.tensor import DTensor

    from helpers import compat

    if isinstance(p, DTensor):
        shard = compat.distribute_local(full.to(p.device), p.device_mesh, p.placements)
        p.to_local().copy_(shard.to_local())
    else:
        p.copy_(full)
