"""A small decoder-only transformer, its tensor-parallel version, and greedy generation.

    tokens [B, T] -> embed -> n_layers x Block -> norm -> head -> logits [B, T, vocab]
    Block:  x + attn(norm1(x))  then  x + mlp(norm2(x))
    attn:   q, k, v, o = Linear(dim, dim); n_heads heads of head_dim = dim / n_heads
    mlp:    fc1 Linear(dim, hidden), GeLU, fc2 Linear(hidden, dim)

``shard_decoder(model, group)`` swaps every block's attention and MLP for the hand-written
ParallelAttention and ParallelMLP of helpers.parallel.tensor.tp: each rank of the TP group keeps
n_heads / N heads and hidden / N MLP features. Embedding, norms and head stay replicated.

The key-value cache holds, for every layer, the keys and values of the tokens seen so far,
[B, heads, T_so_far, head_dim]. Under TP each rank's attention only computes its own heads,
so each rank's cache holds [B, heads / N, T, head_dim]: the cache is sharded by heads with no
extra code, and its memory per rank is divided by N. Greedy decoding then needs no message
besides the two all-reduces per block: every rank gets the same logits and picks the same
token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.parallel.tensor.tp import (
    CommLog,
    ParallelAttention,
    ParallelMLP,
    check_tp_size,
    tp_rank_size,
)

__all__ = ["DecoderConfig", "Decoder", "KVCache", "generate", "shard_decoder", "tiny_decoder"]


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 64
    dim: int = 32
    n_heads: int = 4
    hidden: int = 128  # MLP width
    n_layers: int = 2
    max_len: int = 64

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class KVCache:
    """Per layer: keys and values so far, each [B, local heads, T_so_far, head_dim]."""

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, layer: int = 0):
        super().__init__()
        self.n_heads, self.head_dim, self.layer = n_heads, dim // n_heads, layer
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        return self.o(self.attend(self.q(x), self.k(x), self.v(x), cache))

    def attend(self, q, k, v, cache: KVCache | None = None) -> torch.Tensor:
        """Causal attention of projected q, k, v [B, T, heads x head_dim] -> [B, T, same]."""
        b, t, _ = q.shape
        # view(B, T, -1, head_dim): -1 is the number of heads this rank holds (all, or H/N)
        q, k, v = (y.view(b, t, -1, self.head_dim).transpose(1, 2) for y in (q, k, v))
        past = 0
        if cache is not None:
            done = cache.k[self.layer]
            past = 0 if done is None else done.shape[2]  # tokens already in this layer's cache
            k, v = cache.append(self.layer, k, v)  # [B, h, past + t, head_dim]
        if past == 0:  # training and prefill: a plain causal mask, which no tensor holds
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, h, t, head_dim]
        else:  # decoding: query i (position past + i) sees keys 0 .. past + i
            mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(diagonal=past)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, t, -1)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg.dim, cfg.n_heads, layer)
        self.mlp = MLP(cfg.dim, cfg.hidden)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cache)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.max_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        start = 0 if cache is None else cache.length()
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)  # [B, T, dim]
        for block in self.blocks:
            x = block(x, cache)
        return self.head(self.norm(x))  # [B, T, vocab]


def tiny_decoder(cfg: DecoderConfig | None = None, seed: int = 0, dtype=torch.float32) -> Decoder:
    """The same random weights on every rank (same seed): each rank then keeps its shards."""
    torch.manual_seed(seed)
    return Decoder(cfg or DecoderConfig()).to(dtype)


def shard_decoder(model: Decoder, group=None, log: CommLog | None = None) -> Decoder:
    """Make ``model`` tensor-parallel in place over ``group``: attention by heads, MLP by
    features (Megatron pairing). Raises if the TP size does not divide heads or hidden sizes."""
    cfg = model.cfg
    tp = tp_rank_size(group)[1]
    check_tp_size(tp, heads=cfg.n_heads)
    check_tp_size(tp, hidden=cfg.hidden)
    for i, block in enumerate(model.blocks):
        block.attn = ParallelAttention(block.attn, group, log, name=f"blocks.{i}.attn")
        block.mlp = ParallelMLP(block.mlp, group, log, name=f"blocks.{i}.mlp")
    return model


@torch.no_grad()
def generate(model: Decoder, prompt: torch.Tensor, new_tokens: int, use_cache: bool = True):
    """Greedy decoding: ``prompt`` [B, T0] -> [B, T0 + new_tokens].

    With the cache, the prompt runs once (prefill), then one token per step (decode), each
    step reading the cached keys and values instead of recomputing them. Returns the tokens
    and the cache (None without it).
    """
    if prompt.shape[1] + new_tokens > model.cfg.max_len:
        raise ValueError(
            f"prompt ({prompt.shape[1]}) + new_tokens ({new_tokens}) exceeds max_len "
            f"{model.cfg.max_len}: generate fewer tokens or build the model with a larger max_len"
        )
    cache = KVCache(model.cfg.n_layers) if use_cache else None
    tokens, step_input = prompt, prompt
    for _ in range(new_tokens):
        logits = model(step_input if use_cache else tokens, cache)
        nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # [B, 1]
        tokens = torch.cat([tokens, nxt], dim=1)
        step_input = nxt
    return tokens, cache


def shard_names(serial: Decoder, rank: int, world: int, grads: bool = False) -> dict:
    """What each parameter of the sharded model on ``rank`` should equal, taken from the
    serial model: {serial name: this rank's slice of the serial weight (or gradient)}.

    Column layers (q, k, v, fc1) keep rows of the weight and of the bias; row layers (o,
    fc2) keep columns of the weight and the whole bias; everything else is replicated.
    """
    out = {}
    for name, p in serial.named_parameters():
        t = p.grad if grads else p.detach()
        layer = name.split(".")[-2] if "." in name else ""
        if layer in ("q", "k", "v", "fc1"):
            t = t.chunk(world, dim=0)[rank]
        elif layer in ("o", "fc2") and name.endswith("weight"):
            t = t.chunk(world, dim=1)[rank]
        out[name] = t
    return out


# --------------------------------------------------------------------------- DTensor


def block_plan(sequence_parallel: bool = False) -> dict:
    """The DTensor plan of one Block, a table from sub-module names to styles (torchtitan's).

    Plain TP: q, k, v, fc1 column-wise; o, fc2 row-wise (the Megatron pairing). The attention
    and the MLP first turn their input into one replicated DTensor (``PrepareModuleInput``):
    q, k and v then read the same DTensor, their partial input gradients add up on it, and a
    single all-reduce sums them, like the hand-written f. Without it each of q, k, v makes
    its own DTensor from the plain input and all-reduces its own input gradient (3, not 1).
    sequence_parallel=True: between the pairs the activations stay split along the
    sequence (Shard(1)); the norms run on their slice (SequenceParallel); an all-gather
    before attention and MLP (PrepareModuleInput from Shard(1)) and a reduce-scatter after o
    and fc2 (output_layouts=Shard(1)) replace each all-reduce.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    seq, full = Shard(1), Replicate()  # activations [B, T, dim]: Shard(1) splits T
    into = seq if sequence_parallel else full  # the layout of a block's activations
    plan = {
        "attn": PrepareModuleInput(input_layouts=(into, None), desired_input_layouts=(full, None)),
        "attn.q": ColwiseParallel(),  # heads split: each rank H/N heads
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(),  # partial outputs summed: one all-reduce
        "mlp": PrepareModuleInput(input_layouts=(into,), desired_input_layouts=(full,)),
        "mlp.fc1": ColwiseParallel(),  # hidden features split
        "mlp.fc2": RowwiseParallel(),  # one all-reduce
    }
    if sequence_parallel:
        plan.update({
            "": PrepareModuleInput(input_layouts=(full, None), desired_input_layouts=(seq, None)),
            "norm1": SequenceParallel(),
            "norm2": SequenceParallel(),
            "attn.o": RowwiseParallel(output_layouts=seq, use_local_output=False),
            "mlp.fc2": RowwiseParallel(output_layouts=seq, use_local_output=False),
        })  # fmt: skip
    return plan


def apply_dtensor_tp(model: Decoder, mesh, sequence_parallel: bool = False) -> Decoder:
    """parallelize_module every block over a 1-D ``mesh``; with sequence parallelism the
    final norm first gathers the sequence back (its input is Shard(1) from the last block)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

    check_tp_size(mesh.size(), heads=model.cfg.n_heads)
    check_tp_size(mesh.size(), hidden=model.cfg.hidden)
    for block in model.blocks:
        parallelize_module(block, mesh, block_plan(sequence_parallel))
    if sequence_parallel:
        gather = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
        parallelize_module(model, mesh, {"norm": gather})
    return model


def sync_partial_grads(model: nn.Module) -> int:
    """Reduce every Partial gradient to Replicate, one all-reduce each, and say how many.

    Under sequence parallelism a norm sees T/N tokens, so its weight gradient is a partial
    sum (a ``Partial`` DTensor). Left as it is, DTensor reduces it inside the optimizer step,
    again each time the optimizer reads it (AdamW: three times per parameter).
    """
    from torch.distributed.tensor import DTensor, Replicate

    n = 0
    for p in model.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(placements=[Replicate()] * g.device_mesh.ndim)
            n += 1
    return n


def local_grads(model: nn.Module) -> dict:
    """{name: this rank's gradient}: a sharded parameter's local shard; a Partial gradient
    (a sequence-parallel norm: each rank saw part of the sequence) summed over the ranks; a
    whole gradient of a sharded parameter (DTensor's embedding backward) sliced."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if isinstance(g, DTensor):  # in the parameter's layout: sum a Partial, slice a whole
            g = g.redistribute(p.device_mesh, p.placements).to_local()
        out[name.replace(".inner.", ".")] = g
    return out
