"""What a program asks of its device: wait for it, name it, does it compute bf16.

Ground floor, beside ``helpers.dist`` (which re-exports these three): the same calls work on a
GPU, on the stand-in GPU of the dry run (``helpers.standin``) and on the CPU.
"""

from __future__ import annotations

import os

import torch

from helpers import standin
from helpers.config import SMALL_ENV


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: call it before reading a clock.

    GPU kernels run asynchronously; without this a timer measures how long it took to
    *launch* the work. A no-op on the CPU.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == standin.DEVICE_TYPE:  # the stand-in notes it (its events' rules)
        torch.gpu.synchronize()


def device_name(device: torch.device) -> str:
    """'NVIDIA H100 80GB HBM3', 'stand-in h100' or 'cpu'."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == standin.DEVICE_TYPE:
        return torch.gpu.get_device_name()
    return "cpu"


def supports_bf16(device: torch.device) -> bool:
    """Native bf16 arithmetic on this device (emulation excluded: V100 and T4 answer False).

    ``torch.cuda.is_bf16_supported`` counts emulation by default, and says True on a V100.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == standin.DEVICE_TYPE:
        return torch.gpu.is_bf16_supported(including_emulation=False)
    return True  # CPUs compute bf16 (AMX or AVX-512 where present, emulated otherwise)


def is_gpu(device: torch.device) -> bool:
    """A GPU, real (``cuda``) or the dry run's stand-in (``gpu``): take the path a GPU takes.

    Programs ask this instead of testing ``device.type == "cuda"``, so that the dry run and
    the device-strict run follow the GPU's path (pinned memory, CUDA's optimizer defaults,
    a GPU's kernels) on CPU ranks.
    """
    return device.type in ("cuda", standin.DEVICE_TYPE)


def gpu_sized(device: torch.device) -> bool:
    """Pick the sizes a GPU run would pick: True on a GPU, real or stand-in, and False on the
    CPU, or when ``$WORKBOOK_SMALL`` asks a checked program for its laptop sizes.

    A program that runs bigger problems on a GPU asks this (``seqs = [8192, 16384] if
    devices.gpu_sized(d.device) else [512, 1024]``): the full-size dry run then meets, on fake
    tensors, the sizes the GPU will meet, and its memory figure is the GPU's.
    """
    return is_gpu(device) and not os.environ.get(SMALL_ENV)


def pin_memory(device: torch.device) -> bool:
    """Whether a DataLoader feeding ``device`` should pin its host batches (GPUs: yes)."""
    return is_gpu(device)


def allocator_stats(device: torch.device):
    """The module whose caching allocator counts this device's bytes (``torch.cuda`` on a CUDA
    GPU: ``memory_allocated``, ``max_memory_allocated``, ``reset_peak_memory_stats``), or None
    where the caller must count tensors itself (the CPU, and the stand-in GPU, whose tensors
    hold host memory)."""
    return torch.cuda if device.type == "cuda" else None


def repeats(n: int) -> int:
    """How many timed repeats a benchmark should make: ``n``, or 1 on the dry run's stand-in
    GPU, whose clock measures nothing real (fake or CPU-backed kernels). The check needs each
    path once; repeating a ring of fake kernels only costs the check its time."""
    return 1 if standin.mode() else n
