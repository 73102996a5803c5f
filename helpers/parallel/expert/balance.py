"""Balance, measured: short training runs of one MoE layer on a task with clusters.

The task: tokens drawn from C clusters in dim dimensions, each cluster with its own linear
map to learn (targets = x @ maps[c]): a layer whose experts specialise does well. One run
trains a router and E experts with Adam for ``steps`` steps on fresh batches and records, per
step, the task loss and each expert's load. ``balancing``: "none", "aux loss" (Switch,
coefficient ``alpha``), or "bias" (DeepSeek-V3's auxiliary-loss-free bias, rate ``rate``);
``factor``: a capacity factor (None: no capacity, nothing dropped), for the batch as one
source; ``route``: the router's keywords (``router_topk``: score, norm, scale).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from helpers.parallel.expert.capacity import capacity
from helpers.parallel.expert.moe import Experts, moe_serial
from helpers.parallel.expert.router import expert_counts, switch_aux_loss, update_bias

__all__ = ["RunResult", "Task", "train"]


@dataclass
class Task:
    """The clusters' centres and maps; batch() draws tokens and their targets."""

    dim: int = 16
    clusters: int = 8
    seed: int = 0
    spread: float = 1.0  # distance of the centres: the router's cue

    def __post_init__(self):
        g = torch.Generator().manual_seed(1000 + self.seed)
        self.centres = self.spread * torch.randn(self.clusters, self.dim, generator=g)
        self.maps = torch.randn(self.clusters, self.dim, self.dim, generator=g) / self.dim**0.5

    def batch(self, tokens: int, g: torch.Generator):
        c = torch.randint(self.clusters, (tokens,), generator=g)
        x = self.centres[c] + torch.randn(tokens, self.dim, generator=g)
        return x, torch.einsum("td,tde->te", x, self.maps[c])


@dataclass
class RunResult:
    """Per step: the task loss, the load of each expert (assignments), the dropped share."""

    loss: list = field(default_factory=list)
    load: list = field(default_factory=list)
    dropped: list = field(default_factory=list)

    def tail(self, name: str, last: int = 20) -> float:
        """The mean of a per-step series over the last steps."""
        values = getattr(self, name)[-last:]
        return sum(values) / len(values)

    def imbalance(self, last: int = 20) -> float:
        """The busiest expert's load over the mean load, averaged over the last steps."""
        ratios = [max(step) / (sum(step) / len(step)) for step in self.load[-last:]]
        return sum(ratios) / len(ratios)


def train(balancing: str = "none", n_experts: int = 8, k: int = 2, steps: int = 150,
          tokens: int = 256, seed: int = 0, factor: float | None = None, alpha: float = 0.05,
          rate: float = 0.01, lr: float = 0.01, init: float = 0.3, task: Task | None = None,
          route: dict | None = None) -> RunResult:  # fmt: skip
    """One short training run (see the module's docstring); returns its per-step record."""
    task = task or Task()
    g = torch.Generator().manual_seed(seed)
    router = (torch.randn(task.dim, n_experts, generator=g) * init).requires_grad_()
    experts = Experts(n_experts, task.dim, 2 * task.dim, generator=g)
    opt = torch.optim.Adam([router, *experts.parameters()], lr=lr)
    bias = torch.zeros(n_experts)
    cap = None if factor is None else capacity(tokens, k, n_experts, factor)
    result = RunResult()
    for _ in range(steps):
        x, y = task.batch(tokens, g)
        res = moe_serial(
            x, router, experts, k, cap, bias if balancing == "bias" else None, **(route or {})
        )
        loss = (res.out - y).square().mean()
        total = (
            loss + alpha * switch_aux_loss(res.routing, n_experts)
            if balancing == "aux loss"
            else loss
        )
        opt.zero_grad()
        total.backward()
        opt.step()
        counts = expert_counts(res.routing.experts, n_experts)
        if balancing == "bias":
            bias = update_bias(bias, counts, rate)
        result.loss.append(loss.item())
        result.load.append(counts.tolist())
        result.dropped.append(1 - res.kept.float().mean().item())
    return result
