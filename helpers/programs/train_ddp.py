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

Preemption-safe: with ``--ckpt-dir DIR`` the program checkpoints every
``--ckpt-every`` steps (helpers.parallel.sharded.checkpoint), resumes by itself from the
newest checkpoint in DIR (with the same number of ranks: the data position is saved
in batches per rank), and on SIGUSR1 or SIGTERM (Slurm's warning, a requeue,
torchrun stopping its ranks) checkpoints at the next log point and exits 0 without
writing metrics.

The loop never waits for the device inside a step: each step's loss stays on the device
and comes to the host every ``--log-every`` steps, in one copy (helpers.training.step_log),
where the clock is read and the ranks agree on a stop (``loss.item()`` every step would
make the host wait for the GPU every step). With ``--deterministic true`` a resumed run ends with the same
parameters, bit for bit, as an uninterrupted one (same world size and threads).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import time
from dataclasses import asdict

import torch
import torch.distributed as tdist
from torch import nn

from helpers import data, devices, dist, models
from helpers.config import parse
from helpers.parallel.data import ddp
from helpers.parallel.sharded import checkpoint, fsdp
from helpers.programs.ddp_config import DDPConfig
from helpers.runs import write_metrics
from helpers.training import lr as lr_rules
from helpers.training.loop import autocast, evaluate, phase
from helpers.training.resume import NoPreemption, Preemption
from helpers.training.step_log import StepLog

__all__ = ["DDPConfig", "deterministic", "train", "main"]


def _evaluate(model: nn.Module, test_ds, d: dist.Dist, batch_size: int = 500) -> float:
    """Test accuracy: rank r scores samples r, r+W, ... (each once: no sampler padding)."""
    from torch.utils.data import DataLoader, Subset

    mine = Subset(test_ds, range(d.rank, len(test_ds), d.world_size))
    return evaluate(model, DataLoader(mine, batch_size=batch_size), d.device)["accuracy"]


def train(d: dist.Dist, cfg: DDPConfig) -> dict:
    """Train on this rank and return the run's metrics (identical on every rank).

    With cfg.ckpt_dir, a run stopped by a signal returns {"preempted": True, ...}.
    """
    if cfg.deterministic:
        deterministic()
    dist.seed_all(cfg.seed)  # same seed on every rank: the same data order
    loader, test_ds, info = _data(d, cfg)
    model = models.create(info.name, num_classes=info.num_classes).to(d.device)
    distributed = dist.is_initialized()
    net = _wrap(model, d, cfg, distributed)
    global_batch = cfg.batch_size * d.world_size
    peak_lr = lr_rules.scale_lr(cfg.lr, global_batch / cfg.base_batch, cfg.lr_rule)
    opt = torch.optim.SGD(net.parameters(), lr=peak_lr, momentum=cfg.momentum)
    sched = lr_rules.warmup_scheduler(opt, cfg.lr, peak_lr, cfg.warmup_steps)

    resumed = _resume(d, cfg, net, opt, sched)
    start = time.perf_counter()
    manual = distributed and cfg.sync == "manual"
    with Preemption() if cfg.ckpt_dir else NoPreemption() as stop:
        log = _train_epochs(d, cfg, loader, net, opt, sched, manual, resumed, stop)
    wall = time.perf_counter() - start
    if log["preempted"]:
        return {"preempted": True, "step": log["step"], "signal": stop.received}

    curve = torch.tensor(log["losses"], dtype=torch.float64, device=d.device)
    timing = torch.tensor([log["elapsed"]], dtype=torch.float64, device=d.device)
    if distributed:
        tdist.all_reduce(curve)  # one all_reduce for the whole loss curve, not one per step
        curve /= d.world_size
        tdist.all_reduce(timing, op=tdist.ReduceOp.MAX)  # the slowest rank sets the pace
    replicas = distributed and cfg.sync != "fsdp"
    flat = fsdp.full_params(model) if cfg.sync == "fsdp" else ddp.flat_params(model)
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
        "host_syncs": log["host_syncs"],  # times the loop waited for the device: ~steps / log_every
        # max |w_rank - w_rank0|: 0.0 when replicas agree (FSDP has one sharded copy)
        "replica_spread": ddp.replica_spread(model) if replicas else 0.0,
        # Bit-level fingerprint of the final weights: equal digests = identical runs.
        "params_sha256": hashlib.sha256(flat.detach().cpu().numpy().tobytes()).hexdigest(),
        "resumed_at": log["resumed_at"],  # steps this run resumed after (empty: never stopped)
        "wall_s": wall,
        "data": info.description,
        "config": asdict(cfg),
    }
    if cfg.evaluate:
        metrics["test_acc"] = _evaluate(model, test_ds, d)
        if cfg.verbose:  # a study of many runs labels its own results
            dist.print0(f"test accuracy {metrics['test_acc']:.3f}")
    return metrics


def deterministic() -> None:
    """``torch.use_deterministic_algorithms(True)``, in a way a GPU accepts.

    cuBLAS multiplies matrices deterministically only in a fixed workspace, which
    ``$CUBLAS_WORKSPACE_CONFIG`` sets (":4096:8": 8 buffers of 4 MiB); without it torch
    refuses the first Linear layer on a GPU. The workspace is sized once, at the first
    cuBLAS call, so main() sets it before it joins the job (where CUDA starts); train()
    calls this again for callers that start it themselves (a value already set is kept).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def _wrap(model: nn.Module, d: dist.Dist, cfg: DDPConfig, distributed: bool) -> nn.Module:
    """The model as the loop trains it: DDP, FSDP2-sharded, or as it is (manual, none)."""
    if cfg.sync == "fsdp":
        if cfg.checkpoint:
            raise ValueError("--checkpoint saves a replicated model: with --sync fsdp use "
                             "--ckpt-dir (sharded checkpoints written by every rank)")  # fmt: skip
        from torch.distributed.device_mesh import init_device_mesh

        # One mesh dimension over all ranks: every layer sharded on dim 0 across them.
        mesh = init_device_mesh(d.device.type, (d.world_size,))
        return fsdp.apply_fsdp(model, mesh)
    if distributed and cfg.sync == "ddp":  # DDP broadcasts rank 0's weights when it wraps
        return ddp.wrap(model, d, bucket_cap_mb=cfg.bucket_cap_mb or None)
    if distributed:  # by hand: copy rank 0's weights and buffers, whatever each rank drew
        ddp.broadcast_state(model)
    return model


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
            f"{len(train_ds)} training samples make no full batch of {cfg.batch_size} "
            f"per rank on {d.world_size} rank(s): lower --batch-size or raise --n-train"
        )
    return loader, test_ds, info


def _resume(d: dist.Dist, cfg: DDPConfig, net, opt, sched) -> checkpoint.Checkpoint | None:
    """Load the newest checkpoint in cfg.ckpt_dir, if there is one (every rank calls it)."""
    last = checkpoint.latest(cfg.ckpt_dir) if cfg.ckpt_dir else None
    if last is None:
        return None
    saved = json.loads((last / "meta.json").read_text())["world_size"]
    if (
        saved != d.world_size
    ):  # offsets count this rank's batches: they mean nothing at another size
        raise ValueError(f"{last} was written by {saved} rank(s) and this run has {d.world_size}: "
                         f"resume with {saved} rank(s), or start a new --ckpt-dir")  # fmt: skip
    ckpt = checkpoint.load(last, net, opt, d)
    sched.load_state_dict(ckpt.extra["scheduler"])
    dist.print0(f"resuming from {last} (step {ckpt.step})")
    return ckpt


def _save(d, cfg, net, opt, sched, log: dict, steps: StepLog, position: dict) -> None:
    steps.flush()  # the losses so far are part of the checkpoint
    checkpoint.save(
        cfg.ckpt_dir, log["step"], net, opt, d, data=position, keep=cfg.keep,
        extra={"scheduler": sched.state_dict()},
        rank_state={"losses": steps.losses, "lrs": log["lrs"], "resumed_at": log["resumed_at"]},
    )  # fmt: skip
    steps.restart_clock()  # a save is not a step: not timed


def _batches(loader, cfg, epoch: int, ckpt, first: bool):
    """This epoch's batches from where the run stands, and the sampler state to save.

    Resuming: the same order (sampler epoch or generator state), the batches done
    skipped, then the RNG states put back (creating the iterator drew numbers).
    """
    resuming = first and ckpt is not None
    gen_state = ckpt.data.get("generator") if resuming else None
    gen_state = checkpoint.start_epoch(loader, epoch if cfg.set_epoch else 0, gen_state)
    offset = ckpt.data["offset"] if resuming else 0
    batches = itertools.islice(iter(loader), offset, None)
    if resuming:
        checkpoint.set_rng_state(ckpt.rng)
    return batches, offset, gen_state


def _train_epochs(d, cfg, loader, net, opt, sched, manual: bool, ckpt, stop) -> dict:
    """The data-parallel loop; each phase is a named range for the profiler and nsys.

    The host waits for the device only every ``cfg.log_every`` steps (and at a checkpoint):
    there the losses come to the host, the clock is read and the ranks agree on a stop.
    """
    # This rank's loss per step (averaged over ranks at the end), restored on resume.
    log = {"lrs": [], "resumed_at": [], "step": 0, "preempted": False}
    if ckpt is not None:
        log.update(ckpt.rank_state, step=ckpt.step)
        log["resumed_at"] = [*log["resumed_at"], ckpt.step]
    steps = StepLog(cfg.log_every, log.pop("losses", []))
    first_epoch = ckpt.data["epoch"] if ckpt is not None else 0
    for epoch in range(first_epoch, cfg.epochs):
        batches, offset, gen_state = _batches(loader, cfg, epoch, ckpt, epoch == first_epoch)
        for i, (x, y) in enumerate(batches, start=offset):
            if cfg.max_steps and i >= cfg.max_steps:
                break
            x, y = x.to(d.device), y.to(d.device)
            opt.zero_grad(set_to_none=True)
            with phase("forward"), autocast(d.device, _amp(d, cfg)):
                loss = nn.functional.cross_entropy(net(x), y)
            with phase("backward"):
                loss.backward()  # DDP all-reduces gradient buckets during this call
            if manual:
                with phase("allreduce"):
                    ddp.average_gradients(net, d.world_size)
            log["lrs"].append(opt.param_groups[0]["lr"])
            with phase("optimizer"):
                opt.step()
                sched.step()
            steps.record(loss)  # stays on the device: no wait here
            log["step"] += 1
            _inject_faults(d, cfg, log["step"], resumed=ckpt is not None)
            position = {"epoch": epoch, "offset": i + 1, "generator": gen_state}
            saving = cfg.ckpt_dir and cfg.ckpt_every and log["step"] % cfg.ckpt_every == 0
            if not (steps.due() or saving):
                continue
            steps.flush()  # the host waits for the device here, every log_every steps
            if steps.due() and stop.requested(d):  # every rank agrees, so all save one step
                _save(d, cfg, net, opt, sched, log, steps, position)
                dist.print0(f"stopped by {stop.received} after step {log['step']}: "
                            f"checkpoint in {cfg.ckpt_dir}, exiting to be requeued")  # fmt: skip
                return {**log, "losses": steps.losses, "preempted": True}
            if saving:
                _save(d, cfg, net, opt, sched, log, steps, position)
        steps.flush()
        if cfg.verbose and steps.losses:
            dist.print0(f"epoch {epoch}: last loss {steps.losses[-1]:.3f}, lr {log['lrs'][-1]:.3g}")
    saved = cfg.ckpt_every and log["step"] % cfg.ckpt_every == 0
    if cfg.ckpt_dir and not saved:  # a requeued run that had finished resumes here and stops
        _save(d, cfg, net, opt, sched, log, steps, {"epoch": cfg.epochs, "offset": 0})
    timing = {
        "elapsed": steps.elapsed,
        "timed_steps": steps.timed_steps,
        "host_syncs": steps.flushes,
    }
    return {**log, "losses": steps.losses, **timing}


def _amp(d: dist.Dist, cfg: DDPConfig) -> str:
    """bf16 autocast where the GPU computes bf16 natively (auto), else none."""
    if cfg.amp != "auto":
        return cfg.amp
    return "bf16" if devices.is_gpu(d.device) and dist.supports_bf16(d.device) else "none"


def _inject_faults(d, cfg, step: int, resumed: bool) -> None:
    if cfg.step_delay:
        time.sleep(cfg.step_delay)
    if cfg.crash_at_step == step and d.rank == d.world_size - 1 and not resumed:
        # The wall-clock time lets a test measure how long the others take to stop.
        print(
            f"rank {d.rank}: killing myself (SIGKILL) after step {step} at {time.time():.3f}",
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    cfg = parse(DDPConfig, argv)
    if cfg.deterministic:  # before CUDA starts
        deterministic()
    with dist.session() as d:
        dist.print0(f"{d}; global batch {cfg.batch_size * d.world_size}")
        metrics = train(d, cfg)
        if not metrics.get("preempted"):  # a preempted run is not finished: no results yet
            write_metrics(metrics)


if __name__ == "__main__":
    main()
