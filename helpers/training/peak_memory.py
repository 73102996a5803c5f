"""The most tensor memory a piece of code held at once, measured on CPU as on GPU.

    with PeakMemory(device) as mem:
        out = attention(q, k, v)
    mem.peak      # bytes: the highest total of the tensors created inside the block
                  # that were alive at the same moment (inputs made before it not counted)

On a GPU this is the CUDA caching allocator's own statistic (``max_memory_allocated`` after
``reset_peak_memory_stats``, minus what was allocated at the start). On CPU there is no
such counter, so a TorchDispatchMode watches every operator: each new storage an operator
returns is added to the live total, and a weak reference's callback subtracts it when the
storage is freed. It sees tensors, not the scratch memory inside a kernel (a fused attention
kernel's tiles), so it measures what the Python code materialises: an S x S score matrix
shows up, a kernel that never builds one does not.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PeakMemory"]


class _LiveStorages(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live, self.peak = 0, 0
        self._refs: dict[int, weakref.ref] = {}  # data_ptr -> weak reference to its storage

    def _freed(self, key: int, nbytes: int):
        def callback(_):
            if self._refs.pop(key, None) is not None:
                self.live -= nbytes

        return callback

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel():
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key not in self._refs:  # a new storage (views and in-place ops reuse one)
                    nbytes = storage.nbytes()
                    self._refs[key] = weakref.ref(storage, self._freed(key, nbytes))
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
        return out


class PeakMemory:
    """Context manager: ``.peak`` = bytes of tensors created inside it and alive at once."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.peak = 0
        self._mode: _LiveStorages | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._mode = _LiveStorages()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self._mode.__exit__(*exc)
            self.peak = self._mode.peak
