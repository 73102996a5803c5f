"""Data parallelism: gradient averaging by hand, torch DDP, buckets and overlap.

Every rank holds the whole model and a different slice of the batch. After the
backward pass each rank has the gradient of *its* mean loss; averaging those
gradients over ranks gives exactly the gradient of the mean loss over the whole
global batch (when the slices have equal size), so every replica takes the same
optimizer step and the replicas stay identical:

    rank r:  g_r = d/dw mean_{i in slice r} L(x_i, w)
    all:     g   = (1/N) sum_r g_r = d/dw mean_{i in global batch} L(x_i, w)

``average_gradients`` does this by hand, one all_reduce per parameter after
backward. ``torch.nn.parallel.DistributedDataParallel`` does the same with two
optimisations: it packs gradients into buckets (fewer, larger messages) and
starts a bucket's all_reduce as soon as its gradients are ready, while backward
is still computing the earlier layers (overlap); helpers.parallel.data.buckets makes both
visible.

All functions take the rank's ``helpers.dist.Dist`` (or a model) as an argument;
none reads the environment.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector

from helpers.devices import is_gpu
from helpers.dist import Dist, is_initialized

__all__ = [
    "broadcast_state",
    "average_gradients",
    "wrap",
    "flat_params",
    "flat_grads",
    "replica_spread",
    "sgd_steps",
    "unwrap",
    "save_checkpoint",
    "load_checkpoint",
    "epoch_orders",
]


# --------------------------------------------------------------------------- by hand


@torch.no_grad()
def broadcast_state(model: nn.Module, src: int = 0, group=None) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (in place).

    Replicas must start equal. Equal seeds usually give equal initial weights,
    but nothing checks it: another torch version, a different number of threads
    or a rank that drew one more random number breaks it silently. DDP broadcasts
    rank 0's state when it wraps a model; averaging by hand must do the same.
    Buffers (BatchNorm's running statistics) are copied too, but only here:
    gradient averaging never touches them afterwards.
    """
    for t in [*model.parameters(), *model.buffers()]:
        tdist.broadcast(t.data, src=src, group=group)


def average_gradients(model: nn.Module, world_size: int) -> None:
    """Replace every ``p.grad`` by its mean over the ranks (call after backward).

    One all_reduce(SUM) per parameter, then a division: the sum alone would make
    the step N times too large (a classic bug).
    """
    for p in model.parameters():
        if p.grad is not None:
            tdist.all_reduce(p.grad, op=tdist.ReduceOp.SUM)
            p.grad /= world_size


# --------------------------------------------------------------------------- torch DDP


def wrap(model: nn.Module, d: Dist, bucket_cap_mb: float | None = None, **kwargs) -> DDP:
    """``DistributedDataParallel`` on the rank's device, the same call for CPU and GPU.

    bucket_cap_mb: None keeps torch's default (25 MiB, with a smaller first bucket).
    DDP broadcasts rank 0's parameters and buffers at construction, so replicas
    start identical even if their initialisations differed. On a GPU (and the dry run's
    stand-in, where DDP takes the same path) ``device_ids`` names this rank's one device,
    as DDP asks of a single-device module; the CPU has no device index to give.
    """
    model = model.to(d.device)
    device_ids = [d.device.index] if is_gpu(d.device) else None
    if bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = bucket_cap_mb
    return DDP(model, device_ids=device_ids, **kwargs)


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one 1-D tensor (a copy, detached, on CPU)."""
    return parameters_to_vector(p.detach().cpu() for p in model.parameters())


def flat_grads(model: nn.Module) -> torch.Tensor:
    """All gradients as one 1-D tensor (zeros where a parameter has no grad)."""
    grads = (p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters())
    return parameters_to_vector(g.detach().cpu() for g in grads)


def replica_spread(model: nn.Module) -> float:
    """Largest |w_rank - w_rank0| over all parameters and ranks (0.0: replicas identical).

    Rank 0's parameters are broadcast, each rank compares, and a MAX all_reduce
    gives every rank the same answer.
    """
    mine = parameters_to_vector(p.detach() for p in model.parameters())
    ref = mine.clone()
    tdist.broadcast(ref, src=0)
    spread = (mine - ref).abs().max().reshape(1)
    tdist.all_reduce(spread, op=tdist.ReduceOp.MAX)
    return float(spread)


def sgd_steps(
    d: Dist,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    lr: float,
    mode: str,
) -> dict:
    """Train ``steps`` SGD steps on a fixed global batch (x, y) and report what happened.

    mode: "single"  one process, the whole batch (d may be a single-process Dist);
          "manual"  this rank's slice of the batch + ``average_gradients``;
          "ddp"     this rank's slice of the batch + DistributedDataParallel.
    Returns {"grads": gradient of the first step (1-D), "params": parameters after
    the last step (1-D)}; these must agree across the three modes.
    """
    if mode not in ("single", "manual", "ddp"):
        raise ValueError(f"unknown mode {mode!r}: use 'single', 'manual' or 'ddp'")
    if mode != "single":
        if x.shape[0] % d.world_size:
            raise ValueError(
                f"global batch {x.shape[0]} must split evenly over {d.world_size} ranks"
            )
        # Contiguous equal slices: rank r gets rows [r*B, (r+1)*B) of the global batch.
        x, y = x.chunk(d.world_size)[d.rank], y.chunk(d.world_size)[d.rank]
    if mode == "manual":
        broadcast_state(model)  # start from rank 0's weights, whatever each rank drew
    net = wrap(model, d) if mode == "ddp" else model
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    first_grads = None
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x.to(d.device)), y.to(d.device))
        loss.backward()  # DDP: gradients are averaged during this call
        if mode == "manual":
            average_gradients(net, d.world_size)
        if first_grads is None:
            first_grads = flat_grads(net)
        opt.step()
    return {"grads": first_grads, "params": flat_params(net)}


# --------------------------------------------------------------------------- checkpoints


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a DDP wrapper (its state_dict keys have no 'module.')."""
    return model.module if isinstance(model, DDP) else model


def save_checkpoint(path, model: nn.Module, d: Dist, optimizer=None, **extra) -> Path:
    """Rank 0 writes the checkpoint; every rank waits until the file is complete.

    All replicas are identical, so one copy is enough: N ranks writing the same
    file would race and waste I/O. The file is written to a temporary name and
    renamed, so a reader never sees half a checkpoint.
    """
    path = Path(path)
    if d.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"model": unwrap(model).state_dict(), **extra}
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
    if is_initialized():
        tdist.barrier()  # nobody loads before rank 0 has finished writing
    return path


def load_checkpoint(path, model: nn.Module, d: Dist, optimizer=None) -> dict:
    """Every rank loads the same file onto its own device (map_location)."""
    state = torch.load(path, map_location=d.device, weights_only=True)
    unwrap(model).load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    return state


# --------------------------------------------------------------------------- sampling


def epoch_orders(d: Dist, n: int, epochs: int, set_epoch: bool = True, seed: int = 0):
    """The sample indices this rank sees in each epoch, through the workbook's loader.

    Returns a list (one per epoch) of index lists. Without ``set_epoch`` the
    DistributedSampler reuses epoch 0's permutation every epoch.
    """
    from torch.utils.data import TensorDataset

    from helpers import data

    loader = data.make_loader(TensorDataset(torch.arange(n)), batch_size=n, d=d, seed=seed)
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            data.set_epoch(loader, epoch)
        orders.append([int(i) for (batch,) in loader for i in batch])
    return orders
