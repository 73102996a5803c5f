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

Autocast's default dtype is CUDA's (float16) already: PrivateUse1's default.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["take_cuda_paths", "check_as_cuda", "CUBLAS_MESSAGE"]

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
