"""What CPU offload moves: where a rank's model states live, and the bytes that cross between
host and device in a step (over PCIe on a GPU node).

    with HostDeviceCopies() as copies:
        loss_fn(model).backward(); opt.step()
    copies.bytes        # {"host->device": ..., "device->host": ...}
    placement(model, opt)   # {"weights": {"gpu": ..., "cpu": ...}, "gradients": ..., "optimizer": ...}

On CPU ranks run device-strict (``WORKBOOK_DEVICE_CHECK=strict``: ``d.device`` is a stand-in
GPU whose data live in host memory) FSDP2 places and copies tensors exactly as it would on
a GPU, so both are measured here; only the time of a copy is not a GPU's.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.parallel.sharded.memory import _nbytes, _optimizer_tensors, local_tensor

__all__ = ["HostDeviceCopies", "placement"]

_COPIES = ("_to_copy", "copy_")


class HostDeviceCopies(TorchDispatchMode):
    """Counts the bytes of every copy between the host ("cpu") and another device."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = {"host->device": 0, "device->host": 0}
        self.copies = {"host->device": 0, "device->host": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _COPIES:
            src, dst = (args[1], args[0]) if name == "copy_" else (args[0], out)
            kinds = (src.device.type, dst.device.type)
            if kinds[0] != kinds[1] and "cpu" in kinds:
                way = "host->device" if kinds[0] == "cpu" else "device->host"
                self.bytes[way] += src.numel() * src.element_size()
                self.copies[way] += 1
        return out


def placement(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, dict[str, int]]:
    """Bytes of this rank's weights, gradients and optimizer state, by device type (counted as
    ``helpers.parallel.sharded.memory.measure_states`` counts them: distinct local storages)."""
    params = list(model.parameters())
    kinds = {
        "weights": params,
        "gradients": [p.grad for p in params if p.grad is not None],
        "optimizer": [t for t in _optimizer_tensors(optimizer) if t.dim() > 0],  # no step counters
    }
    out = {}
    for kind, tensors in kinds.items():
        by_device = defaultdict(list)
        for t in tensors:
            by_device[local_tensor(t).device.type].append(t)
        out[kind] = {device: _nbytes(group) for device, group in by_device.items()}
    return out
