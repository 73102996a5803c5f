"""``python -m helpers.course.bench mfu``: tokens/s and MFU of Llama 2 FSDP + TP on CPU ranks.

MFU (model FLOPs utilisation) = achieved model FLOP/s / peak FLOP/s. There is no datasheet
peak for "one gloo rank on a shared 2-core CPU", so the peak here is measured: every rank
multiplies float32 matrices at the same time as the others (the same contention as in
training) and the median rate is the per-rank peak. On GPUs the training program divides by
its GPU's dense peak for the dtype it computes in (helpers/gpus.py); ``make gpu-check``
records that figure on a site's GPUs.

Megatron-LM reaches 44-52 % of the A100's peak on GPT models (seed 000's table); a tiny model
on CPU ranks reaches far less: gloo collectives and Python overheads dwarf its small matmuls.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from helpers import launch
from helpers.config import parse
from helpers.programs import train_llama as T
from helpers.viz.common import machine_label


@dataclass
class MFUConfig:
    """python -m helpers.course.bench mfu [--world 4 --tp 2 --dim 256 ...]"""

    world: int = 4
    tp: int = 2
    dim: int = 256  # the tiny config's width is 64: too small to measure anything but overhead
    n_layers: int = 2
    batch_size: int = 8
    seq_len: int = 64
    steps: int = 5
    matmul_n: int = 256
    peak_flops: float = 0.0  # per rank; 0 = measure it first (all ranks at once)


def _peak(d, n: int) -> float:
    torch.distributed.barrier()  # all ranks multiply at once: the contention training sees
    peak = T.matmul_flops(n)
    peaks = [torch.zeros(1) for _ in range(d.world_size)]
    torch.distributed.all_gather(peaks, torch.tensor([peak]))
    return statistics.median(float(p) for p in peaks)


def measure_peak(world: int = 4, n: int = 256) -> float:
    """Per-rank float32 matmul FLOP/s with ``world`` ranks multiplying at the same time."""
    return launch.spawn(_peak, world, args=(n,))[0]


def _rank(d, cfg: MFUConfig) -> dict:
    peak = cfg.peak_flops or _peak(d, cfg.matmul_n)
    train_cfg = T.LlamaConfig(
        tp=cfg.tp,
        dim=cfg.dim,
        n_layers=cfg.n_layers,
        batch_size=cfg.batch_size,
        seq_len=cfg.seq_len,
        steps=cfg.steps,
        peak_flops=peak,
        lr=0.05,
    )
    out = T.train(d, train_cfg)
    return {
        k: out[k]
        for k in (
            "tokens_per_s",
            "mfu",
            "peak_flops_per_rank",
            "flops_per_token",
            "losses",
            "step_times",
        )
    }


def measure(cfg: MFUConfig) -> dict:
    """Rank 0's figures (every rank sees the same global throughput)."""
    return launch.spawn(_rank, cfg.world, args=(cfg,), timeout=300)[0]


def main(argv: list[str] | None = None) -> None:
    cfg = parse(MFUConfig, argv)
    out = measure(cfg)
    print(
        f"Llama 2 (dim {cfg.dim}, {cfg.n_layers} layers), FSDP x TP = "
        f"{cfg.world // cfg.tp} x {cfg.tp}, batch {cfg.batch_size} x {cfg.seq_len} tokens"
    )
    print(
        f"  peak (measured float32 matmul, per rank): {out['peak_flops_per_rank'] / 1e9:.2f} "
        "GFLOP/s"
    )
    print(f"  tokens/s: {out['tokens_per_s']:.0f}   MFU: {100 * out['mfu']:.2f} %")
    print(f"  measured on {machine_label('gloo', cfg.world)}; on GPUs use the datasheet peak.")
