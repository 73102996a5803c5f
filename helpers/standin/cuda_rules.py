"""Where CUDA chooses or refuses differently from the CPU, the stand-in GPU does as CUDA does.

PyTorch picks some paths by device type. On the CPU a program takes paths a GPU never takes,
so a check on CPU ranks must be told to take the GPU's:

* **optimizers' foreach**: ``torch.optim``'s default implementation is chosen by
  ``torch.optim.optimizer._default_to_fused_or_foreach``: ``foreach`` when every parameter's
  type is in ``_foreach_supported_types`` and its device type is a foreach device (CUDA and
  the PrivateUse1 backend, which the stand-in is). The stand-in's tensors (``DeviceTensor``
  in strict mode, ``FakeTensor`` in fake mode) are counted as supported types, so torch's own
  decision comes out as on CUDA, and a ``foreach=`` or ``fused=`` argument is still obeyed.
  (No optimizer of torch 2.14 defaults to ``fused``; ``fused=True`` runs the fused kernel.)
  ``clip_grad_norm_`` and friends ask the same list (``torch.utils._foreach_utils``).
* **dtypes of a matrix product or a convolution**: CUDA refuses fp32 inputs with bf16
  weights (``mat1 and mat2 must have the same dtype``); fake mode's shape functions do not
  look, so the dry run checks them here.
* **cuBLAS under torch.use_deterministic_algorithms(True)**: CUDA's torch (2.6, the
  workbook's floor, to the releases before pytorch/pytorch#161749) refuses a matrix product
  unless ``$CUBLAS_WORKSPACE_CONFIG`` is ``:4096:8`` or ``:16:8``; so does the stand-in.
* **pinned memory**: a DataLoader feeding a GPU pins its host batches. The stand-in has no
  page-locked allocator: pinning a host tensor is a copy that ``is_pinned()`` then reports
  pinned (FSDP2's CPU offload pins its shards once and asks again before each copy), and
  pinning a tensor already on the device fails as on CUDA.

* **generators live on a device**: CUDA refuses a device draw from a host generator
  (``torch.randn(n, device=gpu, generator=torch.Generator())``: "Expected a 'cuda' device
  type for generator but found 'cpu'") and a host draw from a device one. The stand-in has
  no generator of its own, so ``torch.Generator(device=d.device)`` makes a host generator that
  says it is on the device (``DeviceGenerator``), and the rule is checked on every draw.
* **no device in a forked process**: a DataLoader worker is forked from the rank; once the
  rank has used CUDA, the worker cannot ("Cannot re-initialize CUDA in forked subprocess").
  The stand-in refuses any device operation in a process forked after the rank used its
  device (``forked_worker`` plays a worker's fetch for a dry-run rank, which runs none).

Autocast's default dtype is CUDA's (float16) already: PrivateUse1's default.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["take_cuda_paths", "check_as_cuda", "CUBLAS_MESSAGE", "check_generator", "FORK_MESSAGE",
           "forked_worker", "check_fork", "device_used", "DeviceGenerator"]  # fmt: skip

_GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::addmv",
         "aten::mv", "aten::dot", "aten::vdot", "aten::_addmm_activation", "aten::addr"}  # fmt: skip
_ADDED_TO = {"aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::addmv",
             "aten::_addmm_activation", "aten::addr"}  # fmt: skip
_CONV = {"aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d",
         "aten::conv3d"}  # fmt: skip
CUBLAS_MESSAGE = (
    "Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` "
    "or `at::Context::setDeterministicAlgorithms(true)`, but this operation is not "
    "deterministic because it uses CuBLAS and you have CUDA >= 10.2. To enable deterministic "
    "behavior in this case, you must set an environment variable before running your PyTorch "
    "application: CUBLAS_WORKSPACE_CONFIG=:4096:8 or CUBLAS_WORKSPACE_CONFIG=:16:8. For more "
    "information, go to https://docs.nvidia.com/cuda/cublas/index.html#results-reproducibility"
)
_keep: list = []  # the libraries must stay alive for as long as the process


def take_cuda_paths(device_tensor_type: type) -> None:
    """Make torch choose for the stand-in what it chooses for CUDA (see the module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    for supported in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        for kind in (device_tensor_type, FakeTensor):
            if kind not in supported:
                supported.append(kind)
    _pinning()


_PINNED = WeakIdKeyDictionary()  # the storages of "pinned" copies, while they live


def _pin(self, device=None):
    out = self.clone()
    _PINNED[out.untyped_storage()] = True
    return out


def _pinning() -> None:
    """Pinning a host tensor copies it, and the copy (and its views) answer ``is_pinned()``
    True; a device tensor is refused by ``check_as_cuda``."""
    aten = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # replacing the CPU kernels is the point
        warnings.simplefilter("ignore")
        aten.impl("is_pinned", lambda self, device=None: self.untyped_storage() in _PINNED, "CPU")
        aten.impl("_pin_memory", _pin, "CPU")
    _keep.append(aten)


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16"}.get(dtype, str(dtype).removeprefix("torch."))  # fmt: skip


def check_as_cuda(func, tensors: list) -> None:
    """Raise what CUDA raises for ``func`` on these tensors, where the CPU (or fake mode) would
    go on: operands of a matrix product or convolution in different dtypes, and, on the
    device, cuBLAS under deterministic algorithms without a deterministic workspace."""
    name = func._schema.name
    if name == "aten::_pin_memory" and tensors[0].device.type not in ("cpu", "meta"):
        raise RuntimeError(f"cannot pin '{tensors[0].type()}' only dense CPU tensors can be pinned")
    if name not in _GEMM and name not in _CONV:
        return
    if func._overloadname not in ("default", "out"):  # mm.dtype and friends cast by design
        return
    floating = [t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if name in _ADDED_TO and len(floating) > 2:  # addmm(bias, mat1, mat2): name mat1 first
        floating = floating[1:] + floating[:1]
    dtypes = list(dict.fromkeys(t.dtype for t in floating))
    if len(dtypes) > 1:
        a, b = _dtype_name(dtypes[0]), _dtype_name(dtypes[1])
        if name in _CONV:
            raise RuntimeError(
                f"Input type ({a}) and weight or bias type ({b}) should be the same, as CUDA "
                f"checks ({name})"
            )
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {a} and {b}")
    on_gpu = any(t.device.type not in ("cpu", "meta") for t in floating)
    if on_gpu and name in _GEMM and torch.are_deterministic_algorithms_enabled():
        if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
            if torch.is_deterministic_algorithms_warn_only_enabled():
                warnings.warn(CUBLAS_MESSAGE, stacklevel=2)
            else:
                raise RuntimeError(CUBLAS_MESSAGE)


# -- generators ---------------------------------------------------------------------------

_HOST_GENERATOR = torch.Generator


class _GeneratorType(type(_HOST_GENERATOR)):
    """torch.Generator's type, so that isinstance(torch.default_generator, torch.Generator)
    still holds when torch.Generator is the stand-in's DeviceGenerator."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, _HOST_GENERATOR)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _HOST_GENERATOR)


# The dispatcher hands an operation a new handle on a generator, not the object the program
# made: a stand-in GPU generator is known by its seed instead, whose top 16 bits carry a mark.
_MARK, _LOW = 0xD5A7 << 48, (1 << 48) - 1


def _gpu() -> str:
    """The stand-in's device type ("gpu"): PrivateUse1, as helpers.standin renamed it."""
    return torch._C._get_privateuse1_backend_name()


def _on_gpu(g) -> bool:
    return g.initial_seed() >> 48 == _MARK >> 48


class DeviceGenerator(_HOST_GENERATOR, metaclass=_GeneratorType):
    """``torch.Generator(device=...)`` with the stand-in installed: a host generator, which
    says it is on the stand-in GPU when it was asked for there (it has no generator of its
    own); its draws are checked as CUDA checks them (``check_generator``). Its seed carries a
    mark in its top bits (seeds are taken modulo 2**48)."""

    def __new__(cls, device=None):
        g = _HOST_GENERATOR.__new__(cls)
        g.on_gpu = device is not None and torch.device(device).type not in ("cpu", "meta")
        if g.on_gpu:
            _HOST_GENERATOR.manual_seed(g, _MARK | (_HOST_GENERATOR.initial_seed(g) & _LOW))
        return g

    def __init__(self, device=None):
        pass

    @property
    def device(self) -> torch.device:
        return torch.device(_gpu(), 0) if self.on_gpu else torch.device("cpu")

    def manual_seed(self, seed) -> DeviceGenerator:  # torch's returns a new handle, of its type
        _HOST_GENERATOR.manual_seed(self, _MARK | (int(seed) & _LOW) if self.on_gpu else seed)
        return self

    def seed(self) -> int:
        drawn = _HOST_GENERATOR.seed(self)
        return self.manual_seed(drawn).initial_seed()

    def initial_seed(self) -> int:
        seed = _HOST_GENERATOR.initial_seed(self)
        return seed & _LOW if self.on_gpu else seed

    def set_state(self, state) -> DeviceGenerator:
        _HOST_GENERATOR.set_state(self, state)
        return self


def check_generator(flat: list, on_gpu: bool) -> None:
    """A draw on the GPU from a host generator, or on the host from a GPU one, fails as on CUDA."""
    for g in flat:
        if isinstance(g, _HOST_GENERATOR):
            held = _gpu() if _on_gpu(g) else "cpu"
            wanted = _gpu() if on_gpu else "cpu"
            if held != wanted:
                raise RuntimeError(
                    f"Expected a '{wanted}' device type for generator but found '{held}' (as "
                    "CUDA says for a 'cuda' draw from a host generator): make the generator "
                    "where the numbers are drawn, torch.Generator(device=d.device), or draw on "
                    "the host and move the result, torch.randn(..., generator=g).to(d.device)"
                )


# -- forked processes ----------------------------------------------------------------------

FORK_MESSAGE = (
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you "
    "must use the 'spawn' start method (stand-in GPU: a DataLoader worker is a process forked "
    "from the rank, and may not touch the GPU once the rank has: build each sample on the "
    "host in the dataset, and move the batch to d.device in the training loop, with "
    "DataLoader(..., pin_memory=True) and batch.to(d.device, non_blocking=True))"
)
_STATE = {"used": False, "forked": False}  # the device used in this process; a forked child


def device_used() -> None:
    """The process has run an operation on the stand-in GPU (CUDA is initialised)."""
    _STATE["used"] = True


def _after_fork() -> None:
    _STATE["forked"] = _STATE["used"]


def check_fork() -> None:
    """Refuse a device operation in a process forked after its parent used the device."""
    if _STATE["forked"]:
        raise RuntimeError(FORK_MESSAGE)


def in_bad_fork() -> bool:
    return _STATE["forked"]


@contextlib.contextmanager
def forked_worker():
    """Within the block, device operations fail as in a forked DataLoader worker."""
    before = _STATE["forked"]
    _STATE["forked"] = True
    try:
        yield
    finally:
        _STATE["forked"] = before


os.register_at_fork(after_in_child=_after_fork)
