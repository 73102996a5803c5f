"""The PyTorch APIs that moved between the workbook's floor (torch 2.6) and its pin (2.14).

One module owns every renamed or new API, so a program runs unchanged on a site's older
PyTorch module: ask here instead of writing ``getattr(torch..., "new", None) or old``.
``tests/unit/test_torch_floor.py`` fails when workbook code names a torch API that the floor
lacks outside this module.
"""

from __future__ import annotations

import inspect
import sys

import torch
import torch.distributed as tdist

__all__ = [
    "FLOOR", "REPLACES", "at_floor", "all_gather_single", "reduce_scatter_single", "allow_tf32",
    "tf32_allowed", "set_reduce_scatter_buffers", "ddp_buffer_sync", "checkpoint_save_options",
    "distribute_local", "grouped_mm",
]  # fmt: skip

FLOOR = "2.6"  # the oldest torch the workbook supports on clusters (README, "Minimum PyTorch")

# What to use here instead of a name newer than the floor (the floor check's advice), by the
# dotted name or the attribute name it flags.
REPLACES = {
    "torch.distributed.all_gather_single": "all_gather_single(out, x)",
    "torch.distributed.reduce_scatter_single": "reduce_scatter_single(out, x)",
    "torch.backends.cudnn.conv": "allow_tf32(enabled) or tf32_allowed()",
    "torch.backends.cuda.matmul.fp32_precision": "allow_tf32(enabled) or tf32_allowed()",
    "fp32_precision": "allow_tf32(enabled) or tf32_allowed()",
    "set_reduce_scatter_max_input_buffers": "set_reduce_scatter_buffers(module, n)",
    "torch.nn.parallel.DistributedDataParallel(forward_sync_buffers=...)": "ddp_buffer_sync(enabled)",
    "torch.distributed.checkpoint.save(no_dist=...)": "checkpoint_save_options()",
    "torch.distributed.checkpoint.load(no_dist=...)": "checkpoint_save_options(load=True)",
    "torch.distributed.tensor.distribute_tensor(src_data_rank=...)": "distribute_local(full, mesh, placements)",
    "torch._grouped_mm": "grouped_mm(a, b, offs)",
}

# torch 2.14 names; torch 2.6 to 2.13 call them all_gather_into_tensor and reduce_scatter_tensor
# (which 2.14 still accepts, with a FutureWarning).
all_gather_single = getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor
reduce_scatter_single = getattr(tdist, "reduce_scatter_single", None) or tdist.reduce_scatter_tensor


def allow_tf32(enabled: bool) -> None:
    """Let (or forbid) cuDNN convolutions and cuBLAS matmuls use TF32 for float32 work.

    torch >= 2.9 says it with ``fp32_precision = "tf32" | "ieee"``; older torch with
    ``allow_tf32``. Either way the setting matters on Ampere and newer GPUs only.
    """
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    if hasattr(conv, "fp32_precision"):
        conv.fp32_precision = matmul.fp32_precision = "tf32" if enabled else "ieee"
    else:
        torch.backends.cudnn.allow_tf32 = matmul.allow_tf32 = enabled


def tf32_allowed() -> dict[str, bool]:
    """{"conv": ..., "matmul": ...}: may cuDNN convolutions / cuBLAS matmuls use TF32 now?"""
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    if hasattr(conv, "fp32_precision"):
        return {"conv": conv.fp32_precision == "tf32", "matmul": matmul.fp32_precision == "tf32"}
    return {"conv": torch.backends.cudnn.allow_tf32, "matmul": matmul.allow_tf32}


def set_reduce_scatter_buffers(module, n: int) -> bool:
    """FSDP2: keep at most ``n`` reduce-scatter inputs alive (torch >= 2.14); False on older
    torch, which keeps its own default."""
    setter = getattr(module, "set_reduce_scatter_max_input_buffers", None)
    if setter is None:
        return False
    setter(n)
    return True


def ddp_buffer_sync(enabled: bool) -> dict:
    """DDP's keyword for syncing buffers at each forward: ``DDP(m, **ddp_buffer_sync(False))``.
    torch 2.14 says ``forward_sync_buffers`` (``broadcast_buffers`` is deprecated there); older
    torch only knows ``broadcast_buffers``."""
    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": enabled}
    return {"broadcast_buffers": enabled}


def checkpoint_save_options(load: bool = False) -> dict:
    """Keywords for ``torch.distributed.checkpoint.save`` (or ``.load`` with ``load=True``):
    ``no_dist`` (newer than 2.6) when this torch has it and no process group exists; older
    torch infers it the same way."""
    import torch.distributed.checkpoint as dcp

    if "no_dist" in inspect.signature(dcp.load if load else dcp.save).parameters:
        return {"no_dist": not (tdist.is_available() and tdist.is_initialized())}
    return {}


def distribute_local(full: torch.Tensor, mesh, placements):
    """A DTensor of ``full``, which every rank holds whole, cut to this rank's placements
    without communication (``src_data_rank=None``, newer than 2.6); older torch scatters rank
    0's copy, which gives the same values when the ranks' copies agree."""
    from torch.distributed.tensor import distribute_tensor

    if "src_data_rank" in inspect.signature(distribute_tensor).parameters:
        return distribute_tensor(full, mesh, placements, src_data_rank=None)
    return distribute_tensor(full, mesh, placements)


_GROUPED_MM_RUNS: dict[str, bool] = {}


def _grouped_mm_runs(device: torch.device) -> bool:
    """Does torch._grouped_mm run bfloat16 on this kind of device? (Asked once per device type:
    CPU kernels came after the CUDA ones, and a GPU before Hopper may lack them.)"""
    if device.type not in _GROUPED_MM_RUNS:
        try:
            a = torch.ones(16, 8, dtype=torch.bfloat16, device=device)
            b = torch.ones(1, 8, 8, dtype=torch.bfloat16, device=device)
            torch._grouped_mm(a, b, offs=torch.tensor([16], dtype=torch.int32, device=device))
            _GROUPED_MM_RUNS[device.type] = True
        except (RuntimeError, NotImplementedError):
            _GROUPED_MM_RUNS[device.type] = False
    return _GROUPED_MM_RUNS[device.type]


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The rows of a [M, K], in G groups that end at offs [G] (int32, cumulative), each group g
    times b[g] [K, N]: one grouped GEMM (``torch._grouped_mm``, newer than 2.6: bfloat16, rows
    a multiple of 16 bytes) where this torch and device run it, otherwise one product per
    group (which reads offs on the host: a sync on a GPU). Rows past offs[-1] come out zero
    here and undefined from the grouped GEMM: leave them unused."""
    fn = getattr(torch, "_grouped_mm", None)
    if (fn is not None and a.dtype == b.dtype == torch.bfloat16 and a.shape[-1] % 8 == 0
            and b.shape[-1] % 8 == 0 and _grouped_mm_runs(a.device)):  # fmt: skip
        return fn(a, b, offs=offs)
    outs, start = [], 0
    for g, end in enumerate(offs.tolist()):
        outs.append(a[start:end] @ b[g])
        start = end
    outs.append(a.new_zeros(len(a) - start, b.shape[-1]))
    return torch.cat(outs)


def at_floor(version: str) -> bool:
    """Is torch ``version`` ("2.6.0+cu124", "2.14.1") at or above the workbook's FLOOR?"""
    have = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
    return have >= tuple(int(p) for p in FLOOR.split("."))


def main() -> int:
    """``python -m helpers.compat``: exit 1, saying so, when this torch is older than the floor
    (the cluster profiles' job scripts run it after loading the site's PyTorch module)."""
    if at_floor(torch.__version__):
        print(f"torch {torch.__version__}: at or above the workbook's floor, torch {FLOOR}")
        return 0
    print(f"torch {torch.__version__} is older than the workbook's floor, torch {FLOOR}: load a newer "
          "PyTorch module (README, 'Minimum PyTorch on clusters')", file=sys.stderr)  # fmt: skip
    return 1


if __name__ == "__main__":
    sys.exit(main())
