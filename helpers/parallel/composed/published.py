"""The planner against published runs: what the papers measured, what the planner predicts.

    rows = megatron_2021()           Narayanan et al. 2021, Table 1 (seed 000): GPT 1.7B-1T, costed
                                     as Megatron-LM's examples/sc21 scripts ran them
    rows = torchtitan_a100()         torchtitan's Llama 2 and Llama 3 runs on 64 A100-80GB (FSDP2)
    korthikanti_530b()               Korthikanti et al. 2022: 530B with and without recomputation
    figure_17()                      Narayanan et al. section 5.6: 145B with and without it
    h100_record()                    the workbook's own H100 run (notebooks/data/gpu)
    fit_a100_efficiency()            the one fitted number, fitted again

Each row has the published figure, the planner's prediction and its error, whether the
planner finds the layout fits, and for Table 1 the paper's layout without recomputation and
the planner's own pick (``pick``) for the same model, GPUs and batch, with their predicted times.

One number is fitted, once: ``A100_EFFICIENCY``, the fraction of the A100's 312 TFLOP/s a large
bf16 matmul reaches, chosen so that the planner reproduces ONE run (torchtitan's Llama 2 70B
with full recomputation, 353 tokens/s per GPU: ``FIT``). Every other A100 figure is a prediction
from it. The H100's efficiency is fitted the same way to the one Llama run of the H100 record.

Sources (as quoted): Narayanan et al., SC'21, Table 1 and sections 4.1 (scatter/gather), 5.1,
5.5-5.8 (Selene: 8 A100-80GB per node on NVLink/NVSwitch, 8 x 200 Gb/s HDR InfiniBand per node;
eq. 3 counts the recomputed forward); NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh`` and
``CONFIG.sh`` (commit de7dc40, 2021-08-10: ``SC21`` below) with ``megatron/training.py`` and
``schedules.py`` of that commit (torch's DDP is wrapped in ``no_sync`` only without a pipeline;
``local`` all-reduces after the backward); torchtitan ``docs/performance.md`` (April 2024: Llama 2
13B and 70B, Llama 3 70B on 64 A100-80GB with FSDP2, no torch.compile) and its
``train_configs`` of that month (13B ``fused_rmsnorm``, 70B ``rmsnorm``; Llama 3 70B 8,192
tokens, ``rmsnorm``); Korthikanti et al., MLSys 2023 (530B on 2240 A100: 54.2 % MFU against 42.1 %
with full recomputation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from helpers.models import llama2
from helpers.parallel.composed import planner, workloads
from helpers.parallel.composed.mesh import divisors

__all__ = ["Run", "MEGATRON_TABLE_1", "SC21", "A100_EFFICIENCY", "H100_EFFICIENCY", "FIT",
           "LLAMA3_70B", "selene", "megatron_2021", "torchtitan_a100", "korthikanti_530b",
           "h100_record", "fit_a100_efficiency", "figure_17", "gpt_flops"]  # fmt: skip

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
# run_table_1.sh per model: --DDP-impl (torch: PyTorch's DDP, its buckets all-reduced during the
# backward; local: Megatron's, after it) and --num-layers-per-virtual-pipeline-stage (None: 1F1B).
# Every model: --checkpoint-activations (full recomputation), --fp16, sequences of 2,048, and the
# scatter/gather of pipeline sends (on unless --no-scatter-gather-tensors-in-pipeline).
SC21 = {"1.7B": ("torch", None), "3.6B": ("torch", None), "7.5B": ("torch", None),
        "18B": ("torch", None), "39B": ("local", None), "76B": ("local", 5),
        "145B": ("local", 5), "310B": ("local", 3), "530B": ("local", 1), "1T": ("local", None)}  # fmt: skip
# Llama 3 70B's shapes (Meta's params.json: ffn_dim_multiplier 1.3, multiple_of 1024)
LLAMA3_70B = llama2.ModelArgs(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256,
                              multiple_of=1024, ffn_dim_multiplier=1.3, max_seq_len=8192)  # fmt: skip
# torchtitan on 64 A100-80GB, tokens/s per GPU: (name, model, sequence, per GPU, recompute, norm,
# published); 331 for Llama 3 70B (323 in the first edit of the same day, 2024-04-22)
TORCHTITAN = (("Llama 2 13B", llama2.CONFIGS["13B"], 4096, 2, "none", "fused", 2162),
              ("Llama 2 70B", llama2.CONFIGS["70B"], 4096, 2, "full", "torchtitan", 353),
              ("Llama 3 70B", LLAMA3_70B, 8192, 1, "full", "torchtitan", 331))  # fmt: skip
FIT = "Llama 2 70B"  # the row A100_EFFICIENCY is fitted to: not a prediction


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
    no_recompute: planner.Layout | None = None  # the paper's (tp, pp), no recomputation
    fitted: bool = False  # the row the efficiency is fitted to

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1

    @property
    def pick_speedup(self) -> float:
        """How much faster the planner says its pick is than the paper's layout."""
        return self.layout.step_time / self.pick.step_time if self.pick else float("nan")

    @property
    def no_recompute_speedup(self) -> float:
        """The paper's layout without recomputation against the paper's run (nan: no fit)."""
        lay = self.no_recompute
        return self.layout.step_time / lay.step_time if lay and lay.fits else float("nan")


def selene(gpus: int, efficiency: float = A100_EFFICIENCY, overlap: bool = False,
           **cluster) -> planner.Cluster:  # fmt: skip
    """Selene's DGX A100 nodes: 8 A100-80GB on NVSwitch (300 GB/s each way), 8 x 200 Gb/s HDR
    per node (25 GB/s per GPU). ``overlap``: DP's all-reduce during the backward (torch's DDP);
    ``cluster``: other Cluster fields (elementwise_passes, gemm_model, ...)."""
    return planner.Cluster(nodes=gpus // 8, gpus_per_node=8, gpu_memory_gib=80, peak_tflops=312,
                           intra_gbs=300, inter_gbs=25, memory_gbs=2039, efficiency=efficiency,
                           overlap=overlap, name=f"{gpus // 8} x 8 A100-80GB (Selene)",
                           **cluster)  # fmt: skip


def gpt_flops(layers: int, hidden: int, batch: int, seq: int = 2048, vocab: int = 51200,
              recomputed: bool = True) -> float:  # fmt: skip
    """Narayanan et al.'s eq. 3: FLOPs per iteration, the recomputed forward included (HFU's
    count); ``recomputed=False``: the model's FLOPs, 3/4 of the layers' (MFU's count)."""
    layer = 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden))
    logits = 6 * batch * seq * hidden * vocab
    return (layer if recomputed else 3 / 4 * layer) + logits


def _sc21(name: str, c: planner.Cluster, pp: int, overlaps: bool = True):
    """The cluster and memory rules of a pipeline depth as 2021's Megatron-LM ran it: torch's
    DDP (overlapped unless ``overlaps`` is False, its flat bucket copy) without a pipeline, its
    own after the backward."""
    torch_ddp = SC21[name][0] == "torch" if name in SC21 else pp == 1
    fw = "megatron-fp16-torch-ddp" if torch_ddp else "megatron-fp16"
    return replace(c, overlap=torch_ddp and overlaps), fw


def _pick_2021(w, c, batch: int, modes, found: list) -> planner.Layout | None:
    """The fastest layout 2021's software could run: no recomputation or full, 1F1B, torch's
    DDP only without a pipeline (its ``no_sync`` sat in the no-pipeline schedule only), or one of
    ``found`` (the paper's own, interleaved)."""
    found = [lay for lay in found if lay.fits]
    for tp in divisors(c.world_size):
        for pp in divisors(c.world_size // tp):
            cp, fw = _sc21("", c, pp)
            for mode in modes:
                lay = planner.best(w, cp, batch, dp=c.world_size // (tp * pp), tp=tp, pp=pp,
                                   recompute=mode, framework=fw, scatter_gather=True)  # fmt: skip
                found += [lay] if lay.fits else []
    return min(found, key=lambda lay: (round(lay.step_time, 9), lay.memory_gb), default=None)


def megatron_2021(efficiency: float = A100_EFFICIENCY, modes=("none", "full"), picks: bool = True,
                  torch_ddp_overlaps: bool = True, **cluster) -> list[Run]:  # fmt: skip
    """Table 1: each model on the paper's layout as run_table_1.sh ran it (``SC21``), predicted
    TFLOP/s per GPU by eq. 3; with ``picks``, the paper's (tp, pp) without recomputation and the
    planner's pick among what the 2021 software could do (``modes``: recomputation searched).
    ``torch_ddp_overlaps=False``: torch's DDP costed as if its overlap hid nothing."""
    rows = []
    for name, layers, hidden, heads, tp, pp, gpus, mb, batch, tflops in MEGATRON_TABLE_1:
        w = workloads.gpt_2021(layers, hidden, heads, name=f"GPT {name}")
        c, fw = _sc21(name, selene(gpus, efficiency, **cluster), pp, torch_ddp_overlaps)
        per_chunk = SC21[name][1]
        v = layers // pp // per_chunk if per_chunk else 1
        kw = dict(dp=gpus // (tp * pp), tp=tp, pp=pp, framework=fw, scatter_gather=True,
                  schedule="interleaved" if v > 1 else "1f1b", virtual=max(v, 2))  # fmt: skip
        lay = planner.evaluate(w, c, batch, micro_batch=mb, recompute="full", **kw)
        run = Run(f"GPT {name}", "Narayanan et al. 2021, Table 1", tflops,
                  gpt_flops(layers, hidden, batch) / (lay.step_time * gpus) / 1e12,
                  "TFLOP/s per GPU", lay)  # fmt: skip
        if picks:
            run.no_recompute = planner.best(w, c, batch, recompute="none", **kw)
            run.pick = _pick_2021(w, c, batch, modes, [lay, run.no_recompute])
        rows.append(run)
    return rows


def _titan(row, efficiency: float, **cluster) -> Run:
    name, args, seq, per_gpu, recompute, norm, tokens = row
    w = planner.Workload.llama(args, seq, norm=norm, name=name)
    c = planner.Cluster(nodes=8, gpus_per_node=8, gpu_memory_gib=80, peak_tflops=312,
                        memory_gbs=2039, efficiency=efficiency, name="8 x 8 A100-80GB",
                        **cluster)  # fmt: skip
    lay = planner.evaluate(w, c, 64 * per_gpu, dp=64, tp=1, pp=1, micro_batch=per_gpu, zero=3,
                           recompute=recompute)  # fmt: skip
    label = "no recomputation" if recompute == "none" else f"{recompute} recomputation"
    return Run(f"{name}, {label}, {per_gpu} x {seq:,}", "torchtitan (April 2024)", tokens,
               per_gpu * seq / lay.step_time, "tokens/s per GPU", lay,
               fitted=name == FIT)  # fmt: skip


def torchtitan_a100(efficiency: float = A100_EFFICIENCY, **cluster) -> list[Run]:
    """torchtitan's runs on 64 A100-80GB with FSDP2 (tokens/s per GPU), each with the RMSNorm
    its config named: Llama 2 13B without recomputation, 2 sequences per GPU; Llama 2 70B with
    full recomputation, 2 (the fit, ``FIT``); Llama 3 70B with full recomputation, 1 of 8,192."""
    return [_titan(row, efficiency, **cluster) for row in TORCHTITAN]


def fit_a100_efficiency(low: float = 0.3, high: float = 1.0, **cluster) -> float:
    """The efficiency at which the planner reproduces the ``FIT`` run exactly (bisection), with
    the Cluster fields ``cluster`` (to refit it under other rules)."""
    row = next(r for r in TORCHTITAN if r[0] == FIT)
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if _titan(row, mid, **cluster).error < 0 else (low, mid)
    return (low + high) / 2


def korthikanti_530b(efficiency: float = A100_EFFICIENCY) -> dict:
    """530B (tp 8, pp 35, dp 8) on 2240 A100, one sequence per micro-batch, batch 2240, the
    interleaved schedule with one layer a chunk as in the sc21 script (our assumptions), local
    DDP and scatter/gather: full recomputation against sequence parallelism with selective
    recomputation. Published: 54.2 % MFU against 42.1 %, a step 1.29 times shorter. MFU counts
    the model's FLOPs (3 passes: ``gpt_flops(recomputed=False)``) over 312 TFLOP/s a GPU."""
    c = selene(2240, efficiency)
    w = workloads.gpt_2021(105, 20480, 128, name="GPT 530B")
    sp = replace(w, blocks=tuple(replace(b, act_replicated=0.0) for b in w.blocks))
    kw = dict(dp=8, tp=8, pp=35, micro_batch=1, schedule="interleaved", virtual=3,
              scatter_gather=True)  # fmt: skip
    full = planner.evaluate(w, c, 2240, recompute="full", **kw)
    selective = planner.evaluate(sp, c, 2240, recompute="selective", **kw)
    model = gpt_flops(105, 20480, 2240, recomputed=False) / (2240 * 312e12)
    return {
        "full": full,
        "selective": selective,
        "published": 54.2 / 42.1,
        "predicted": full.step_time / selective.step_time,
        "mfu": {"full": model / full.step_time, "selective": model / selective.step_time},
        "published_mfu": {"full": 0.421, "selective": 0.542},
    }


def figure_17(batches=(2, 4, 8, 16, 32, 64, 128, 256), micro_batch: int = 2) -> list[dict]:
    """Narayanan et al.'s section 5.6 (Figure 17): GPT 145B on 128 A100, (t, p) = (8, 16), a
    range of batch sizes, with and without full recomputation, in sequences per second (nan:
    does not fit). The figure's micro-batch is not given: Table 1's for 145B, 2, by default."""
    w = workloads.gpt_2021(80, 12288, 96, name="GPT 145B")
    c = selene(128)
    rows = []
    for batch in batches:
        row = {"batch": batch}
        for mode in ("none", "full"):
            lay = planner.evaluate(w, c, batch, dp=1, tp=8, pp=16, micro_batch=micro_batch,
                                   recompute=mode, framework="megatron-fp16", scatter_gather=True)  # fmt: skip
            row[mode] = batch / lay.step_time if lay.fits else float("nan")
            row[mode + "_gb"] = lay.memory_gb
        rows.append(row)
    return rows


def h100_record(efficiency: float = H100_EFFICIENCY) -> planner.Layout:
    """The H100 record's Llama run (helpers/programs/train_llama.py on one H100 80GB: Llama 2 7B
    widths, 4 layers, 8 x 2,048 tokens, FSDP2 with a bf16 policy over one rank, SGD without
    momentum), as the planner costs it. Measured: 24.05 GiB peak, 68,677 tokens/s."""
    from helpers import gpus
    from helpers.parallel.composed import frameworks

    w = planner.Workload.llama(llama2.config("7B", n_layers=4), 2048, name="Llama 2 7B x 4")
    sgd = replace(frameworks.lookup("fsdp2-bf16"), name="fsdp2-bf16, SGD", moments=0)
    c = planner.Cluster(1, 1, gpu_memory_gib=gpus.lookup("h100").memory_gib, peak_tflops=989.4,
                        memory_gbs=3350, efficiency=efficiency, name="1 x H100 80GB")  # fmt: skip
    return planner.evaluate(w, c, 8, dp=1, tp=1, pp=1, micro_batch=8, zero=3, framework=sgd)
