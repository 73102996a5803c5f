"""torch.autocast on the stand-in GPU, as CUDA casts (autocast_mode.cpp's lists, abridged)."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from helpers.standin.tensor import DEVICE_TYPE

__all__ = ["register_autocast"]

_AUTOCAST_LOWER = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d.input",
                   "conv_transpose3d.input", "linear", "matmul", "mm", "bmm", "addmm", "addbmm",
                   "baddbmm", "addmv", "mv", "prelu", "scaled_dot_product_attention")  # fmt: skip
_AUTOCAST_FP32 = ("softmax.int", "log_softmax.int", "layer_norm", "group_norm", "nll_loss",
                  "cross_entropy_loss", "mse_loss", "binary_cross_entropy_with_logits",
                  "exp", "log", "rsqrt", "sum", "cumsum", "norm.Scalar", "pow.Tensor_Scalar",
                  "smooth_l1_loss", "kl_div")  # fmt: skip
AUTOCAST = torch._C.DispatchKey.AutocastPrivateUse1


def _autocast_kernel(op, to_lower: bool):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(DEVICE_TYPE) if to_lower else torch.float32

        def cast(x):
            floating = isinstance(x, torch.Tensor) and x.is_floating_point()
            return x.to(dtype) if floating and x.device.type == DEVICE_TYPE else x

        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(AUTOCAST)):
            return op(*tree_map(cast, args), **tree_map(cast, kwargs))

    return kernel


def register_autocast() -> None:
    everything = torch.library.Library("_", "IMPL")
    everything.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    aten = torch.library.Library("aten", "IMPL")
    for names, lower in ((_AUTOCAST_LOWER, True), (_AUTOCAST_FP32, False)):
        for name in names:
            base, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
            aten.impl(name, _autocast_kernel(op, lower), "AutocastPrivateUse1")
    _keep.extend([everything, aten])


_keep: list = []  # the libraries must stay alive for as long as the process
