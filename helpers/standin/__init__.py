"""A stand-in GPU for CPU machines: check a program's GPU code path without a GPU.

Two modes, chosen by ``$WORKBOOK_DEVICE_CHECK`` and set up by ``helpers.dist.init()``:

``strict``  the ranks are real processes on CPU, but ``d.device`` is ``gpu:0``, a device
            whose tensors hold CPU data (:class:`DeviceTensor`). The process group is the
            "standin" backend: gloo underneath, registered for the ``gpu`` device only, so a
            collective on a host tensor fails exactly as NCCL fails
            (``No backend type associated with device type cpu``), and an operation that
            mixes a device tensor with a host tensor that is not a 0-d scalar fails as CUDA
            does (``Expected all tensors to be on the same device``). The group also keeps
            NCCL's order (``helpers.standin.ordering``, ``nccl_order``): a rank's operations
            in a group complete in the order it posted them, a send only against its
            receive, a ``batch_isend_irecv`` as one group; a program that would hang on
            NCCL (each rank ``isend`` then ``recv``) fails within a second, naming each
            rank's line and the fix, and every collective is compared across the ranks
            (kind, order, shapes, dtypes): a mismatch or a skipped call fails naming both
            ranks' lines, not at a timeout.
``fake``    one process plays one rank of a large job: the "dryrun" backend answers every
            collective locally (as if each rank had sent what this one sent), and
            ``helpers.course.dryrun`` runs the program under fake tensors on the ``gpu``
            device, so a 7B model is built, sharded and stepped without memory. The rank
            notes its operations in order (``OPS``): the dry run checks them against NCCL's
            rules for the ranks it does not run.

In both, torch chooses for the stand-in what it chooses for CUDA where CUDA's choice differs
from the CPU's (``helpers.standin.cuda_rules``): the optimizers' foreach implementation,
pinned loader batches, and CUDA's refusals (operands of a matrix product in two dtypes, cuBLAS
under deterministic algorithms without ``$CUBLAS_WORKSPACE_CONFIG``, a device draw from a host
generator, the device in a forked DataLoader worker, a collective on a non-contiguous tensor,
a receive from any source, a CUDA event read before the host waited for it).

A DeepSpeed program gets the stand-in GPU too: ``helpers.dist.init()`` gives DeepSpeed an
accelerator whose device is ``gpu`` (``helpers.standin.ds_accelerator``).

Both rename PyTorch's PrivateUse1 backend to ``gpu`` through the Python backend hook
(``torch.utils.backend_registration._setup_privateuseone_for_python_backend``). That hook
gives one device index only: every rank sees ``gpu:0``, as a rank does whose job binds
one GPU to each task. Set ``$WORKBOOK_STANDIN_GPU`` (h100, a100-40, l40s, v100-32, ...)
to make the device claim that GPU's name, bf16 support and memory.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as tdist

from helpers.standin.autocast import register_autocast
from helpers.standin.cuda_rules import DeviceGenerator, take_cuda_paths
from helpers.standin.ds_accelerator import collectives_through_torch as deepspeed_through_torch
from helpers.standin.ds_accelerator import install_if_imported as use_for_deepspeed
from helpers.standin.groups import OPS, POINT_TO_POINT, dryrun_backend_class, standin_backend_class
from helpers.standin.module import GpuModule
from helpers.standin.tensor import DEVICE_TYPE, DeviceTensor, device, register_kernels

__all__ = ["MODE_ENV", "GPU_ENV", "DEVICE_TYPE", "DeviceTensor", "POINT_TO_POINT", "OPS", "install",
           "mode", "device", "use_for_deepspeed", "deepspeed_through_torch"]  # fmt: skip

MODE_ENV = "WORKBOOK_DEVICE_CHECK"  # "strict" or "fake"
GPU_ENV = "WORKBOOK_STANDIN_GPU"  # which GPU the stand-in claims to be
_installed: list[str] = []


def mode() -> str:
    """'strict', 'fake' or '' (a normal run)."""
    value = os.environ.get(MODE_ENV, "")
    if value not in ("", "strict", "fake"):
        raise ValueError(f"{MODE_ENV}={value!r}: use 'strict', 'fake' or leave it unset")
    return value


def install(gpu: str | None = None) -> None:
    """Register the ``gpu`` device and the "standin" and "dryrun" backends (once a process)."""
    if _installed:
        return
    from torch.utils.backend_registration import (  # floor: ok (the dry run's stand-in GPU runs on the pinned torch, never on a cluster's)
        _setup_privateuseone_for_python_backend,
    )

    gpu = gpu or os.environ.get(GPU_ENV, "h100")
    _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=GpuModule(gpu))
    register_autocast()
    take_cuda_paths(DeviceTensor)  # optimizers' foreach, pinning: as on CUDA
    torch.Generator = DeviceGenerator  # torch.Generator(device=d.device) works, and is checked
    if mode() != "fake":  # fake tensors carry no data: the kernels that run on it are not needed
        register_kernels()
    standin, dryrun = standin_backend_class(), dryrun_backend_class()
    tdist.Backend.register_backend(
        "standin", lambda store, rank, size, timeout: standin(store, rank, size, timeout),
        devices=[DEVICE_TYPE],
    )  # fmt: skip
    tdist.Backend.register_backend(
        "dryrun", lambda store, rank, size, timeout: dryrun(rank, size),
        devices=["cpu", DEVICE_TYPE],
    )  # fmt: skip
    _installed.append(gpu)
