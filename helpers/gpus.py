"""The GPUs the workbook's sites use: memory, peak FLOP/s by dtype, native bf16.

One table, read by the programs (MFU), the dry run (does a job fit its GPUs?) and the
cluster profiles (which GPU a job gets). Peaks are dense (no 2:4 sparsity) tensor-core
rates from NVIDIA's datasheets, for the SXM boards the sites run, except the L40S (PCIe):

    A100  "NVIDIA A100 Tensor Core GPU" datasheet: FP32 19.5, TF32 156, BF16/FP16 312 TFLOP/s
    H100  "NVIDIA H100 Tensor Core GPU" datasheet, SXM5: FP32 67, TF32 494.7,
          BF16/FP16 989.4 TFLOP/s (the datasheet's 1,979 assumes sparsity)
    H200  "NVIDIA H200 Tensor Core GPU" datasheet, SXM: the H100's compute, 141 GB HBM3e
    L40S  "NVIDIA L40S" datasheet: FP32 91.6, TF32 183, BF16/FP16 362.05 TFLOP/s
    V100  "NVIDIA Tesla V100" datasheet, SXM2: FP32 15.7, FP16 tensor 125 TFLOP/s; no bf16
          tensor cores (bf16 is emulated: ``is_bf16_supported(including_emulation=False)``
          is False on V100 and T4)

Memory is what ``nvidia-smi`` reports as total (MiB / 1024), a little under the nominal
GB on some boards; the CUDA context, NCCL's buffers and the allocator's slack take a
further ~1-2 GiB, which ``RESERVE_GIB`` stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPU", "GPUS", "RESERVE_GIB", "lookup", "peak_flops", "supports_bf16"]

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
GPUS = {
    "a100-40": GPU("A100-SXM4-40GB", 40.0, _AMPERE, True),
    "a100-80": GPU("A100-SXM4-80GB", 80.0, _AMPERE, True),
    "h100": GPU("H100-SXM5-80GB", 79.6, _HOPPER, True),
    "h200": GPU("H200-SXM-141GB", 140.4, _HOPPER, True),
    "l40s": GPU(
        "L40S-48GB", 45.0, {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}, True
    ),  # fmt: skip
    "v100-16": GPU("V100-SXM2-16GB", 15.8, {"fp32": 15.7, "fp16": 125.0}, False),
    "v100-32": GPU("V100-SXM2-32GB", 31.7, {"fp32": 15.7, "fp16": 125.0}, False),
}
_ALIASES = {"a100": "a100-80", "v100": "v100-32", "": "l40s"}  # Engaging's default GPU is an L40S


def lookup(name: str) -> GPU:
    """A GPU by table key ('h100', 'a100-40'), alias, or device name ('NVIDIA H100 80GB HBM3')."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    for k in sorted(GPUS, key=len, reverse=True):  # device names: match the model number
        model, _, size = k.partition("-")
        if model in key and (not size or size.rstrip("gb") in key.replace("gb", "")):
            return GPUS[k]
    for k, gpu in GPUS.items():
        if k.partition("-")[0] in key:
            return gpu
    raise KeyError(f"unknown GPU {name!r}: add it to helpers/gpus.py (known: {sorted(GPUS)})")


def peak_flops(name: str, dtype: str) -> float:
    return lookup(name).peak(dtype)


def supports_bf16(name: str) -> bool:
    return lookup(name).bf16
