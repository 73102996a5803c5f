"""Tensors on the stand-in GPU: CPU data behind a device, checked as CUDA checks them.

Every aten op on a :class:`DeviceTensor` unwraps to the CPU tensor behind it, runs there and
wraps the result, so views and in-place updates share storage as on a real device. An op
that mixes a device tensor with a host tensor that is not a 0-d scalar fails with CUDA's
message; collectives go to the process group registered for the device (NCCL's contract).
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

from helpers.standin.cuda_rules import check_as_cuda, check_fork, check_generator, device_used
from helpers.standin.functional import FUNCTIONAL, functional
from helpers.standin.module import host_waited

__all__ = ["DEVICE_TYPE", "DeviceTensor", "device", "run", "is_device_tensor", "register_kernels"]

DEVICE_TYPE = "gpu"
PRIVATEUSE1 = torch._C.DispatchKey.PrivateUse1


def device() -> torch.device:
    return torch.device(DEVICE_TYPE, 0)


_SAME = "Expected all tensors to be on the same device, but found at least two devices, {} and {}!"
# Ops that CUDA accepts with host tensors: copies between devices, and indices on the host.
_CROSS_DEVICE = {"aten::copy_", "aten::_to_copy", "aten::_copy_from"}
# A device tensor indexed by host indices (x[torch.arange(n)]): CUDA takes it. Schema names
# carry no overload ("aten::index", not "aten::index.Tensor").
_INDEX = {"aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_put"}


def is_device_tensor(x) -> bool:
    return isinstance(x, DeviceTensor)


class DeviceTensor(torch.Tensor):
    """A tensor on the stand-in ``gpu`` device; ``.raw`` is the CPU tensor holding its data.

    Every operation unwraps to ``raw``, runs on the CPU, and wraps the result again, so
    views and in-place updates share storage as they do on a real device.
    """

    raw: torch.Tensor

    @staticmethod
    def __new__(cls, raw: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls, raw.size(), strides=raw.stride(), storage_offset=raw.storage_offset(),
            dtype=raw.dtype, device=device(), requires_grad=False,
        )  # fmt: skip
        out.raw = raw
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {})

    def __repr__(self, **_):  # as CUDA prints: tensor([...], device='cuda:0', dtype=...)
        text = repr(self.raw)
        if ", dtype=" in text:
            return text.replace(", dtype=", f", device='{DEVICE_TYPE}:0', dtype=", 1)
        return text[:-1] + f", device='{DEVICE_TYPE}:0')"

    def tolist(self):
        host_waited()
        return self.raw.tolist()

    def numpy(self, **_):
        raise TypeError(
            "can't convert gpu:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
            "tensor to host memory first."
        )

    def untyped_storage(self):  # FSDP2 frees and re-allocates parameter storage by resizing it
        return self.raw.untyped_storage()

    @property
    def data(self):
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value):  # p.data = p.data.to(torch.bfloat16) (DeepSpeed's cast): raw follows
        torch.Tensor.data.__set__(self, value)
        self.raw = value.raw if is_device_tensor(value) else value


def _unwrap(x):
    if is_device_tensor(x):
        return x.raw
    if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
        return torch.device("cpu")
    return x


def _check_same_device(name: str, flat: list) -> None:
    if name in _CROSS_DEVICE or not any(is_device_tensor(a) for a in flat):
        return
    if name in _INDEX and flat and is_device_tensor(flat[0]):
        return
    host = [a for a in flat if isinstance(a, torch.Tensor) and a.device.type == "cpu"]
    if any(a.dim() > 0 for a in host):  # 0-d host tensors are scalars: CUDA takes them too
        raise RuntimeError(f"{name}: " + _SAME.format(f"{DEVICE_TYPE}:0", "cpu"))


# Factories whose generic kernels allocate an empty tensor and fill it through an out=
# variant that resizes it: a wrapper cannot follow a resize, so they run on the CPU whole.
_COMPOSITE_FACTORIES = ("arange", "arange.start", "arange.start_step", "linspace", "logspace",
                        "eye", "eye.m", "range", "range.step", "randperm", "tril_indices",
                        "triu_indices")  # fmt: skip


# Copies that bring a device tensor's values to the host, which waits for the device first.
_TO_HOST = {"aten::_to_copy", "aten::copy_"}


# Ops that C++ code runs on device tensors with Python dispatch switched off (torch.tensor
# (data, device=...) copies that way): they need kernels of their own, not the fallback.
_BELOW_PYTHON = ("copy_", "fill_.Scalar", "zero_")


def run(func, args, kwargs):
    name = func._schema.name
    if name.startswith("c10d::"):  # collectives: the group's own device dispatch finds
        with torch._C._DisableTorchDispatch():  # the backend registered for "gpu"
            return func(*args, **kwargs)
    if name.split("::")[-1] in FUNCTIONAL and name.startswith("_c10d_functional::"):
        return functional(func, args, kwargs)  # DTensor's collectives, through the same
    flat, _ = tree_flatten((args, kwargs))
    if name in ("aten::_copy_from", "aten::_copy_from_and_resize"):
        src, dst = _unwrap(args[0]), args[1]
        target = dst.raw if is_device_tensor(dst) else dst
        if name.endswith("resize"):
            target.resize_(src.shape)
        target.copy_(src)
        if not is_device_tensor(dst) and not (len(args) > 2 and args[2]):
            host_waited()  # a blocking copy to the host waits for the device
        return dst
    _check_same_device(name, flat)
    check_as_cuda(func, flat)
    target = kwargs.get("device")
    on_device = (
        (torch.device(target).type == DEVICE_TYPE)
        if target is not None
        else any(is_device_tensor(a) for a in flat)
    )
    touches = on_device or any(is_device_tensor(a) for a in flat)
    if touches:
        check_fork()  # a forked DataLoader worker of a rank that used the device
        device_used()
    check_generator(flat, on_device)
    if not touches:
        # not ours (a meta tensor that torch's Python dispatcher sent here): its own kernel
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(PRIVATEUSE1)):
            return func(*args, **kwargs)
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if name == "aten::_local_scalar_dense" or (
        name in _TO_HOST and not on_device and not kwargs.get("non_blocking")
    ):
        host_waited()  # .item(), .cpu(): the host waits for the device first
    if not on_device:
        return out
    same = {id(a.raw): a for a in flat if is_device_tensor(a)}  # in-place ops return self

    def wrap(x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in same:
            return DeviceTensor(x)
        mine = same[id(x)]
        if mine.shape != x.shape or mine.stride() != x.stride():
            raise NotImplementedError(
                f"stand-in GPU: {name} changed the shape of its output in place; run it on "
                "a tensor of the right shape (helpers.standin cannot follow a resize)"
            )
        return mine

    return tree_map(wrap, out)


_keep: list = []  # the libraries must stay alive for as long as the process


def register_kernels() -> None:
    """Every op on the stand-in device runs ``run`` (on the CPU data behind the tensors)."""
    library = torch.library.Library("_", "IMPL")
    library.fallback(lambda op, *a, **k: run(op, a, k), "PrivateUse1")
    aten = torch.library.Library("aten", "IMPL")
    for name in _COMPOSITE_FACTORIES + _BELOW_PYTHON:
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        aten.impl(name, lambda *a, _op=op, **k: run(_op, a, k), "PrivateUse1")
    _keep.extend([library, aten])
