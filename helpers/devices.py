"""What a program asks of its device: wait for it, name it, does it compute bf16.

Ground floor, beside ``helpers.dist`` (which re-exports these three): the same calls work on a
GPU, on the stand-in GPU of the dry run (``helpers.standin``) and on the CPU.
"""

from __future__ import annotations

import torch

from helpers import standin


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: call it before reading a clock.

    GPU kernels run asynchronously; without this a timer measures how long it took to
    *launch* the work. A no-op on the CPU.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
