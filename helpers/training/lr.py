"""Learning-rate rules for a larger global batch, and warm-up.

Growing the global batch by a factor k changes the optimisation, so the learning
rate usually grows with it (NERSC, "Deep Learning at Scale"):

    linear rule       lr -> k * lr
    square-root rule  lr -> sqrt(k) * lr

and a large learning rate is unstable in the first steps, hence a warm-up that
ramps from the base rate to the scaled one. The warm-up itself is torch's
``LinearLR`` scheduler (``warmup_scheduler``); ``warmup_lr`` is the same ramp as
plain arithmetic, for tables and tests.
"""

from __future__ import annotations

import math

import torch

__all__ = ["LR_RULES", "scale_lr", "warmup_lr", "warmup_scheduler"]

LR_RULES = ("none", "linear", "sqrt")


def scale_lr(base_lr: float, k: float, rule: str = "linear") -> float:
    """The learning rate for a global batch ``k`` times the one ``base_lr`` was tuned for.

    k: global batch / base batch. With a fixed local batch on N ranks, k = N.
    rule: "none" (keep base_lr), "linear" (k * lr) or "sqrt" (sqrt(k) * lr).
    """
    if k <= 0:
        raise ValueError(f"batch ratio k must be > 0, got {k}")
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * k
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    raise ValueError(f"unknown learning-rate rule {rule!r}: use one of {', '.join(LR_RULES)}")


def warmup_lr(step: int, base_lr: float, peak_lr: float, warmup_steps: int) -> float:
    """Learning rate at ``step`` (0-based) of a linear warm-up from base_lr to peak_lr.

    Step 0 uses base_lr, step ``warmup_steps`` and later use peak_lr; in between the
    rate grows linearly. warmup_steps=0 means no warm-up (peak_lr from the start).
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps == 0 or step >= warmup_steps:
        return peak_lr
    return base_lr + (peak_lr - base_lr) * step / warmup_steps


def warmup_scheduler(
    optimizer: torch.optim.Optimizer, base_lr: float, peak_lr: float, warmup_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """torch's ``LinearLR`` ramping an optimizer whose lr is ``peak_lr`` up from ``base_lr``.

        opt = SGD(params, lr=peak_lr)
        sched = warmup_scheduler(opt, base_lr, peak_lr, warmup_steps)
        ... opt.step(); sched.step()   # once per optimizer step

    Step s < warmup_steps uses base_lr + (peak_lr - base_lr) * s / warmup_steps
    (``warmup_lr``); from ``warmup_steps`` on, peak_lr. A peak not above the base
    rate needs no warm-up: the rate stays at peak_lr.
    """
    if peak_lr <= 0 or base_lr <= 0:
        raise ValueError(f"learning rates must be > 0, got base {base_lr}, peak {peak_lr}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    # No warm-up (0 steps, or a scaled rate that is not larger than the base rate):
    # a constant factor 1. total_iters=0 would divide by zero inside LinearLR.
    start = base_lr / peak_lr if warmup_steps and base_lr < peak_lr else 1.0
    return torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=start, end_factor=1.0, total_iters=max(1, warmup_steps)
    )
