"""Measuring where training time goes: throughput in samples/s and a torch.profiler summary.

    rate = throughput(model, loader, device, amp="bf16")["samples_per_s"]
    summary = profile(model, loader, device, steps=5)
    summary.phases        # ms per step in data / forward / backward / optimizer
    summary.top_ops       # the most expensive operators
    print(summary.table)  # torch.profiler's own table

Both work on a copy of the model, so measuring never changes the weights a
notebook is training. On a GPU they synchronise before reading the clock
(CUDA calls return before the work is done) and rank operators by kernel time.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

from helpers import devices
from helpers.training.loop import PHASES, grad_scaler, synchronize, train_epoch, train_step

__all__ = ["throughput", "profile", "ProfileSummary", "format_table"]


def throughput(
    model: nn.Module,
    loader: Iterable,
    device: torch.device,
    steps: int = 20,
    warmup: int = 3,
    amp: str | None = None,
    include_data: bool = True,
    repeats: int = 3,
    lr: float = 0.01,
) -> dict:
    """Training samples per second, measured on a copy of ``model`` with plain SGD.

    include_data=True times the loader too (the end-to-end rate); False reuses
    one batch already on the device (the compute-only rate), so the difference
    is the cost of data loading. The first ``warmup`` steps are not timed
    (allocator, kernel selection, lazy initialisation). ``steps`` steps are
    timed ``repeats`` times and the fastest repeat is reported: other programs
    on a shared machine only ever slow a repeat down, so the best one is
    closest to what the hardware can do.
    Returns {"samples_per_s", "ms_per_step", "batch_size", "steps", "repeats"}.
    """
    if steps < 1 or warmup < 0 or repeats < 1:
        raise ValueError(
            f"need steps >= 1, warmup >= 0, repeats >= 1, got {steps=} {warmup=} {repeats=}"
        )
    model = copy.deepcopy(model).to(device)  # do not disturb the caller's weights
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler, loss_fn = grad_scaler(device, amp), nn.CrossEntropyLoss()
    model.train()

    def batches():
        while True:  # cycle through the loader as often as needed
            yield from loader

    source = batches()
    fixed = [t.to(device) for t in next(source)[:2]]

    def run(n: int) -> tuple[int, float]:
        synchronize(device)
        start, samples = time.perf_counter(), 0
        for _ in range(n):
            if include_data:
                x, y = (t.to(device, non_blocking=True) for t in next(source)[:2])
            else:
                x, y = fixed
            train_step(model, x, y, optimizer, loss_fn, amp, scaler, device)
            samples += len(y)
        synchronize(device)
        return samples, time.perf_counter() - start

    run(warmup)
    samples, seconds = min((run(steps) for _ in range(repeats)), key=lambda r: r[1] / r[0])
    return {
        "samples_per_s": samples / seconds,
        "ms_per_step": 1000 * seconds / steps,
        "batch_size": len(fixed[1]),
        "steps": steps,
        "repeats": repeats,
    }


@dataclass
class ProfileSummary:
    """Where the time of a few training steps went.

    phases: milliseconds per step in each phase ("data", "forward", "backward",
        "optimizer"), the host's time in the record_function ranges of train_epoch.
    top_ops: the most expensive operators, as dicts {name, self_ms, calls, percent},
        by self time (time in the operator itself, not its children): CPU time, or on a
        GPU the time of the kernels the operator launched.
    table: torch.profiler's own table of the same operators, as a string.
    """

    phases: dict
    top_ops: list
    table: str
    steps: int


@contextlib.contextmanager
def _quiet_kineto():
    """Kineto (the profiler's backend) prints "USDT ... profiler_start/stop" at every profile,
    and an ERROR when a CUDA build finds no GPU; it reads KINETO_LOG_LEVEL as a profile starts,
    and 6 is above all its levels. Set for the profile only (a user's own value is kept), so the
    variable never reaches the jobs this kernel submits."""
    before = os.environ.get("KINETO_LOG_LEVEL")
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KINETO_LOG_LEVEL", None)


def profile(
    model: nn.Module,
    loader: Iterable,
    device: torch.device,
    steps: int = 5,
    warmup: int = 2,
    amp: str | None = None,
    row_limit: int = 10,
) -> ProfileSummary:
    """Run torch.profiler over ``steps`` training steps (on a copy of ``model``) and summarise.

    On a GPU the operators are ranked by the kernel time they launched: the CPU time of an
    asynchronous CUDA call is only the launch. Phases are host time on every device.
    """
    model = copy.deepcopy(model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train_epoch(model, loader, optimizer, device, amp, max_steps=warmup)  # warm up, untimed
    # A GPU whose kernels the profiler can time (CUDA; not the dry run's stand-in, whose
    # kernels run on the CPU and are timed as CPU operators).
    on_gpu = (
        devices.is_gpu(device) and ProfilerActivity.CUDA in torch.profiler.supported_activities()
    )
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
    with _quiet_kineto(), torch.profiler.profile(activities=activities) as prof:
        train_epoch(model, loader, optimizer, device, amp, max_steps=steps)
    # Operators and phase ranges are host rows; a GPU adds rows of its own (each kernel, and
    # the phase ranges again as GPU annotations), left out here: operators are ranked by the
    # kernel time they launched, under their own names.
    events = prof.key_averages()
    host = [e for e in events if e.device_type == DeviceType.CPU]
    self_key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    # Phases in host time, on every device. On a GPU, backward's kernels are launched from
    # autograd's device thread, outside the host's "backward" range, so its kernel time would
    # read ~0; the host's time is what a step waits for when kernels are short (a small
    # model), and follows the GPU when its queue of kernels is full.
    phases = {e.key: e.cpu_time_total / 1000 / steps for e in host if e.key in PHASES}
    ops = [e for e in host if e.key not in PHASES and not e.key.startswith("ProfilerStep")]
    ops.sort(key=lambda e: getattr(e, self_key), reverse=True)
    everything = sum(getattr(e, self_key) for e in ops) or 1.0
    top = [
        {
            "name": e.key,
            "self_ms": getattr(e, self_key) / 1000 / steps,
            "calls": e.count // steps,
            "percent": 100 * getattr(e, self_key) / everything,
        }
        for e in ops[:row_limit]
    ]
    table = events.table(sort_by=self_key, row_limit=row_limit)
    return ProfileSummary({p: phases.get(p, 0.0) for p in PHASES}, top, table, steps)


def format_table(rows: list[dict]) -> str:
    """Measurements as a fixed-width text table (columns from the first row's keys).

    Floats print with one decimal and thousands separators, ints with separators;
    pre-format anything else (percentages, for example) as strings.
    """
    if not rows:
        return "(no rows)"

    def cell(v) -> str:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return str(v)
        return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"

    columns = list(rows[0])
    cells = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
