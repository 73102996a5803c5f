"""The most tensor memory a piece of code held at once, measured on CPU as on GPU.

    with PeakMemory(device) as mem:
        out = attention(q, k, v)
        mem.mark("attention done")   # the live bytes at this point, by name
    mem.peak      # bytes: the most memory the block's tensors held at once, above its start
                  # (inputs made before it not counted)
    mem.held      # bytes still held above the start when the block ended
    mem.marks     # {"attention done": bytes}
    mem.reset_peak()   # the peak from now on (one step of several)

On a CUDA GPU this is the caching allocator's own statistic (``max_memory_allocated`` after
``reset_peak_memory_stats``, minus what was allocated at the start). On the CPU, and on the dry
run's stand-in GPU, there is no such counter, so a TorchDispatchMode watches every operator:
each new storage an operator returns is added to the live total, and a weak reference's
callback subtracts it when the storage is freed. A storage resized in place counts by the
change of its size, whenever it was made: FSDP2 frees a layer's gathered weights by resizing
their storage to 0 and resizes the same storage back to gather them again, in every step. It
sees tensors, not the scratch memory inside a kernel (a fused attention kernel's tiles), so it
measures what the Python code materialises: an S x S score matrix shows up, a kernel that never
builds one does not. ``trace=True`` (counted tensors only) also keeps (seconds, live bytes)
after every operator, for a plot of memory through a step.

A collective's tensors stay referenced by the communication library for a moment after the
call returns: gloo's worker thread drops its work (and the tensors it holds) only after it
has marked it complete, and on a busy machine that thread may wait milliseconds for a core.
So ``held`` first waits (at most ``settle_s``, 2 s by default) for every tensor made inside the
block and handed to a collective to be let go; one that the code itself keeps is still held
then, and counts. (Lab 2's cluster job, under CI load: rank 2 of 4 read 36.0 MiB held where
the optimizer keeps 16.0, its 16 MiB gradient and 4 MiB piece still in gloo's hands.)
"""

from __future__ import annotations

import time
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from helpers import devices

__all__ = ["PeakMemory"]


class _LiveStorages(TorchDispatchMode):
    def __init__(self, trace: bool = False):
        super().__init__()
        self.live, self.peak = 0, 0
        # keyed by the storage object, not its data_ptr(): every fake tensor's (the dry run's
        # FakeTensorMode) is 0, and a freed address is soon reused
        self._sizes = WeakIdKeyDictionary()  # storage -> [bytes now, a real storage?]
        self._finalizers: list[weakref.finalize] = []  # detached at the end (long-lived storages)
        self._sent = WeakIdKeyDictionary()  # storages handed to collectives (see settle)
        self.trace: list[tuple[float, int]] | None = [] if trace else None
        self._t0 = time.perf_counter()

    def _add(self, delta: int) -> None:
        self.live += delta
        self.peak = max(self.peak, self.live)
        if self.trace is not None:
            self.trace.append((time.perf_counter() - self._t0, self.live))

    def _freed(self, entry: list):
        def callback():
            self.live -= entry[0]

        return callback

    def sweep(self) -> None:
        """Drop storages whose memory is gone while a Python handle to them survives (FSDP2
        hands its original parameters' storages to its shards this way): no weak-reference
        callback ever fires for them."""
        for storage, entry in list(self._sizes.items()):
            if not entry[1]:  # a fake tensor's storage has no memory to lose
                continue
            try:
                storage.data_ptr()
            except RuntimeError:  # "an invalid python storage": its memory was freed
                self.live -= entry[0]
                entry[0] = 0
                del self._sizes[storage]

    def resized(self, storage, before: int, nbytes: int) -> None:
        entry = self._sizes.get(storage)
        if entry is None:  # made before the block: from now on it counts by its changes
            entry = self._sizes[storage] = [before, True]
            self._watch(storage, entry)
        delta, entry[0] = nbytes - entry[0], nbytes
        self._add(delta)

    def _watch(self, storage, entry: list) -> None:
        self._finalizers.append(weakref.finalize(storage, self._freed(entry)))

    def close(self) -> None:
        """Stop watching: storages that outlive the block (a model's) keep no callback to it."""
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()

    def see(self, t: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(t):  # a DTensor: its local tensor holds the memory
            for name in t.__tensor_flatten__()[0]:
                inner = getattr(t, name)
                if isinstance(inner, torch.Tensor):
                    self.see(inner)
            return
        if t.device.type == "meta" or not t.numel():
            return
        storage = t.untyped_storage()
        if storage not in self._sizes:  # a new storage (views and in-place ops reuse one)
            entry = [storage.nbytes(), not isinstance(t, FakeTensor)]
            self._sizes[storage] = entry
            self._watch(storage, entry)
            self._add(entry[0])

    def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until the communication library has let go of every
        storage made inside the block and handed to a collective (see the module docstring)."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if not any(s in self._sizes for s in list(self._sent.keys())):
                return
            time.sleep(0.001)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in _COLLECTIVES:
            for t in tree_leaves((args, kwargs)):
                for s in _storages(t):
                    self._sent[s] = True
        out = func(*args, **(kwargs or {}))
        inputs = {id(s) for t in tree_leaves((args, kwargs)) for s in _storages(t)}
        for t in tree_leaves(out):  # a view or an in-place result of an input is not new memory
            if isinstance(t, torch.Tensor) and not any(id(s) in inputs for s in _storages(t)):
                self.see(t)
        return out


_COLLECTIVES = ("c10d", "_c10d_functional", "c10d_functional")


def _storages(t) -> list:
    """The storages holding a tensor's data (a DTensor's: its local tensor's)."""
    if not isinstance(t, torch.Tensor):
        return []
    if is_traceable_wrapper_subclass(t):
        return [s for name in t.__tensor_flatten__()[0] for s in _storages(getattr(t, name))]
    return [] if t.device.type == "meta" else [t.untyped_storage()]


class PeakMemory:
    """Context manager: ``.peak`` = bytes of tensors created inside it and alive at once;
    ``.held`` = those alive at its end; ``.mark(name)`` records the live bytes now."""

    def __init__(
        self, device: torch.device | str = "cpu", trace: bool = False, settle_s: float = 2.0
    ):
        self.device = torch.device(device)
        self.settle_s = settle_s
        self.peak = self.held = 0
        self.marks: dict[str, int] = {}
        self.trace: list[tuple[float, int]] = []
        self._want_trace = trace
        self._mode: _LiveStorages | None = None
        self._resize = None
        # CUDA's allocator counts its bytes; elsewhere (CPU, stand-in GPU) storages are counted
        self._stats = devices.allocator_stats(self.device)

    def _live(self) -> int:
        if self._stats:
            self._stats.synchronize(self.device)
            return self._stats.memory_allocated(self.device) - self._base
        self._mode.sweep()
        return self._mode.live

    def mark(self, name: str) -> int:
        """The bytes alive now (of tensors created inside the block), kept under ``name``."""
        self.marks[name] = self._live()
        return self.marks[name]

    def reset_peak(self) -> None:
        """Start the peak again from what is alive now (to measure one step of several)."""
        if self._stats:
            self._stats.synchronize(self.device)
            self._stats.reset_peak_memory_stats(self.device)
        else:
            self._mode.sweep()
            self._mode.peak = self._mode.live

    def __enter__(self) -> PeakMemory:
        if self._stats:
            self._stats.synchronize(self.device)
            self._stats.reset_peak_memory_stats(self.device)
            self._base = self._stats.memory_allocated(self.device)
        else:
            self._mode = mode = _LiveStorages(self._want_trace)
            self._resize = original = torch.UntypedStorage.resize_

            def resize_(storage, nbytes):
                before = storage.nbytes()
                result = original(storage, nbytes)
                mode.resized(storage, before, nbytes)
                return result

            torch.UntypedStorage.resize_ = resize_
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._stats:
            self._stats.synchronize(self.device)
            self.peak = self._stats.max_memory_allocated(self.device) - self._base
            self.held = self._stats.memory_allocated(self.device) - self._base
        else:
            self._mode.__exit__(*exc)
            self._mode.settle(self.settle_s)
            self._mode.sweep()
            torch.UntypedStorage.resize_ = self._resize
            self.peak, self.held = self._mode.peak, self._mode.live
            self.trace = self._mode.trace or []
            self._mode.close()
