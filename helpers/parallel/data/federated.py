"""Federated averaging (FedAvg, seed 002): one client per rank, local epochs, weighted averaging.

In federated learning the data stays where it was collected (a phone, a
hospital). Each round the server sends the current model to the clients; each
client trains it on its own data for a few local epochs; the clients send their
weights back and the server replaces the model by their average, weighted by how
many samples each client holds (McMahan et al., 2017)::

    w  <-  sum_k n_k * w_k / sum_k n_k

Here every rank is one client and the "server" is two all-reduces: one of the
sample counts (8 bytes), so that every rank knows n, then, after each rank has
scaled its flattened weights by n_k / n, one of that vector, which leaves the
weighted average on every rank. One round therefore sends the bytes of one DDP
gradient all-reduce of the same model, plus 8, which is how the notebook compares
the two "at equal communication" (model-sized all-reduces; the count is counted apart). Floating-point buffers
(BatchNorm's running mean and variance) are averaged with the weights: averaging
gradients never touches them, averaging models must (FedBN keeps them local on
purpose, for clients whose features differ).

The same periodic averaging runs on clusters as *local SGD*: ``ddp_curve`` with
``period > 1`` is post-local SGD with torch's ``PostLocalSGDOptimizer`` (DDP for
``warmup`` steps, then local steps with the models averaged every ``period``).

Client data is split two ways (``split_clients``):
    "iid":        a random shuffle cut into pieces: every client sees every class;
    "label_skew": class c goes to client c % K only, so each client sees 2-3 of
                  the 10 classes (non-IID). Both schemes give clients the same
                  sample counts, and the counts differ between clients, so the
                  weighting matters.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from helpers.dist import Dist

__all__ = [
    "SCHEMES",
    "split_clients",
    "weighted_average",
    "local_train",
    "accuracy",
    "fedavg",
    "ddp_curve",
]

SCHEMES = ("iid", "label_skew")


def split_clients(labels: torch.Tensor, n_clients: int, scheme: str = "iid", seed: int = 0):
    """Sample indices of each client: a list of ``n_clients`` 1-D index tensors.

    label_skew: every sample of class c goes to client c % n_clients.
    iid: a seeded shuffle cut into pieces of the same sizes as label_skew's,
    so the two schemes differ only in which labels a client sees.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: use one of {SCHEMES}")
    classes = int(labels.max()) + 1
    if not 1 <= n_clients <= classes:
        raise ValueError(f"need 1 <= n_clients <= {classes} (one class at least per client)")
    skew = [torch.nonzero((labels % n_clients) == k).flatten() for k in range(n_clients)]
    if scheme == "label_skew":
        return skew
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    return list(torch.split(perm, [len(s) for s in skew]))


def weighted_average(d: Dist, model: nn.Module, n_samples: int) -> int:
    """Replace the model's weights (and float buffers) by their sample-weighted average over ranks.

    Two all-reduces (the server's job): first the sample count, one float64 (8 bytes), so
    that every rank knows n = sum_k n_k; then the flattened weights scaled by n_k / n, the
    bytes of one DDP gradient all-reduce. Returns sum_k n_k.
    """
    state = [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]
    flat = parameters_to_vector(state)  # (P,) a copy of this client's weights and statistics
    # the count travels on the weights' device: NCCL takes GPU tensors only
    total = torch.tensor([float(n_samples)], dtype=torch.float64, device=flat.device)
    tdist.all_reduce(total)  # sum_k n_k, known to every rank
    flat.mul_(n_samples / total.item())  # n_k / n * w_k
    tdist.all_reduce(flat)  # sum_k n_k / n * w_k on every rank
    with torch.no_grad():
        vector_to_parameters(flat, state)
    return int(total.item())


def local_train(model, x, y, epochs: int, lr: float, batch: int, gen: torch.Generator) -> None:
    """Plain minibatch SGD on this client's (x, y) for ``epochs`` passes; no communication."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=gen).split(batch):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of (x, y) classified correctly."""
    model.eval()
    return (model(x).argmax(1) == y).float().mean().item()


def fedavg(
    d: Dist,
    make_model,
    x,
    y,
    parts,
    x_test,
    y_test,
    *,
    rounds: int,
    local_epochs: int,
    lr: float,
    batch: int,
    seed: int = 0,
) -> list[dict]:
    """FedAvg with client ``d.rank`` holding samples ``parts[d.rank]`` of (x, y).

    x: (n, C, H, W) all training samples, y: (n,) labels; parts: one index tensor
    per rank (``split_clients``); a client only ever touches its own indices.
    Returns one row per round: dict(round, allreduces, acc) with the test
    accuracy of the averaged model (the same on every rank).
    """
    if len(parts) != d.world_size:
        raise ValueError(f"{len(parts)} client splits for {d.world_size} ranks: need one per rank")
    torch.manual_seed(seed)  # the same initial model on every client (the server's)
    model = make_model()
    mine = parts[d.rank]
    gen = torch.Generator().manual_seed(seed * 1000 + d.rank)  # this client's shuffles
    rows = []
    for r in range(1, rounds + 1):
        local_train(model, x[mine], y[mine], local_epochs, lr, batch, gen)
        weighted_average(d, model, len(mine))
        rows.append(dict(round=r, allreduces=r, acc=accuracy(model, x_test, y_test)))
    return rows


def ddp_curve(
    d: Dist,
    make_model,
    x,
    y,
    parts,
    x_test,
    y_test,
    *,
    steps: int,
    lr: float,
    batch: int,
    eval_at: list[int],
    seed: int = 0,
    period: int = 1,
    warmup: int = 0,
) -> list[dict]:
    """Data-parallel SGD (torch DDP) on the same clients: one gradient all-reduce per step.

    Each rank draws batches of ``batch`` from its own part, cycling through
    reshuffles, so every rank runs the same number of steps (no rank waits in
    an all-reduce the others never reach). Returns dict(step, allreduces, acc) at
    the steps listed in ``eval_at``; ``allreduces`` counts model-sized all-reduces.

    period > 1: post-local SGD (Lin et al. 2020) with torch's own pieces: DDP's
    ``post_localSGD_hook`` all-reduces gradients for the first ``warmup`` steps
    and then none, and ``PostLocalSGDOptimizer`` averages the models every
    ``period`` steps after them (plain mean, not weighted by sample counts).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    net = DDP(make_model())
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    if period > 1:
        opt = _post_local_sgd(net, opt, period, warmup)
    mine = parts[d.rank]
    gen = torch.Generator().manual_seed(seed * 1000 + d.rank)
    order = torch.empty(0, dtype=torch.long)
    rows, want, sent = [], set(eval_at), 0
    for step in range(1, steps + 1):
        if len(order) < batch:  # a fresh shuffle of this rank's part
            order = torch.cat([order, mine[torch.randperm(len(mine), generator=gen)]])
        idx, order = order[:batch], order[batch:]
        net.train()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x[idx]), y[idx]).backward()  # DDP all-reduces the gradients here
        opt.step()  # post-local SGD: and averages the models every `period` steps
        if period == 1 or step <= warmup:
            sent += 1  # this step's gradient all-reduce
        elif (step - 1 - warmup) % period == 0:
            sent += 1  # PeriodicModelAverager: one all-reduce of the flattened model
        if step in want:
            rows.append(dict(step=step, allreduces=sent, acc=accuracy(net.module, x_test, y_test)))
    return rows


def _post_local_sgd(net, opt, period: int, warmup: int):
    """torch's post-local SGD: global gradient all-reduces for ``warmup`` steps, then local steps."""
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState,
        post_localSGD_hook,
    )
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    # post_local_gradient_allreduce=False: after the warm-up no gradient is sent at all
    state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=warmup,
                              post_local_gradient_allreduce=False)  # fmt: skip
    net.register_comm_hook(state, post_localSGD_hook)
    return PostLocalSGDOptimizer(opt, PeriodicModelAverager(period=period, warmup_steps=warmup))
