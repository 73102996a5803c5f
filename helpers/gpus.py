"""The GPUs the workbook's sites use: memory, peak FLOP/s by dtype, native bf16.

One table, read by the programs (MFU), the dry run (does a job fit its GPUs?) and the
cluster profiles (which GPU a job gets). Peaks are dense (no 2:4 sparsity) tensor-core
rates from NVIDIA's datasheets (which print the sparse rate, twice the dense one, with an
asterisk): the SXM boards the sites run, and the PCIe, NVL and superchip boards an instructor
may meet:

    A100  "NVIDIA A100 Tensor Core GPU" datasheet: FP32 19.5, TF32 156, BF16/FP16 312 TFLOP/s
    H100  "NVIDIA H100 Tensor Core GPU" datasheet, SXM5: FP32 67, TF32 494.7,
          BF16/FP16 989.4 TFLOP/s (the datasheet's 1,979 assumes sparsity)
    H100 PCIe  same datasheet, PCIe: FP32 51, TF32 378, BF16/FP16 756.5 (1,513 sparse), 80 GB
    H100 NVL   same datasheet, NVL: FP32 60, TF32 417.5, BF16/FP16 835.5 (1,671 sparse), 94 GB
    H200  "NVIDIA H200 Tensor Core GPU" datasheet, SXM: the H100's compute, 141 GB HBM3e;
          H200 NVL: the H100 NVL's rates (BF16 1,671 sparse), 141 GB
    GH200 "NVIDIA GH200 Grace Hopper Superchip" datasheet: the H100 SXM's rates (BF16 1,979
          sparse), 96 GB HBM3 or 144 GB HBM3e beside the Grace CPU's 480 GB (not the H200)
    L40S  "NVIDIA L40S" datasheet: FP32 91.6, TF32 183, BF16/FP16 362.05 TFLOP/s
    L40   "NVIDIA L40" datasheet: FP32 90.5, TF32 90.5, BF16/FP16 181 TFLOP/s (362 sparse)
    A40   "NVIDIA A40" datasheet: FP32 37.4, TF32 74.8, BF16/FP16 149.7 TFLOP/s (299.4 sparse)
    T4    "NVIDIA T4" datasheet: FP32 8.1, FP16 tensor 65 TFLOP/s; no bf16 or tf32 (Turing)
    V100  "NVIDIA Tesla V100" datasheet, SXM2: FP32 15.7, FP16 tensor 125 TFLOP/s; no bf16
          tensor cores (bf16 is emulated: ``is_bf16_supported(including_emulation=False)``
          is False on V100 and T4)

Memory is what ``nvidia-smi`` reports as total (MiB / 1024), a little under the nominal
GB on some boards; the CUDA context, NCCL's buffers and the allocator's slack take a
further ~1-2 GiB, which ``RESERVE_GIB`` stands for. Boards not checked with nvidia-smi
here (H100 NVL, GH200, L40, A40, T4) are their nominal GB less what the H100 loses (80 GB ->
79.6 GiB) or, with ECC on GDDR, about 4 %.

A GPU not in the table (``find`` returns None; ``lookup`` raises KeyError naming the table)
has no known peak: ``train_llama`` then trains and says "MFU: unknown peak for <name>".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GPU", "GPUS", "RESERVE_GIB", "find", "lookup", "peak_flops", "supports_bf16"]

RESERVE_GIB = 2.0  # CUDA context + NCCL buffers + allocator slack, per GPU


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    tflops: dict  # dtype name -> dense peak TFLOP/s: fp32 (no tensor cores), tf32, bf16, fp16
    bf16: bool  # native bf16 tensor cores

    def peak(self, dtype: str) -> float:
        """FLOP/s for the dtype a program trains in ('fp32', 'tf32', 'bf16', 'fp16')."""
        if dtype not in self.tflops:
            raise ValueError(f"{self.name} has no {dtype} rate; known: {sorted(self.tflops)}")
        return self.tflops[dtype] * 1e12


_AMPERE = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}
_HOPPER = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}
_HOPPER_PCIE = {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}
_HOPPER_NVL = {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}
GPUS = {
    "a100-40": GPU("A100-SXM4-40GB", 40.0, _AMPERE, True),
    "a100-80": GPU("A100-SXM4-80GB", 80.0, _AMPERE, True),
    "h100": GPU("H100-SXM5-80GB", 79.6, _HOPPER, True),
    "h100-pcie": GPU("H100-PCIe-80GB", 79.6, _HOPPER_PCIE, True),
    "h100-nvl": GPU("H100-NVL-94GB", 93.0, _HOPPER_NVL, True),
    "h200": GPU("H200-SXM-141GB", 140.4, _HOPPER, True),
    "h200-nvl": GPU("H200-NVL-141GB", 140.4, _HOPPER_NVL, True),
    "gh200": GPU("GH200-96GB", 94.5, _HOPPER, True),
    "gh200-144": GPU("GH200-144GB-HBM3e", 142.5, _HOPPER, True),
    "l40s": GPU(
        "L40S-48GB", 45.0, {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}, True
    ),  # fmt: skip
    "l40": GPU("L40-48GB", 45.0, {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0}, True),
    "a40": GPU("A40-48GB", 45.0, {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7}, True),
    "t4": GPU("T4-16GB", 14.7, {"fp32": 8.1, "fp16": 65.0}, False),
    "v100-16": GPU("V100-SXM2-16GB", 15.8, {"fp32": 15.7, "fp16": 125.0}, False),
    "v100-32": GPU("V100-SXM2-32GB", 31.7, {"fp32": 15.7, "fp16": 125.0}, False),
}
_ALIASES = {"a100": "a100-80", "v100": "v100-32", "": "l40s"}  # Engaging's default GPU is an L40S


def find(name: str) -> GPU | None:
    """A GPU by table key ('h100', 'a100-40'), alias, or device name ('NVIDIA H100 80GB HBM3',
    'NVIDIA H100 PCIe', 'NVIDIA GH200 480GB'); None for a GPU the table does not know."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    words = set(re.split(r"[\s_-]+", key))
    for k in sorted(GPUS, key=len, reverse=True):  # device names: the model, then its variant
        model, _, variant = k.partition("-")
        if model in words and (not variant or words & {variant, variant + "g", variant + "gb"}):
            return GPUS[k]
    return None


def lookup(name: str) -> GPU:
    """``find``, raising KeyError for a GPU the table does not know."""
    gpu = find(name)
    if gpu is None:
        raise KeyError(f"unknown GPU {name!r}: add it to helpers/gpus.py (known: {sorted(GPUS)})")
    return gpu


def peak_flops(name: str, dtype: str) -> float:
    return lookup(name).peak(dtype)


def supports_bf16(name: str) -> bool:
    return lookup(name).bf16
