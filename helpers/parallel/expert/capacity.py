"""Capacity as GShard, Switch and Megatron-Core apply it: per source, before anything is sent.

Each source (an EP rank's own tokens: GShard's and Switch's "group") gives each expert at most
C = ceil(c T k / E) of its T k assignments, T its own tokens; the others are dropped on the
sending rank, so they never cross the network (the residual connection carries the token on).
Which assignments an expert keeps when it is over capacity, the drop policy:

    "position"  token order: the batch's first tokens win (Megatron-Core's "position")
    "choice"    every token's first choice before any second choice, then token order
                (GShard, Switch's top-2 variant)
    "probs"     the highest gates win (Megatron-Core's default, "probs")

``keep_mask`` decides; ``helpers.parallel.expert.dispatch.dispatch(kept=...)`` sends only the
kept rows (uneven split sizes, as dropless), and ``helpers.parallel.expert.padded`` sends exactly
C rows per expert, padded: static shapes, no count exchange, no split sizes to read.
"""

from __future__ import annotations

import math

import torch

from helpers.parallel.expert.router import Routing, expert_counts

__all__ = ["POLICIES", "capacity", "keep_mask", "slot_in_expert"]

POLICIES = ("position", "choice", "probs")


def capacity(tokens: int, k: int, n_experts: int, factor: float) -> int:
    """Switch Transformer's expert capacity: factor x the balanced share, tokens k / E, where
    ``tokens`` are one source's (a group's) tokens."""
    return math.ceil(factor * tokens * k / n_experts)


def _priority(routing: Routing, policy: str) -> torch.Tensor:
    """The assignments t k + s in the order the policy serves them."""
    tokens, k = routing.experts.shape
    flat = torch.arange(tokens * k, device=routing.experts.device)
    if policy == "position":
        return flat
    if policy == "choice":  # slot-major: every first choice, then every second one
        return flat.view(tokens, k).t().reshape(-1)
    if policy == "probs":
        return torch.argsort(-routing.weights.detach().reshape(-1), stable=True)
    raise ValueError(f"policy={policy!r}: use one of {POLICIES}")


def slot_in_expert(routing: Routing, n_experts: int, policy: str = "position") -> torch.Tensor:
    """[T, k]: each assignment's place in its expert's queue (0 = served first), by the policy."""
    order = _priority(routing, policy)
    flat_experts = routing.experts.reshape(-1)
    by_expert = order[torch.argsort(flat_experts[order], stable=True)]  # by expert, then priority
    counts = expert_counts(routing.experts, n_experts)
    starts = torch.cumsum(counts, 0) - counts
    place = torch.arange(len(by_expert), device=order.device) - starts[flat_experts[by_expert]]
    return torch.empty_like(flat_experts).scatter_(0, by_expert, place).view_as(routing.experts)


def keep_mask(routing: Routing, n_experts: int, cap: int | None, policy: str = "position",
              sizes: list[int] | None = None) -> torch.Tensor:  # fmt: skip
    """[T, k] bool: True for the assignments an expert keeps. cap: per source and expert (None:
    keep all). sizes: the tokens of each source, in order (None: all T are one source), as the
    serial twin of N ranks has them: each source's capacity is its own."""
    tokens = routing.experts.shape[0]
    if cap is None:
        return torch.ones_like(routing.experts, dtype=torch.bool)
    sizes = [tokens] if sizes is None else list(sizes)
    if sum(sizes) != tokens:
        raise ValueError(f"sizes {sizes} add up to {sum(sizes)}, not the {tokens} tokens")
    parts, start = [], 0
    for n in sizes:
        mine = Routing(*(t[start : start + n] for t in (routing.experts, routing.weights,
                                                          routing.probs)))  # fmt: skip
        parts.append(slot_in_expert(mine, n_experts, policy) < cap)
        start += n
    return torch.cat(parts)
