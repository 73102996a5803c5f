"""Training and evaluation loops, throughput, a profiler summary and mixed precision.

The same functions serve a single CPU, a single GPU and every rank of a DDP
job: they take the model, loader, optimizer and device as values and hide
nothing a learner should see (the loop is the usual zero_grad / forward /
backward / step).

    history = fit(model, train_loader, test_loader, optimizer, device, epochs=3, amp="bf16")

Throughput and the profiler summary live in helpers.training.profiling.

Mixed precision (``amp``): None or "none" = float32; "bf16" = autocast to
bfloat16 (CPU and recent GPUs: same exponent range as fp32, so no gradient
scaling); "fp16" = autocast to float16 with a GradScaler (GPUs only: fp16's
small range would underflow small gradients without loss scaling).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.profiler import record_function

from helpers import devices
from helpers.dist import synchronize  # GPU work is queued: wait before reading a clock

__all__ = [
    "AMP_CHOICES",
    "phase",
    "autocast",
    "default_amp",
    "grad_scaler",
    "train_epoch",
    "evaluate",
    "fit",
    "train_step",
    "synchronize",
]

AMP_CHOICES = (None, "none", "bf16", "fp16")
# The record_function ranges of one training step, as helpers.training.profiling reports them.
PHASES = ("data", "forward", "backward", "optimizer")


@contextlib.contextmanager
def phase(name: str):
    """A named range of a training step, seen by both profilers.

    torch.profiler sees a ``record_function`` range; Nsight Systems (the nsys job
    of helpers.cluster) sees an NVTX range of the same name on GPUs, so its
    timeline shows forward / backward / allreduce / optimizer by name.
    """
    nvtx = torch.cuda.is_available()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()


def _check_amp(amp: str | None, device: torch.device) -> str | None:
    if amp not in AMP_CHOICES:
        raise ValueError(f"amp must be one of None, 'none', 'bf16', 'fp16', got {amp!r}")
    if amp == "fp16" and not devices.is_gpu(device):
        raise ValueError(
            "amp='fp16' needs a GPU (float16 autocast on CPU is slow and needs loss scaling); "
            "use amp='bf16' on CPU"
        )
    return None if amp == "none" else amp


def default_amp(device: torch.device) -> str:
    """The mixed-precision mode to try first: bf16 on CPU and bf16-capable GPUs, else fp16."""
    # Emulation excluded: V100 and T4 run bf16 only in emulation, far slower than fp16.
    return "bf16" if devices.supports_bf16(device) else "fp16"


def autocast(device: torch.device, amp: str | None):
    """Context manager running the forward pass in ``amp`` precision (a no-op for None)."""
    amp = _check_amp(amp, device)
    if amp is None:
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, amp: str | None) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 (scales the loss so small gradients survive), else None."""
    return torch.amp.GradScaler(device.type) if _check_amp(amp, device) == "fp16" else None


def train_step(model, x, y, optimizer, loss_fn, amp, scaler, device):
    """One optimisation step on a batch already on ``device``.

    x: (B, ...) inputs, y: (B,) class labels. Returns (loss, number correct) as
    0-d tensors left on the device (reading them would wait for the GPU).
    """
    optimizer.zero_grad(set_to_none=True)
    with phase("forward"), autocast(device, amp):
        logits = model(x)  # (B, classes)
        loss = loss_fn(logits, y)
    with phase("backward"):
        (scaler.scale(loss) if scaler else loss).backward()
    with phase("optimizer"):
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    return loss.detach().float(), (logits.argmax(1) == y).sum()


def train_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    amp: str | None = None,
    scaler: torch.amp.GradScaler | None = None,
    loss_fn: Callable | None = None,
    max_steps: int | None = None,
) -> dict:
    """Train for one pass over ``loader`` (or ``max_steps`` batches).

    Returns {"loss", "accuracy", "samples", "seconds", "samples_per_s", "step_losses"}
    for this process's batches (on a DDP rank: that rank's shard).
    Losses stay on the device until the end so the loop never waits for the GPU.
    """
    _check_amp(amp, device)
    if scaler is None:
        scaler = grad_scaler(device, amp)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    model.train()
    losses, correct, samples = [], torch.zeros((), device=device, dtype=torch.long), 0
    start = time.perf_counter()
    batches = iter(loader)
    while max_steps is None or len(losses) < max_steps:
        with record_function("data"):
            batch = next(batches, None)
            if batch is None:
                break
            x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        loss, ok = train_step(model, x, y, optimizer, loss_fn, amp, scaler, device)
        losses.append(loss)
        correct += ok
        samples += len(y)
    synchronize(device)
    seconds = time.perf_counter() - start
    step_losses = torch.stack(losses).tolist() if losses else []
    return {
        "loss": sum(step_losses) / max(1, len(step_losses)),
        "accuracy": correct.item() / max(1, samples),
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "step_losses": step_losses,
    }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    device: torch.device,
    amp: str | None = None,
    loss_fn: Callable | None = None,
) -> dict:
    """Mean loss and accuracy over ``loader``: {"loss", "accuracy", "samples"}.

    In a process group the counts are summed over all ranks (all_reduce), so
    every rank returns the accuracy over the whole distributed test set. With
    a padded DistributedSampler a few samples count twice (see helpers.data).
    """
    loss_fn = loss_fn or nn.CrossEntropyLoss(reduction="sum")
    model.eval()
    # [sum of losses, number correct, number of samples]: one tensor, one all_reduce.
    totals = torch.zeros(3, device=device, dtype=torch.float64)
    for batch in loader:
        x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(x)
        totals[0] += loss_fn(logits.float(), y)
        totals[1] += (logits.argmax(1) == y).sum()
        totals[2] += len(y)
    if tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.all_reduce(totals)
    loss_sum, correct, n = totals.tolist()
    return {"loss": loss_sum / max(1, n), "accuracy": correct / max(1, n), "samples": int(n)}


def fit(
    model: nn.Module,
    train_loader,
    test_loader,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    epochs: int,
    amp: str | None = None,
    log: Callable[[str], None] | None = print,
    max_steps: int | None = None,
) -> list[dict]:
    """Train and test for ``epochs``; returns one dict per epoch.

    Each dict: epoch, train_loss, train_accuracy, test_loss, test_accuracy,
    seconds, samples_per_s, step_losses. Distributed loaders are reshuffled
    every epoch (sampler.set_epoch). ``log`` gets one line per epoch (pass
    helpers.dist.print0 on ranks, or None for silence).
    """
    scaler = grad_scaler(device, amp)  # one scaler for the whole run: it adapts its scale
    history = []
    for epoch in range(epochs):
        if hasattr(getattr(train_loader, "sampler", None), "set_epoch"):
            train_loader.sampler.set_epoch(epoch)
        tr = train_epoch(model, train_loader, optimizer, device, amp, scaler, max_steps=max_steps)
        te = evaluate(model, test_loader, device, amp)
        row = {
            "epoch": epoch + 1,
            "train_loss": tr["loss"],
            "train_accuracy": tr["accuracy"],
            "test_loss": te["loss"],
            "test_accuracy": te["accuracy"],
            "seconds": tr["seconds"],
            "samples_per_s": tr["samples_per_s"],
            "step_losses": tr["step_losses"],
        }
        history.append(row)
        if log:
            log(
                f"epoch {row['epoch']}/{epochs}: train loss {row['train_loss']:.3f} "
                f"acc {row['train_accuracy']:.1%} | test loss {row['test_loss']:.3f} "
                f"acc {row['test_accuracy']:.1%} | {row['samples_per_s']:,.0f} samples/s"
            )
    return history
