"""``torch.gpu``: what torch's generic device code asks of an accelerator module.

The stand-in runs every kernel at once, so streams have nothing to wait for. Its events keep
CUDA's rules for timing all the same: ``elapsed_time`` needs both events made with
``enable_timing=True`` and recorded, and the end event finished, which the host knows only
after it waited for the device since the record (``event.synchronize()``, ``query()``,
``torch.gpu.synchronize()``, a stream's ``synchronize()``, or a copy to the host such as
``.item()``). Without that wait CUDA raises "device not ready" while the work is still
queued; so does the stand-in, whatever the work.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["GpuModule", "host_waited"]

_WAITS = [0]  # how many times the host has waited for the device


def host_waited() -> None:
    """The host waited for the device (a synchronize, or a copy of a device tensor to it)."""
    _WAITS[0] += 1


class _Stream:
    """A stream of a device that runs every kernel at once: nothing to wait for."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or _Event()
        event.record()
        return event

    def synchronize(self):
        host_waited()

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Event:
    """A CUDA event's rules for timing (module docstring)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess=False):
        self.timing, self.recorded, self.finished = enable_timing, None, False

    def record(self, stream=None):
        self.recorded, self.finished = _WAITS[0], False

    def wait(self, stream=None):
        pass

    def query(self) -> bool:
        self.finished = self.recorded is not None
        return True

    def synchronize(self):
        self.finished = self.recorded is not None

    def elapsed_time(self, end) -> float:
        if not (self.timing and end.timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self.recorded is None or end.recorded is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if not (end.finished or _WAITS[0] > end.recorded):
            raise RuntimeError(
                "CUDA error: device not ready (stand-in GPU: the end event may still be queued "
                "behind the work it times when elapsed_time reads it; wait for it first: "
                "end.synchronize(), or dist.synchronize(d.device))"
            )
        return 0.0


class GpuModule:
    """``torch.gpu``: what torch's generic device code asks of an accelerator module."""

    Stream = _Stream
    Event = _Event

    def __init__(self, gpu: str):
        self.gpu = gpu
        self._stream = _Stream()
        self.peak_bytes = 0  # set by the memory tracker of a dry run

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def _is_in_bad_fork(self):  # a forked DataLoader worker of a rank that used the device
        from helpers.standin.cuda_rules import in_bad_fork

        return in_bad_fork()

    def device_count(self):
        return 1

    def current_device(self):
        return 0

    def set_device(self, index):
        pass

    def get_device_name(self, device=None):
        return f"stand-in {self.gpu}"

    def manual_seed(self, seed):
        pass

    def manual_seed_all(self, seed):
        pass

    def get_rng_state(self, device=None):  # torch.random.fork_rng (pipelining's shape inference)
        return torch.zeros(1, dtype=torch.uint8)

    def set_rng_state(self, state, device=None):
        pass

    def synchronize(self, device=None):
        host_waited()

    def current_stream(self, device=None):
        return self._stream

    def default_stream(self, device=None):
        return self._stream

    def stream(self, stream):
        return contextlib.nullcontext()

    def get_amp_supported_dtype(self):
        return [torch.float16, torch.bfloat16]

    def is_bf16_supported(self, including_emulation: bool = False):
        from helpers.gpus import supports_bf16

        return supports_bf16(self.gpu)

    def memory_allocated(self, device=None):
        return 0

    def max_memory_allocated(self, device=None):
        return self.peak_bytes

    def reset_peak_memory_stats(self, device=None):
        pass

    def empty_cache(self):
        pass
