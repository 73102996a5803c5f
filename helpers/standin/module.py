"""``torch.gpu``: what torch's generic device code asks of an accelerator module."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["GpuModule"]


class _Stream:
    """Streams and events of a device that runs every kernel at once: nothing to wait for."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _Event()

    def synchronize(self):
        pass

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Event(_Stream):
    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def elapsed_time(self, other) -> float:
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
        pass

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
