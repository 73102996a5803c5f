"""Gradient compression as DDP communication hooks: what they send, and what they change.

A communication hook replaces what DDP does with a bucket (``net.register_comm_hook``):

* ``allreduce_hook``: the default, the bucket all-reduced in fp32 and divided by N;
* ``bf16_compress_hook``: the bucket cast to bfloat16, all-reduced, cast back: half the bytes,
  and each average rounded to bf16's 8 significant bits;
* ``powerSGD_hook`` (Vogels et al., NeurIPS 2019): each gradient matrix M (n x m, a
  convolution's kernel flattened to out x in*k*k) is replaced by a rank-r product P Q^T,
  found with one step of power iteration: all-reduce P = M Q (n x r), orthogonalise it,
  all-reduce Q = M^T P (m x r). It sends (n + m) r numbers instead of n m. What the
  approximation leaves out is kept on each rank (**error feedback**) and added to the next
  step's gradient, so nothing is lost for good, only delayed. Vectors (biases) and matrices
  that compression would not shrink at least 2x go uncompressed, in one all-reduce.

``measure`` counts the bytes each hook hands to ``all_reduce`` (every hook above calls
``torch.distributed.all_reduce``) and compares each step's averaged gradient with the exact
average, computed on the side from the same local gradients.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist import Dist

__all__ = ["HOOKS", "measure", "powersgd_bytes"]

HOOKS = ("fp32 all-reduce", "bf16", "PowerSGD rank 1", "PowerSGD rank 4")
START_ITER = 2  # PowerSGD sends plain all-reduces for this many steps first (a warm-up)


def _register(net: DDP, hook: str) -> None:
    if hook == "fp32 all-reduce":
        net.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "bf16":
        net.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook.startswith("PowerSGD rank "):
        state = powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(hook.rsplit(" ", 1)[1]),
            start_powerSGD_iter=START_ITER, use_error_feedback=True, warm_start=True,
        )  # fmt: skip
        net.register_comm_hook(state, powersgd.powerSGD_hook)
    else:
        raise ValueError(f"unknown hook {hook!r}: one of {HOOKS}")


def powersgd_bytes(model: nn.Module, rank: int, min_rate: float = 2.0) -> int:
    """Bytes one PowerSGD step all-reduces for ``model`` (fp32): P and Q per compressed matrix,
    and every tensor that stays uncompressed (vectors, matrices shrunk less than ``min_rate``)."""
    values = 0
    for p in model.parameters():
        if p.dim() < 2:
            values += p.numel()
            continue
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, rank)
        compressed = (n + m) * r
        values += compressed if n * m >= min_rate * compressed else n * m
    return 4 * values


def _flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def measure(d: Dist, make_model, x: torch.Tensor, y: torch.Tensor, hook: str, steps: int) -> dict:
    """``steps`` backward passes through DDP with ``hook`` (weights fixed, a new batch each).

    Returns {"bytes": bytes all-reduced per step, "error": |avg - exact| / |exact| per step,
    "sum_error": the same for the sum of all steps' averages, "seconds": median backward}.
    """
    torch.manual_seed(0)
    net = DDP(make_model())
    _register(net, hook)
    sent, real = [], tdist.all_reduce

    def counting(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)

    xs, ys = x.chunk(d.world_size)[d.rank], y.chunk(d.world_size)[d.rank]
    per = len(xs) // steps
    out = {"bytes": [], "error": [], "seconds": []}
    total, exact_total = 0.0, 0.0
    tdist.all_reduce = counting  # this rank's process only: spawn's ranks end after the call
    try:
        for s in range(steps):
            xb, yb = xs[s * per : (s + 1) * per], ys[s * per : (s + 1) * per]
            net.zero_grad()
            with net.no_sync():  # this rank's own gradient, for the exact average on the side
                nn.functional.cross_entropy(net(xb), yb).backward()
            exact = _flat_grads(net.module)
            real(exact)
            exact /= d.world_size
            net.zero_grad()
            sent.clear()
            start = time.perf_counter()
            nn.functional.cross_entropy(net(xb), yb).backward()  # the hook averages here
            out["seconds"].append(time.perf_counter() - start)
            got = _flat_grads(net.module)
            out["bytes"].append(sum(sent))
            out["error"].append(float((got - exact).norm() / exact.norm()))
            total, exact_total = total + got, exact_total + exact
    finally:
        tdist.all_reduce = real
    out["sum_error"] = float((total - exact_total).norm() / exact_total.norm())
    out["seconds"] = sorted(out["seconds"])[len(out["seconds"]) // 2]
    return out
