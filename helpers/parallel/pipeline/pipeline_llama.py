"""Llama 2 cut into pipeline stages, and what each stage costs.

    stage 0:  tok_embeddings, layers [0, b1)          tokens (B, S) -> h (B, S, dim)
    stage k:  layers [bk, bk+1)                       h -> h
    stage -1: layers [b_last, n), norm, output        h -> logits (B, S, vocab)

Every boundary carries one tensor h of B x S x dim numbers forward, and its gradient back:
the pipeline's whole traffic. The embedding is a lookup (parameters, almost no FLOPs); the
output layer is a dim x vocab matrix product on every token: with an even split of the
layers, the last stage is the slowest, and the first and the last hold the most parameters
(the first also holds 1F1B's most micro-batches in flight: its memory peaks). Megatron-LM
moves layers off the end stages for it (``--decoder-first-pipeline-num-layers``,
``--decoder-last-pipeline-num-layers``, ``--account-for-embedding-in-pipeline-split``,
``--account-for-loss-in-pipeline-split``);
``balanced_bounds`` cuts by FLOPs instead.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

from helpers.models import llama2

__all__ = ["LlamaStage", "even_bounds", "balanced_bounds", "stage_costs", "boundary_bytes",
           "layer_flops", "head_flops"]  # fmt: skip


class LlamaStage(nn.Module):
    """Layers [first, last) of a Llama 2 ``Transformer``, sharing its parameters.

    The first stage also embeds the tokens; the last also applies the final norm and the
    output layer. ``forward(tokens or h)`` returns h, or the logits on the last stage.
    """

    def __init__(self, model: llama2.Transformer, first: int, last: int):
        super().__init__()
        n = model.args.n_layers
        if not 0 <= first < last <= n:
            raise ValueError(
                f"a stage needs 0 <= first < last <= {n} layers, got [{first}, {last})"
            )
        self.first, self.last, self.args = first, last, model.args
        self.tok_embeddings = model.tok_embeddings if first == 0 else None
        self.layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in range(first, last)})
        self.norm = model.norm if last == n else None
        self.output = model.output if last == n else None
        self.register_buffer("rope", model.rope, persistent=False)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> LlamaStage:
        """Initialise a stage materialised with ``to_empty`` (built on the meta device, maybe
        sharded by FSDP): each rank draws its own shard of every matrix, normal(0, 0.02),
        from a generator seeded by the parameter's name; norms 1; the rotary table rebuilt."""
        for name, p in self.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("norm.weight"):
                local.fill_(1.0)
                continue
            g = torch.Generator(device="cpu").manual_seed(
                seed * 1_000_003 + zlib.crc32(name.encode())
            )
            local.copy_(torch.randn(local.shape, generator=g) * 0.02)
        args = self.args
        self.rope = llama2.rotary_tables(args.head_dim, args.max_seq_len, args.rope_theta).to(
            self.rope.device
        )
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        rope = self.rope[: h.shape[1]]  # positions of this sequence length
        for layer in self.layers.values():
            h = layer(h, rope)
        return self.output(self.norm(h)) if self.output is not None else h


def even_bounds(n_layers: int, n_stages: int) -> list[int]:
    """[0, b1, ..., n_layers]: as equal numbers of layers as possible (the usual split)."""
    if n_stages > n_layers:
        raise ValueError(f"{n_stages} stages for {n_layers} layers: use at most one per layer")
    return [round(i * n_layers / n_stages) for i in range(n_stages + 1)]


def layer_flops(args: llama2.ModelArgs, seq_len: int) -> float:
    """Forward FLOPs of one transformer block per token: 2 per weight + attention scores
    (q k^T and the weighted sum of v: 4 dim S, llama2.flops_per_token's convention)."""
    d, kv = args.dim, args.kv_heads * args.head_dim
    weights = 2 * d * d + 2 * d * kv + 3 * d * args.ffn_hidden
    return 2 * weights + 4 * d * seq_len


def head_flops(args: llama2.ModelArgs) -> float:
    """Forward FLOPs of the output layer per token (dim x vocab); the embedding: none."""
    return 2 * args.dim * args.vocab_size


def stage_costs(args: llama2.ModelArgs, bounds: list[int], seq_len: int) -> list[dict]:
    """Per stage: its layers, parameters and forward FLOPs per token, counted from shapes."""
    block = (llama2.param_count(args) - 2 * args.vocab_size * args.dim - args.dim) // args.n_layers
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        first, last = a == 0, b == args.n_layers
        params = (b - a) * block + first * args.vocab_size * args.dim
        params += last * (args.vocab_size * args.dim + args.dim)
        flops = (b - a) * layer_flops(args, seq_len) + last * head_flops(args)
        out.append({"layers": (a, b), "params": params, "flops": flops})
    return out


def balanced_bounds(args: llama2.ModelArgs, n_stages: int, seq_len: int) -> list[int]:
    """The contiguous split whose slowest stage has the fewest forward FLOPs (head counted).

    Dynamic programming over (layers used, stages used): exact, and instant for 80 layers.
    """
    n, layer, head = args.n_layers, layer_flops(args, seq_len), head_flops(args)
    if n_stages > n:
        raise ValueError(f"{n_stages} stages for {n} layers: use at most one per layer")
    best = {(0, 0): (0.0, [0])}  # (layers placed, stages) -> (slowest stage, bounds)
    for k in range(1, n_stages + 1):
        for used in range(k, n - (n_stages - k) + 1):
            options = []
            for prev in range(k - 1, used):
                if (prev, k - 1) in best:
                    cost = (used - prev) * layer + (head if used == n else 0.0)
                    worst, bounds = best[(prev, k - 1)]
                    options.append((max(worst, cost), bounds + [used]))
            if options:
                best[(used, k)] = min(options, key=lambda o: o[0])
    return best[(n, n_stages)][1]


def boundary_bytes(args: llama2.ModelArgs, micro_batch: int, seq_len: int, dtype_bytes: int) -> int:
    """Bytes one stage boundary carries per micro-batch in each direction: h, then its
    gradient, B x S x dim numbers each (no tensor or sequence parallelism)."""
    return micro_batch * seq_len * args.dim * dtype_bytes
