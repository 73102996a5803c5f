"""Data-parallel training of the workbook CNN: one program for a laptop and a cluster.

    python -m helpers.programs.train_ddp                               # 1 process
    torchrun --nproc-per-node 4 helpers/programs/train_ddp.py --epochs 3
    srun python helpers/programs/train_ddp.py                          # Slurm tasks

Each rank loads the same dataset, takes its own slice through a
DistributedSampler, and trains a replica of the model wrapped in
DistributedDataParallel (``--sync manual`` averages gradients by hand instead).
``--batch-size`` is per rank, so the global batch is batch_size * world_size;
the learning rate is scaled from the ``--base-batch`` it was tuned for with
``--lr-rule`` (none, linear, sqrt) and ramped up over ``--warmup-steps``.

Rank 0 writes the results with helpers.runs.write_metrics (throughput, loss
per step, test accuracy) and, with ``--checkpoint PATH``, saves the model.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as tdist
from torch import nn

from helpers import data, dist, models
from helpers.config import parse
from helpers.parallel import ddp
from helpers.runs import write_metrics
from helpers.training import lr as lr_rules
from helpers.training.loop import phase


@dataclass
class DDPConfig:
    """Data-parallel training of the workbook CNN (see the module docstring)."""

    # Every field is a command-line option: --batch-size 128 --lr-rule sqrt ...

    dataset: str = field(default="cifar10", metadata={"choices": data.DATASETS})
    offline: str = field(default="auto", metadata={"choices": ("auto", "true", "false")})
    data_root: str = ""
    n_train: int = 8192  # offline stand-in sizes (the real datasets are complete)
    n_test: int = 2000
    epochs: int = 2
    max_steps: int = 0  # > 0: stop each epoch after this many steps (benchmarks)
    batch_size: int = 64  # per rank
    base_batch: int = 64  # the global batch that --lr was tuned for
    lr: float = 0.05
    lr_rule: str = field(default="none", metadata={"choices": lr_rules.LR_RULES})
    warmup_steps: int = 0
    momentum: float = 0.9
    bucket_cap_mb: float = 0.0  # 0: torch's default (25 MiB)
    # ddp: DistributedDataParallel; manual: average_gradients after backward;
    # none: no averaging at all (replicas drift apart: the bug to recognise)
    sync: str = field(default="ddp", metadata={"choices": ("ddp", "manual", "none")})
    set_epoch: bool = True
    seed: int = 0
    checkpoint: str = ""  # rank 0 saves the final model here
    evaluate: bool = True
    verbose: bool = True


def _evaluate(model: nn.Module, test_ds, d: dist.Dist, batch_size: int = 500) -> float:
    """Test accuracy: each rank scores test samples rank, rank+W, ...; counts are summed.

    A strided split covers every sample exactly once (no padding, unlike a
    DistributedSampler with drop_last=False), so the accuracy is exact.
    """
    from torch.utils.data import DataLoader, Subset

    model.eval()
    mine = Subset(test_ds, range(d.rank, len(test_ds), d.world_size))
    correct = torch.zeros(2, dtype=torch.float64, device=d.device)  # (correct, total)
    with torch.no_grad():
        for x, y in DataLoader(mine, batch_size=batch_size):
            pred = model(x.to(d.device)).argmax(1)
            correct[0] += (pred == y.to(d.device)).sum()
            correct[1] += len(y)
    if dist.is_initialized():
        tdist.all_reduce(correct)
    model.train()
    return float(correct[0] / correct[1])


def train(d: dist.Dist, cfg: DDPConfig) -> dict:
    """Train on this rank and return the run's metrics (identical on every rank)."""
    dist.seed_all(cfg.seed)  # same seed on every rank: same data and same initial weights
    loader, test_ds, info = _data(d, cfg)
    model = models.create(info.name, num_classes=info.num_classes).to(d.device)
    distributed = dist.is_initialized()
    net = ddp.wrap(model, d, bucket_cap_mb=cfg.bucket_cap_mb or None) if (
        distributed and cfg.sync == "ddp") else model  # fmt: skip
    global_batch = cfg.batch_size * d.world_size
    peak_lr = lr_rules.scale_lr(cfg.lr, global_batch / cfg.base_batch, cfg.lr_rule)
    opt = torch.optim.SGD(net.parameters(), lr=peak_lr, momentum=cfg.momentum)
    sched = lr_rules.warmup_scheduler(opt, cfg.lr, peak_lr, cfg.warmup_steps)

    start = time.perf_counter()
    log = _train_epochs(
        d, cfg, loader, net, opt, sched, manual=distributed and cfg.sync == "manual"
    )
    wall = time.perf_counter() - start

    # One all_reduce for the whole loss curve instead of one per step.
    curve = torch.tensor(log["losses"], dtype=torch.float64, device=d.device)
    timing = torch.tensor([log["elapsed"]], dtype=torch.float64, device=d.device)
    if distributed:
        tdist.all_reduce(curve)
        curve /= d.world_size
        tdist.all_reduce(timing, op=tdist.ReduceOp.MAX)  # the slowest rank sets the pace
    if cfg.checkpoint:
        ddp.save_checkpoint(cfg.checkpoint, model, d, optimizer=opt, epoch=cfg.epochs)
    metrics = {
        "world_size": d.world_size,
        "threads": torch.get_num_threads(),
        "local_batch": cfg.batch_size,
        "global_batch": global_batch,
        "peak_lr": peak_lr,
        "lr": log["lrs"],
        "loss": curve.tolist(),
        "final_loss": float(curve[-5:].mean()),  # smoothed over the last steps
        "samples_per_s": global_batch * log["timed_steps"] / max(float(timing[0]), 1e-9),
        "steps": len(log["losses"]),
        # max |w_rank - w_rank0|: 0.0 when replicas agree
        "replica_spread": ddp.replica_spread(model) if distributed else 0.0,
        "wall_s": wall,
        "data": info.description,
        "config": asdict(cfg),
    }
    if cfg.evaluate:
        metrics["test_acc"] = _evaluate(model, test_ds, d)
        dist.print0(f"test accuracy {metrics['test_acc']:.3f}")
    return metrics


def _data(d: dist.Dist, cfg: DDPConfig):
    """This rank's loader (a DistributedSampler shard), the test set and the dataset info."""
    offline = {"auto": "auto", "true": True, "false": False}[cfg.offline]
    train_ds, test_ds, info = data.load(
        cfg.dataset, cfg.data_root or None, offline, n_train=cfg.n_train, n_test=cfg.n_test,
        seed=cfg.seed, verbose=cfg.verbose,
    )  # fmt: skip
    # drop_last: every rank gets the same number of full batches, so every step
    # averages over exactly batch_size * world_size samples.
    loader = data.make_loader(train_ds, cfg.batch_size, d, shuffle=True, seed=cfg.seed,
                              drop_last=True)  # fmt: skip
    if len(loader) == 0:
        raise ValueError(
            f"{len(train_ds)} training samples make no full batch of {cfg.batch_size} per rank "
            f"on {d.world_size} rank(s): lower --batch-size or raise --n-train"
        )
    return loader, test_ds, info


def _train_epochs(d, cfg, loader, net, opt, sched, manual: bool) -> dict:
    """The data-parallel loop; each phase is a named range for the profiler and nsys."""
    losses: list[float] = []  # this rank's loss per step; averaged over ranks at the end
    lrs: list[float] = []
    timed_steps, elapsed = 0, 0.0
    for epoch in range(cfg.epochs):
        if cfg.set_epoch:
            data.set_epoch(loader, epoch)  # a new permutation each epoch (same on all ranks)
        for step, (x, y) in enumerate(loader):
            if cfg.max_steps and step >= cfg.max_steps:
                break
            t = time.perf_counter()
            x, y = x.to(d.device), y.to(d.device)
            opt.zero_grad(set_to_none=True)
            with phase("forward"):
                loss = nn.functional.cross_entropy(net(x), y)
            with phase("backward"):
                loss.backward()  # DDP all-reduces gradient buckets during this call
            if manual:
                with phase("allreduce"):
                    ddp.average_gradients(net, d.world_size)
            lrs.append(opt.param_groups[0]["lr"])
            with phase("optimizer"):
                opt.step()
                sched.step()
            losses.append(loss.item())
            if len(losses) > 1:  # the first step pays one-off costs (allocation, DDP setup)
                elapsed += time.perf_counter() - t
                timed_steps += 1
        if cfg.verbose:
            dist.print0(f"epoch {epoch}: last loss {losses[-1]:.3f}, lr {lrs[-1]:.3g}")
    return {"losses": losses, "lrs": lrs, "elapsed": elapsed, "timed_steps": timed_steps}


def main(argv: list[str] | None = None) -> None:
    cfg = parse(DDPConfig, argv)
    with dist.session() as d:
        dist.print0(f"{d}; global batch {cfg.batch_size * d.world_size}")
        write_metrics(train(d, cfg))


if __name__ == "__main__":
    main()
