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
from helpers.parallel.expert.router import expert_counts, router_topk, switch_aux_loss, update_bias

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

    def imbalance(self, last: int = 20, end: int | None = None) -> float:
        """What a step pays: each step's busiest expert over its mean load, averaged over the
        ``last`` steps up to step ``end`` (default: the run's last step)."""
        end = end or len(self.load)
        ratios = [max(step) / (sum(step) / len(step)) for step in self.load[end - last : end]]
        return sum(ratios) / len(ratios)

    def mean_load_imbalance(self, last: int = 20, end: int | None = None) -> float:
        """The router's lasting preference: the busiest expert over the mean of each expert's
        load averaged over the ``last`` steps up to ``end`` (the batches' noise averages out)."""
        end = end or len(self.load)
        window = self.load[end - last : end]
        mean = [sum(step[e] for step in window) / len(window) for e in range(len(window[0]))]
        return max(mean) / (sum(mean) / len(mean))

    def swing(self, last: int = 40, end: int | None = None) -> float:
        """How much each expert's load changes from one step to the next (assignments, the mean
        over the experts and the ``last`` steps up to ``end``): one batch's chance alone, or a
        balancing that moves the load around."""
        end = end or len(self.load)
        window = self.load[end - last : end]
        pairs = zip(window[:-1], window[1:], strict=True)
        changes = [abs(b - a) for s, t in pairs for a, b in zip(s, t, strict=True)]
        return sum(changes) / len(changes)


def train(balancing: str = "none", n_experts: int = 8, k: int = 2, steps: int = 150,
          tokens: int = 256, seed: int = 0, factor: float | None = None, alpha: float = 0.05,
          rate: float = 0.01, lr: float = 0.01, init: float = 0.3, task: Task | None = None,
          route: dict | None = None, update=update_bias, probe: int = 0) -> RunResult:  # fmt: skip
    """One short training run (see the module's docstring); returns its per-step record.
    ``update(bias, counts, rate)``: the bias's rule after each step (DeepSeek-V3's sign step by
    default); ``probe``: the rule reads the counts of a separate batch of this many tokens,
    routed by the same router (a larger batch's, less noisy counts), not the training batch's."""
    task = task or Task()
    g = torch.Generator().manual_seed(seed)
    router = (torch.randn(task.dim, n_experts, generator=g) * init).requires_grad_()
    experts = Experts(n_experts, task.dim, 2 * task.dim, generator=g)
    opt = torch.optim.Adam([router, *experts.parameters()], lr=lr)
    bias = torch.zeros(n_experts)
    cap = None if factor is None else capacity(tokens, k, n_experts, factor)
    result = RunResult()
    g_probe = torch.Generator().manual_seed(10_000 + seed)
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
        result.loss.append(loss.item())
        result.load.append(counts.tolist())
        if balancing == "bias" and probe:
            with torch.no_grad():
                routed = router_topk(
                    task.batch(probe, g_probe)[0] @ router, k, bias, **(route or {})
                )
                counts = expert_counts(routed.experts, n_experts)
        if balancing == "bias":
            bias = update(bias, counts, rate)
        result.dropped.append(1 - res.kept.float().mean().item())
    return result
