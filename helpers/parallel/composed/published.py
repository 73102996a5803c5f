"""The planner against published runs: what the papers measured, what the planner predicts.

    rows = megatron_2021()           Narayanan et al. 2021, Table 1 (seed 000): GPT 1.7B-1T
    rows = torchtitan_a100()         torchtitan's Llama 2 runs on 64 A100-80GB (FSDP2)
    korthikanti_530b()               Korthikanti et al. 2022: 530B with and without recomputation
    h100_record()                    the workbook's own H100 run (notebooks/data/gpu)

Each row has the published figure, the planner's prediction and its error, whether the
planner finds the layout fits, and (``pick``) the planner's own layout for the same model,
GPUs and batch, with both predicted step times.

One number is fitted, once: ``A100_EFFICIENCY``, the fraction of the A100's 312 TFLOP/s a large
bf16 matmul reaches, chosen so that the planner reproduces ONE run (torchtitan's Llama 2 70B
with full recomputation, 353 tokens/s per GPU). Every other A100 figure is a prediction from
it. The H100's efficiency is fitted the same way to the one Llama run of the H100 record.

Sources (as quoted): Narayanan et al., SC'21, Table 1 and sections 5.1, 5.5-5.8 (fp16,
Selene: 8 A100-80GB per node on NVLink/NVSwitch, 8 x 200 Gb/s HDR InfiniBand per node; the
interleaved schedule; eq. 3 counts the recomputed forward); seed 000 for the micro-batch
sizes; torchtitan docs/performance.md (April 2024: FSDP2, batch 2 x 4096 for 13B, Llama 2 on
64 A100-80GB, ``fused_rmsnorm``, no torch.compile; December 2024: Llama 3.1 8B on 8 and 128
H100); Korthikanti et al., MLSys 2023 (530B on 2240 A100: 54.2 % MFU against 42.1 % with full
recomputation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from helpers.models import llama2
from helpers.parallel.composed import planner, workloads

__all__ = ["Run", "MEGATRON_TABLE_1", "A100_EFFICIENCY", "H100_EFFICIENCY", "selene",
           "megatron_2021", "torchtitan_a100", "korthikanti_530b", "h100_record",
           "gpt_flops", "interleave"]  # fmt: skip

A100_EFFICIENCY = planner.A100_EFFICIENCY  # fitted to torchtitan's Llama 2 70B run (tested)
H100_EFFICIENCY = planner.H100_EFFICIENCY  # fitted to the H100 record's Llama run (eager)

# name, layers, hidden, heads, tp, pp, GPUs, micro-batch, batch, TFLOP/s per GPU (published)
MEGATRON_TABLE_1 = (
    ("1.7B", 24, 2304, 24, 1, 1, 32, 16, 512, 137),
    ("3.6B", 30, 3072, 32, 2, 1, 64, 16, 512, 138),
    ("7.5B", 36, 4096, 32, 4, 1, 128, 16, 512, 142),
    ("18B", 40, 6144, 48, 8, 1, 256, 8, 1024, 135),
    ("39B", 48, 8192, 64, 8, 2, 512, 4, 1536, 138),
    ("76B", 60, 10240, 80, 8, 4, 1024, 2, 1792, 140),
    ("145B", 80, 12288, 96, 8, 8, 1536, 2, 2304, 148),
    ("310B", 96, 16384, 128, 8, 16, 1920, 1, 2160, 155),
    ("530B", 105, 20480, 128, 8, 35, 2520, 1, 2520, 163),
    ("1T", 128, 25600, 160, 8, 64, 3072, 1, 3072, 163),
)


@dataclass
class Run:
    """One published run beside the planner's view of it."""

    name: str
    source: str
    published: float  # the paper's figure (unit in ``unit``)
    predicted: float
    unit: str
    layout: planner.Layout  # the paper's layout, costed
    pick: planner.Layout | None = None  # the planner's own, for the same model, GPUs, batch

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1

    @property
    def pick_speedup(self) -> float:
        """How much faster the planner says its pick is than the paper's layout."""
        return self.layout.step_time / self.pick.step_time if self.pick else float("nan")


def selene(
    gpus: int, efficiency: float = A100_EFFICIENCY, overlap: bool = False
) -> planner.Cluster:
    """Selene's DGX A100 nodes: 8 A100-80GB on NVSwitch (300 GB/s each way), 8 x 200 Gb/s HDR
    per node (25 GB/s per GPU). Megatron-LM 2021 all-reduced the gradients after the backward
    (``overlap=False``)."""
    return planner.Cluster(nodes=gpus // 8, gpus_per_node=8, gpu_memory_gb=80, peak_tflops=312,
                           intra_gbs=300, inter_gbs=25, memory_gbs=2039, efficiency=efficiency,
                           overlap=overlap, name=f"{gpus // 8} x 8 A100-80GB (Selene)")  # fmt: skip


def gpt_flops(layers: int, hidden: int, batch: int, seq: int = 2048, vocab: int = 51200) -> float:
    """Narayanan et al.'s eq. 3: FLOPs per iteration, the recomputed forward included."""
    return (
        96
        * batch
        * seq
        * layers
        * hidden**2
        * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    )


def interleave(layers: int, pp: int, micro_batches: int) -> int:
    """The v of the interleaved schedule: the smallest v > 1 that divides a stage's layers
    (the paper ran interleaving without giving v); 1 where it cannot interleave."""
    if pp == 1 or micro_batches % pp:
        return 1
    return next((v for v in range(2, layers // pp + 1) if (layers // pp) % v == 0), 1)


def megatron_2021(efficiency: float = A100_EFFICIENCY, modes=("none", "full")) -> list[Run]:
    """Table 1: each model on the paper's layout (full recomputation, interleaved where the
    layers allow), predicted TFLOP/s per GPU by eq. 3, and the planner's pick among what the
    2021 software could do (``modes``: no recomputation or full; 1F1B)."""
    rows = []
    for name, layers, hidden, heads, tp, pp, gpus, mb, batch, tflops in MEGATRON_TABLE_1:
        w = workloads.gpt_2021(layers, hidden, heads, name=f"GPT {name}")
        c, dp = selene(gpus, efficiency), gpus // (tp * pp)
        v = interleave(layers, pp, batch // (dp * mb))
        lay = planner.evaluate(w, c, batch, dp=dp, tp=tp, pp=pp, micro_batch=mb,
                               recompute="full", virtual=v,
                               schedule="interleaved" if v > 1 else "1f1b")  # fmt: skip
        flops = gpt_flops(layers, hidden, batch)
        picks = [p for m in modes for p in planner.plan(w, c, batch, recompute=m)]
        pick = min(picks, key=lambda p: p.step_time) if picks else None
        rows.append(Run(f"GPT {name}", "Narayanan et al. 2021, Table 1", tflops,
                        flops / (lay.step_time * gpus) / 1e12, "TFLOP/s per GPU", lay, pick))  # fmt: skip
    return rows


def torchtitan_a100(efficiency: float = A100_EFFICIENCY) -> list[Run]:
    """torchtitan's Llama 2 runs on 64 A100-80GB with FSDP2 (tokens/s per GPU): 13B with no
    recomputation and 2 sequences per GPU, 70B with full recomputation and 2 (the fit)."""
    c = planner.Cluster(nodes=8, gpus_per_node=8, gpu_memory_gb=80, peak_tflops=312,
                        memory_gbs=2039, efficiency=efficiency, name="8 x 8 A100-80GB")  # fmt: skip
    rows = []
    for size, recompute, tokens in (("13B", "none", 2162), ("70B", "full", 353)):
        w = planner.Workload.llama(llama2.CONFIGS[size], 4096, norm="fused", name=f"Llama 2 {size}")
        lay = planner.evaluate(w, c, 128, dp=64, tp=1, pp=1, micro_batch=2, zero=3,
                               recompute=recompute)  # fmt: skip
        label = "no recomputation" if recompute == "none" else f"{recompute} recomputation"
        rows.append(Run(f"Llama 2 {size}, {label}", "torchtitan (April 2024)",
                        tokens, 2 * 4096 / lay.step_time, "tokens/s per GPU", lay))  # fmt: skip
    return rows


def korthikanti_530b(efficiency: float = A100_EFFICIENCY) -> dict:
    """530B (tp 8, pp 35, dp 8) on 2240 A100, one sequence per micro-batch, batch 2240 (our
    assumption): full recomputation against sequence parallelism with selective recomputation.
    Published: 54.2 % MFU against 42.1 %, a step 1.29 times shorter."""
    c = selene(2240, efficiency)
    w = workloads.gpt_2021(105, 20480, 128, name="GPT 530B")
    sp = replace(w, blocks=tuple(replace(b, act_replicated=0.0) for b in w.blocks))
    kw = dict(dp=8, tp=8, pp=35, micro_batch=1, schedule="interleaved", virtual=3)
    full = planner.evaluate(w, c, 2240, recompute="full", **kw)
    selective = planner.evaluate(sp, c, 2240, recompute="selective", **kw)
    return {
        "full": full,
        "selective": selective,
        "published": 54.2 / 42.1,
        "predicted": full.step_time / selective.step_time,
    }


def h100_record(efficiency: float = H100_EFFICIENCY) -> planner.Layout:
    """The H100 record's Llama run (helpers/programs/train_llama.py on one H100 80GB: Llama 2 7B
    widths, 4 layers, 8 x 2,048 tokens, FSDP2 with a bf16 policy over one rank, SGD without
    momentum), as the planner costs it. Measured: 24.05 GiB peak, 68,677 tokens/s."""
    from helpers.parallel.composed import frameworks

    w = planner.Workload.llama(llama2.config("7B", n_layers=4), 2048, name="Llama 2 7B x 4")
    sgd = replace(frameworks.lookup("fsdp2-bf16"), name="fsdp2-bf16, SGD", moments=0)
    c = planner.Cluster(1, 1, gpu_memory_gb=80, peak_tflops=989.4, memory_gbs=3350,
                        efficiency=efficiency, name="1 x H100 80GB")  # fmt: skip
    return planner.evaluate(w, c, 8, dp=1, tp=1, pp=1, micro_batch=8, zero=3, framework=sgd)
