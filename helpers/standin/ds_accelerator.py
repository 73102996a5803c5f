"""DeepSpeed on the stand-in GPU: an accelerator whose device is ``gpu``, as CUDA's is ``cuda``.

DeepSpeed places its tensors and picks its process group through its own accelerator
(``deepspeed.accelerator.get_accelerator()``): ``cuda`` with NCCL on a GPU node, ``cpu``
with gloo here. Its flat buffers, partitions and gathered weights go to
``get_accelerator().current_device_name()``, so on the CPU accelerator a DeepSpeed job never
touches the stand-in GPU and its GPU path goes unchecked. This accelerator is the CPU one
(no streams) with the device the stand-in's: DeepSpeed's tensors land on ``gpu:0``, and a
host tensor that reaches a collective fails as it does under NCCL. DeepSpeed's CPU Adam (a
C++ kernel it compiles on first use) is done in torch ops, so a check compiles nothing.

It is installed by ``helpers.dist.init()`` when the program has imported deepspeed by then, as
the workbook's DeepSpeed programs do (a program that joins its process group some other way
is refused by the checks: ``helpers.course.dryrun.child``).
"""

from __future__ import annotations

import functools
import sys

import torch

__all__ = ["install_if_imported", "collectives_through_torch"]


def _on_device(dtype) -> property:
    from helpers.standin.tensor import DEVICE_TYPE

    return property(lambda self: functools.partial(torch.tensor, dtype=dtype, device=DEVICE_TYPE))


def _accelerator_class():
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    from helpers.standin.tensor import DEVICE_TYPE

    class StandinAccelerator(CPU_Accelerator):
        def __init__(self, backend: str):
            super().__init__()
            self._communication_backend_name = backend

        def device_name(self, device_index=None):
            # one GPU bound to each task: every rank's is index 0 (DeepSpeed asks for LOCAL_RANK's)
            return DEVICE_TYPE if device_index is None else f"{DEVICE_TYPE}:0"

        def current_device_name(self):
            return f"{DEVICE_TYPE}:0"

        def current_device(self):
            return 0

        def device_count(self):
            return 1

        def on_accelerator(self, tensor):
            return tensor.device.type == DEVICE_TYPE

        # Tensors DeepSpeed makes by type (an overflow flag, a norm) go to the device, as
        # CUDA's accelerator puts them (the CPU one leaves them on the host).
        BFloat16Tensor = _on_device(torch.bfloat16)
        ByteTensor = _on_device(torch.uint8)
        DoubleTensor = _on_device(torch.double)
        FloatTensor = _on_device(torch.float)
        HalfTensor = _on_device(torch.half)
        IntTensor = _on_device(torch.int)
        LongTensor = _on_device(torch.long)

    return StandinAccelerator


def install_if_imported(backend: str) -> bool:
    """Make DeepSpeed use the stand-in GPU, if the program imported it; True if it did.

    Called by ``helpers.dist.init()`` on a checked run: the workbook's DeepSpeed programs
    import ``deepspeed`` first and join the process group before ``deepspeed.initialize``.
    """
    if "deepspeed" not in sys.modules:
        return False
    from deepspeed.accelerator import set_accelerator

    set_accelerator(_accelerator_class()(backend))
    collectives_through_torch()
    _torch_cpu_adam()
    if backend == "dryrun":
        _agree_with_itself()
    return True


def collectives_through_torch() -> bool:
    """DeepSpeed's collectives go through ``torch.distributed`` on CPU ranks, as on GPUs.

    On CPU, DeepSpeed's accelerator swaps its all-reduce for a shared-memory kernel that
    it compiles in C++ on first use (about a minute on 2 cores, in every fresh machine's
    first DeepSpeed run); on GPUs it calls ``torch.distributed``, served by NCCL. Marking
    that kernel unavailable keeps CPU ranks on torch's path (gloo here, the stand-in's
    group in a check): the path a GPU takes, the one the workbook's counters see, and
    nothing to compile. A no-op (False) when the program has not imported deepspeed.
    """
    if "deepspeed" not in sys.modules:
        return False
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return True


def _agree_with_itself() -> None:
    """A rank alone on fake tensors (the "dryrun" group) agrees with itself.

    Values on fake tensors read back as stand-ins (``helpers.course.dryrun.fake``), so
    DeepSpeed's checks that read values back are told what a rank alone knows:

    * ZeRO-3 checks that every rank walks the same modules in the same order by
      broadcasting rank 0's list: rank 0's list is this rank's own (the dryrun group answers
      a broadcast with what this rank sent); the device-strict run checks it on real ranks;
    * ZeRO's overflow check reads a flag back: still computed and all-reduced, but read as
      no overflow, or every step would be skipped and the optimizer's state never made.
    """
    from deepspeed.runtime.zero import stage3, stage_1_and_2, utils

    utils.assert_lst_len_same_as_other_ranks = lambda lst: None
    utils.get_lst_from_rank0 = list
    for cls in (stage3.DeepSpeedZeroOptimizer_Stage3, stage_1_and_2.DeepSpeedZeroOptimizer):
        cls.has_overflow = _no_overflow(cls.has_overflow)


def _no_overflow(has_overflow):
    def checked(self, *args, **kwargs):
        has_overflow(self, *args, **kwargs)
        return False

    return checked


class _CpuAdamInTorch:
    """DeepSpeed's CPU Adam (a C++ kernel compiled on first use, for minutes) in torch ops.

    The same update, in place, on the same host tensors: the placement a check looks at is
    unchanged, nothing is compiled, and on fake tensors nothing reads memory that is not there.
    """

    def __init__(self):
        self.decoupled: dict[int, bool] = {}

    def create_adam(self, opt_id, lr, beta1, beta2, eps, weight_decay, adamw_mode, *_):
        self.decoupled[opt_id] = adamw_mode

    def destroy_adam(self, opt_id):
        self.decoupled.pop(opt_id, None)

    def adam_update(self, opt_id, step, lr, beta1, beta2, eps, weight_decay, bias_correction,
                    param, grad, exp_avg, exp_avg_sq):  # fmt: skip
        decoupled = self.decoupled.get(opt_id, True)
        g = grad.to(exp_avg.dtype)
        if weight_decay and not decoupled:
            g = g + weight_decay * param.to(g.dtype)
        exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        c1, c2 = (1 - beta1**step, 1 - beta2**step) if bias_correction else (1.0, 1.0)
        if weight_decay and decoupled:
            param.mul_(1 - lr * weight_decay)
        update = exp_avg / ((exp_avg_sq / c2).sqrt_().add_(eps))
        param.add_(update.to(param.dtype), alpha=-lr / c1)


class _CpuAdamBuilder:
    def load(self):
        return _CpuAdamInTorch()


def _torch_cpu_adam() -> None:
    from deepspeed.ops.adam import cpu_adam

    cpu_adam.CPUAdamBuilder = _CpuAdamBuilder
