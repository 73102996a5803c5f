"""One rank of a full-size job, on fake tensors: what it allocates, and how far it gets.

``FakeRank`` is a TorchDispatchMode stacked on PyTorch's FakeTensorMode:

* tensors on the stand-in GPU, and host tensors over ``SMALL`` bytes, are fake: shapes,
  dtypes and devices without storage, so a 7B model costs no memory;
* small host tensors stay real, so a program's bookkeeping (a DeviceMesh's rank table,
  ``all_gather_object``, a Python loop over ``.tolist()``) keeps working;
* reading a fake value back (``.item()``, ``bool(t)``) gives a stand-in (1 or 1.0);
* every storage is counted while it lives, by device: the peak bytes of the GPU and of
  the host. Resizes count too (FSDP2 frees a layer's gathered weights by resizing
  their storage to 0). A tensor counts from the first op that makes it or takes it, so
  one made before the mode or without an op (``torch.from_numpy``) counts too; saved
  activations count for as long as autograd holds them;
* the first time the GPU's bytes pass each of ``gpu_marks`` (the memory of each GPU the
  job may get), the stack is kept: where CUDA would have run out of memory;
* what CUDA refuses and fake mode's shape functions let through (a bf16 weight meeting an
  fp32 input, a device draw from a host generator, the device in a DataLoader worker) fails
  as on CUDA (``helpers.standin.cuda_rules``).

Attention is costed as a GPU runs it: ``scaled_dot_product_attention`` on the stand-in GPU
takes the flash kernel (bf16, fp16) or the memory-efficient one (fp32), as CUDA chooses,
whose saved tensors grow with the sequence, not with its square (the CPU's math kernel
would keep every S x S score).

Milestones say how far the program got: ``started`` (process group up), ``forward``
(first module call), ``backward`` (first op run by autograd), ``step`` (an optimizer
step); after ``max_steps`` steps ``StopDryRun`` ends the program: one or two steps show
the peak, including the optimizer's state.
"""

from __future__ import annotations

import traceback
import weakref

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from helpers.course.dryrun.patches import ORIGINAL_SWAP, patch_for_fake_run
from helpers.standin import DEVICE_TYPE
from helpers.standin.cuda_rules import check_as_cuda, check_fork, check_generator
from helpers.standin.module import host_waited

__all__ = ["FakeRank", "StopDryRun", "SMALL", "MILESTONES"]

SMALL = 1 << 20  # host tensors up to 1 MiB stay real
MILESTONES = ("started", "forward", "backward", "step")
_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)
_TO_HOST = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten._to_copy.default)


class StopDryRun(BaseException):
    """Raised after the last optimizer step the dry run needs: not an error."""


def _finalizes(finalizer: weakref.finalize, *tensors) -> bool:
    target = finalizer.peek()
    return target is not None and any(target[0] is t for t in tensors)


def _stand_in(x: torch.Tensor):
    if x.dtype == torch.bool:
        return True
    return 1.0 if x.dtype.is_floating_point or x.dtype.is_complex else 1


def _has_fake(t: torch.Tensor) -> bool:
    """A fake tensor, or a subclass (DTensor) holding one."""
    if isinstance(t, FakeTensor):
        return True
    if is_traceable_wrapper_subclass(t):
        inner = (getattr(t, name) for name in t.__tensor_flatten__()[0])
        return any(isinstance(x, torch.Tensor) and _has_fake(x) for x in inner)
    return False


class MemoryLimit(RuntimeError):
    """A rank's host memory went past its share of the job's: raised where it happened."""


class _Storages:
    """Live bytes by device type, with their peaks; past a limit, MemoryLimit."""

    def __init__(self, limits: dict[str, tuple[int, str]] | None = None, marks=()):
        self.live = WeakIdKeyDictionary()  # storage -> [device type, bytes], updated on resize
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.limits = dict(limits or {})  # device -> (bytes, what the limit is)
        self.marks = sorted(marks)  # GPU bytes whose first crossing is recorded, with its stack
        self.crossed: dict[int, list] = {}  # mark -> the stack where the GPU's bytes passed it

    def _add(self, device: str, delta: int) -> None:
        self.now[device] = self.now.get(device, 0) + delta
        self.peak[device] = max(self.peak.get(device, 0), self.now[device])
        while device == "gpu" and self.marks and self.now[device] > self.marks[0]:
            self.crossed[self.marks.pop(0)] = traceback.extract_stack()  # where CUDA runs out
        limit = self.limits.get(device)
        if delta > 0 and limit and self.now[device] > limit[0]:
            del self.limits[device]  # once: the program's own except clauses may go on
            raise MemoryLimit(f"{device} memory of this rank reached {self.now[device] / 2**30:.1f} "
                              f"GiB, past its share: {limit[1]}")  # fmt: skip

    def see(self, t: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(t):  # a DTensor: count its local shard, not its size
            for name in t.__tensor_flatten__()[0]:
                inner = getattr(t, name)
                if isinstance(inner, torch.Tensor):
                    self.see(inner)
            return
        if t.device.type == "meta":  # built on the meta device: no memory anywhere
            return
        s = t.untyped_storage()
        if s in self.live:
            return
        entry = [t.device.type, s.nbytes()]
        self.live[s] = entry
        self._add(entry[0], entry[1])
        weakref.finalize(s, lambda: self._add(entry[0], -entry[1]))

    def resized(self, s, nbytes: int) -> None:
        entry = self.live.get(s)
        if entry is not None:
            self._add(entry[0], nbytes - entry[1])
            entry[1] = nbytes


class FakeRank(TorchDispatchMode):
    """Run a program as one rank of a large job: see the module docstring."""

    def __init__(self, max_steps: int = 2, limits: dict | None = None, gpu_marks=()):
        super().__init__()
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.storages = _Storages(limits, gpu_marks)
        self.max_steps = max_steps
        self.reached = "started"
        self.steps = 0
        self._hooks: list = []
        self._resize = None

    # -- progress ---------------------------------------------------------------
    def _mark(self, milestone: str) -> None:
        if MILESTONES.index(milestone) > MILESTONES.index(self.reached):
            self.reached = milestone

    def _after_step(self, *_):
        self.steps += 1
        self._mark("step")
        if self.steps >= self.max_steps:
            raise StopDryRun(f"stopped after {self.steps} optimizer step(s)")

    # -- the dispatch ----------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch._C._current_graph_task_id() != -1:
            self._mark("backward")
        flat, _ = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        fake_in = any(_has_fake(t) for t in tensors)
        for t in tensors:  # made before the mode, or without an op (numpy's): held all the same
            self.storages.see(t)
        device = kwargs.get("device")
        to_device = device is not None and torch.device(device).type != "cpu"
        on_gpu = (device is not None and torch.device(device).type == DEVICE_TYPE) or any(
            t.device.type == DEVICE_TYPE for t in tensors)  # fmt: skip
        if on_gpu:
            check_fork()  # a DataLoader worker's fetch (patches.py plays it in this process)
            if func in _TO_HOST and (device is None or torch.device(device).type == "cpu"):
                host_waited()  # .item(), .cpu(): the host waits for the device (its events)
        check_generator(flat, on_gpu)
        if func is torch.ops.aten._local_scalar_dense.default and fake_in:
            return _stand_in(args[0])
        if func._schema.name.startswith("c10d::"):
            # through the "dryrun" process group, not fake mode's stub: the group's Work
            # carries the tensors in its future, which DDP's reducer reads
            with unset_fake_temporarily(), torch._C._DisableTorchDispatch():
                out = func(*args, **kwargs)
        elif fake_in or to_device:
            check_as_cuda(func, tensors)  # what fake mode's shape functions do not check
            out = self._fake_or_stand_in(func, args, kwargs)
        else:
            out = self._real_if_small(func, args, kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.storages.see(t)
        return out

    def _fake_or_stand_in(self, func, args, kwargs):
        def fake(x):  # a real host tensor joins as a fake one, never as a constant to run on
            if (
                isinstance(x, torch.Tensor)
                and not _has_fake(x)
                and not (is_traceable_wrapper_subclass(x))
            ):
                return self.fake.from_tensor(x)  # a Parameter too
            return x

        args, kwargs = tree_map(fake, args), tree_map(fake, kwargs)
        try:
            return func(*args, **kwargs)
        except DataDependentOutputException:
            returns = func._schema.returns
            if len(returns) == 1 and str(returns[0].type) in ("bool", "int", "float"):
                return {"bool": True, "int": 1, "float": 1.0}[str(returns[0].type)]
            raise

    def _real_if_small(self, func, args, kwargs):
        """Host work on real tensors stays real unless what it makes is large."""
        if func._schema.is_mutable:  # writes into real host tensors (a pickled object's bytes)
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)  # fake first: how big would it be?
        except _DATA_DEPENDENT:
            out = None
        if out is not None and not func._schema.is_mutable:
            size = sum(t.untyped_storage().nbytes() for t in tree_flatten(out)[0]
                       if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t))  # fmt: skip
            if size > SMALL:
                return out
        with unset_fake_temporarily():
            return func(*args, **kwargs)

    # -- entering and leaving ----------------------------------------------------
    def __enter__(self):
        storages = self.storages
        original = torch.UntypedStorage.resize_

        def resize_(storage, nbytes):
            result = original(storage, nbytes)
            storages.resized(storage, nbytes)
            return result

        self._resize = original
        torch.UntypedStorage.resize_ = resize_
        self._patches = patch_for_fake_run(self._swap_tensors)

        self._hooks = [
            register_optimizer_step_post_hook(self._after_step),
            torch.nn.modules.module.register_module_forward_pre_hook(
                lambda *_: self._mark("forward")
            ),
        ]
        self.fake.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.fake.__exit__(*exc)
        for h in self._hooks:
            h.remove()
        torch.UntypedStorage.resize_ = self._resize
        for owner, name, value in self._patches:
            setattr(owner, name, value)
        return False

    def _swap_tensors(self, t1, t2):
        """nn.Module.to() swaps a fake parameter for the moved one; a tensor with a weakref
        cannot be swapped, and fake mode keeps one in its memo of every tensor it made.
        Finalizers (DeepSpeed names every parameter in a registry that drops the name when
        the parameter dies) are taken off for the swap and put back on the same objects."""
        memo = self.fake.fake_tensor_converter.tensor_memo
        for key, value in list(memo.items()):
            if value is t1 or value is t2:
                del memo[key]
        held = [f.detach() for f in list(weakref.finalize._registry) if _finalizes(f, t1, t2)]
        try:
            return ORIGINAL_SWAP(t1, t2)
        finally:
            for obj, fn, args, kwargs in filter(None, held):
                weakref.finalize(obj, fn, *args, **kwargs)

    def peaks(self) -> dict:
        """Peak live bytes: {"gpu": ..., "cpu": ...}."""
        return dict(self.storages.peak)

    def crossings(self) -> dict:
        """{GPU bytes: the stack where this rank's GPU bytes first passed them}."""
        return dict(self.storages.crossed)
