"""The planner: seed 000's 2 x 8 grouping, and clear refusals."""

from dataclasses import replace

import pytest

from helpers.models import llama2
from helpers.parallel.composed import planner as P
from helpers.parallel.composed import workloads
from helpers.parallel.composed.mesh import ParallelDims

LLAMA_13B = P.Workload.llama(llama2.CONFIGS["13B"], seq_len=4096)
TWO_NODES = P.CLUSTERS["2x8 A100-40GB"]


def test_reproduces_seed_000_grouping():
    # with full recomputation and one sequence per micro-batch the seed's layout ties the pick
    full = P.plan(LLAMA_13B, TWO_NODES, global_batch=256, recompute="full", micro_batch=1)
    best = next(lay for lay in P.ties(full) if (lay.pp, lay.dp, lay.tp) == (4, 2, 2))
    # the workbook's own block with FSDP2's memory: the seed's layout needs full recomputation,
    # a TP = 4 layout fits without it
    seed = P.best(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, zero=3)
    pick = P.plan(LLAMA_13B, TWO_NODES, 256, zero=3)[0]
    assert seed.recompute == "full" and pick.recompute == "none" and pick.tp == 4
    assert seed.step_time > 1.15 * pick.step_time
    # Megatron's own activation estimate (s h (18 + 4 f / h)) with its distributed optimizer:
    # the seed's layout fits without recomputation and ties the pick
    meg = workloads.megatron_block_bytes(llama2.CONFIGS["13B"], 4096)
    w_meg = P.Workload.llama(
        llama2.CONFIGS["13B"], 4096, act_bytes=meg["block"], act_replicated=0.0
    )
    tied = P.ties(P.plan(w_meg, TWO_NODES, 256, zero=1))
    assert any((lay.pp, lay.dp, lay.tp, lay.recompute) == (4, 2, 2, "none") for lay in tied), tied
    # the slide's picture: TP pairs of neighbours, DP pairs one apart, PP across both nodes
    assert best.dims.groups("tp")[:2] == [[0, 1], [2, 3]]
    assert best.dims.groups("dp")[:2] == [[0, 2], [1, 3]]
    assert best.dims.groups("pp")[0] == [0, 4, 8, 12]
    assert not best.dims.crosses_nodes("tp") and best.dims.crosses_nodes("pp")


def test_ranked_by_step_time_and_all_fit():
    layouts = P.plan(LLAMA_13B, TWO_NODES, global_batch=256, recompute="full")
    times = [lay.step_time for lay in layouts]
    assert times == sorted(times) and len(layouts) > 3
    assert all(lay.memory_gb <= TWO_NODES.usable_gb < TWO_NODES.gpu_memory_gb for lay in layouts)


def test_pure_data_parallel_does_not_fit_and_says_why():
    lay = P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=16, tp=1, pp=1)
    assert not lay.fits and "GB usable" in lay.reason and "CUDA context" in lay.reason
    # Megatron without its distributed optimizer: 18 bytes a parameter (bf16 weights, fp32
    # main gradients, fp32 master and Adam), 13 B parameters: 234 GB on every GPU
    states = lay.memory["optimizer"] + lay.memory["weights"] + lay.memory["gradients"]
    assert states == pytest.approx(18 * LLAMA_13B.params, rel=1e-6)


def test_zero3_shards_the_states_over_dp():
    plain = P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, recompute="full", zero=1)
    zero3 = P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, recompute="full", zero=3)
    assert (plain.framework, zero3.framework) == ("megatron-distopt", "fsdp2-bf16")
    # Megatron's distributed optimizer keeps bf16 weights whole and shards the fp32 master:
    # 2 + 4 / 2 bytes; FSDP2 shards its fp32 weights: 4 / 2, half of it
    assert zero3.memory["weights"] == pytest.approx(0.5 * plain.memory["weights"], rel=1e-3)


def test_a_framework_can_be_named_and_must_match_the_zero_stage():
    ddp = P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, recompute="full",
                     framework="megatron")  # fmt: skip
    assert ddp.framework == "megatron"
    with pytest.raises(ValueError, match="ZeRO-3"):
        P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, framework="fsdp2-bf16")
    with pytest.raises(KeyError, match="choose one of"):
        P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, framework="nope")


@pytest.mark.parametrize(
    "dp,tp,pp,match",
    [
        (3, 2, 2, "world_size=16"),  # does not multiply to 16
        (1, 16, 1, "inside a node"),  # TP over two nodes
        (16, 1, 1, "GB per GPU"),  # does not fit
        (2, 1, 8, "global batch"),  # a batch of 7 does not split into dp=2
    ],
)
def test_rejections_have_reasons(dp, tp, pp, match):
    batch = 7 if match == "global batch" else 256
    lay = P.evaluate(LLAMA_13B, TWO_NODES, batch, dp=dp, tp=tp, pp=pp)
    assert not lay.fits and match in lay.reason


def test_layers_and_heads_must_divide():
    w = P.Workload.llama(llama2.CONFIGS["70B"], seq_len=4096)  # 80 layers, 8 kv heads
    c = P.Cluster(nodes=4, gpus_per_node=16)
    assert "kv) heads" in P.evaluate(w, c, 64, dp=4, tp=16, pp=1).reason
    assert "80 layers" in P.evaluate(w, c, 64, dp=2, tp=1, pp=32).reason


def test_parallel_dims_errors_say_what_would_work():
    with pytest.raises(ValueError, match=r"use dp=8 \(or dp=-1\)"):
        ParallelDims(dp=3, tp=2, world_size=16)
    with pytest.raises(ValueError, match=r"tp in \[1, 2, 4, 8\]"):
        ParallelDims(tp=16, world_size=32, gpus_per_node=8)
    with pytest.raises(ValueError, match="must be one of"):
        ParallelDims(tp=3, world_size=16)
    assert ParallelDims(tp=2, pp=4, world_size=16).dp == 2


# ----------------------------------------------------------------- the corrected cost model

ONE_NODE = P.Cluster(nodes=1, gpus_per_node=8)


def _times(**kw):
    return P.evaluate(LLAMA_13B, TWO_NODES, 256, **kw).time


def test_zero3_moves_one_and_a_half_all_reduces_and_regathers_per_micro_batch():
    quiet = P.Cluster(nodes=2, gpus_per_node=8, gpu_memory_gib=1e4, overlap=False)
    kw = dict(dp=16, tp=1, pp=1, recompute="full")
    paper = P.Workload.llama(llama2.CONFIGS["13B"], 4096, framework=None)  # 2 + 2 + 12 bytes

    def dp_time(**more):
        return P.evaluate(paper, quiet, 256, **kw, **more).time["dp"]

    assert dp_time(zero=3, micro_batch=16) == pytest.approx(1.5 * dp_time(micro_batch=16))
    # 4 micro-batches: FSDP gathers the weights again for each, the all-reduce runs once
    assert dp_time(zero=3, micro_batch=4) == pytest.approx(4 * dp_time(zero=3, micro_batch=16))
    assert dp_time(micro_batch=4) == pytest.approx(dp_time(micro_batch=16))


def test_ddp_all_reduce_hides_behind_the_backward_when_the_cluster_overlaps():
    w = P.Workload.llama(llama2.ModelArgs(dim=2048, n_layers=16, n_heads=16), 4096)
    hidden = P.evaluate(w, ONE_NODE, 64, dp=8, tp=1, pp=1)
    exposed = P.evaluate(w, P.Cluster(1, 8, overlap=False), 64, dp=8, tp=1, pp=1)
    assert hidden.time["dp"] == 0 < exposed.time["dp"]
    # so a ~1B model on one node is data-parallel, not tensor-parallel
    assert (P.plan(w, ONE_NODE, 64)[0].tp, P.plan(w, ONE_NODE, 64)[0].pp) == (1, 1)


def test_full_recomputation_runs_six_tp_all_reduces_per_layer_and_a_third_more_compute():
    fixed = P.Cluster(nodes=2, gpus_per_node=8, gpu_memory_gib=1e4, elementwise=False)
    none = P.evaluate(LLAMA_13B, fixed, 256, dp=2, tp=2, pp=4, recompute="none").time
    full = P.evaluate(LLAMA_13B, fixed, 256, dp=2, tp=2, pp=4, recompute="full").time
    assert full["tp"] == pytest.approx(1.5 * none["tp"])  # 6 instead of 4
    assert full["compute"] == pytest.approx(4 / 3 * none["compute"])
    # the memory-bound work around the matmuls: one more pass over the saved bytes (5 not 4),
    # so the whole compute grows by between 5/4 and 4/3
    moved = {r: P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, recompute=r).time
             for r in ("none", "full")}  # fmt: skip
    assert 5 / 4 < moved["full"]["compute"] / moved["none"]["compute"] < 4 / 3


def test_the_search_picks_micro_batch_and_recomputation_and_says_what_it_chose():
    fixed = P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=4, tp=2, pp=2, recompute="full")
    free = P.best(LLAMA_13B, TWO_NODES, 256, dp=2, tp=4, pp=2, zero=1)
    assert free.fits and free.step_time < fixed.step_time and free.recompute == "none"
    assert "m=128 x 1 none" in str(free) and "bubble" in str(free)
    shares = free.shares()
    assert sum(shares.values()) == pytest.approx(1) and shares["compute"] > 0.85


def test_ties_are_the_layouts_within_five_percent():
    layouts = P.plan(LLAMA_13B, TWO_NODES, 256, zero=1)
    tied = P.ties(layouts)
    assert 1 < len(tied) < len(layouts)
    assert all(lay.step_time <= 1.05 * layouts[0].step_time for lay in tied)
    assert layouts[len(tied)].step_time > 1.05 * layouts[0].step_time


def test_a_layout_fits_only_inside_the_margin():
    assert TWO_NODES.gpu_memory_gb == pytest.approx(40 * 2**30 / 1e9)  # 40 GiB = 42.9 GB
    c = replace(TWO_NODES, gpu_memory_gib=34)  # 36.5 GB: capacity 34.4 GB, usable 30.9 GB
    assert c.usable_gb == pytest.approx((34 - 2) * 2**30 / 1e9 * 0.9)
    tight = P.evaluate(LLAMA_13B, c, 256, dp=2, tp=4, pp=2, zero=1, micro_batch=1)
    loose = P.evaluate(LLAMA_13B, replace(c, margin=0.0), 256, dp=2, tp=4, pp=2, zero=1)
    assert c.usable_gb < tight.memory_gb < c.capacity_gb
    assert loose.fits and not tight.fits and "10% for the allocator" in tight.reason


def test_a_pipeline_runs_at_its_slowest_stage():
    cheap = P.Block(params=1e6, flops=1e9, act_bytes=1e6, out_bytes=1e5)
    dear = P.Block(params=1e6, flops=9e9, act_bytes=1e6, out_bytes=1e5)
    w = P.Workload("two kinds", (cheap, cheap, dear, dear), seq_len=1, heads=1)
    c = P.Cluster(1, 2, efficiency=1, peak_tflops=1e-3)  # 1 GFLOP/s: seconds are FLOPs / 1e9
    even = P.evaluate(w, c, 8, dp=1, tp=1, pp=2, cuts=(2,))  # 2 | 18 GFLOP per sample
    balanced = P.evaluate(w, c, 8, dp=1, tp=1, pp=2)  # default: cut by FLOPs, 11 | 9
    assert even.time["compute"] == pytest.approx(8 * 18, rel=1e-3)
    assert balanced.time["compute"] == pytest.approx(8 * 11, rel=1e-3)
    assert even.step_time / balanced.step_time == pytest.approx(18 / 11, rel=1e-3)
    assert even.time["bubble"] == pytest.approx(18, rel=1e-2)  # (pp - 1) slots of the slowest
    with pytest.raises(ValueError, match="non-empty stages"):
        P.evaluate(w, c, 8, dp=1, tp=1, pp=2, cuts=(4,))


def test_gpipe_keeps_every_micro_batch_1f1b_at_most_pp():
    from dataclasses import replace

    kw = dict(dp=1, tp=2, pp=8, recompute="none", micro_batch=1)
    blocks_only = replace(LLAMA_13B, logits_bytes=0.0)  # the last stage's logits aside
    gpipe = P.evaluate(blocks_only, TWO_NODES, 64, schedule="gpipe", **kw)
    one_f = P.evaluate(blocks_only, TWO_NODES, 64, schedule="1f1b", **kw)
    assert gpipe.memory["activations"] == pytest.approx(64 / 8 * one_f.memory["activations"])
    assert gpipe.step_time == pytest.approx(one_f.step_time)  # the same bubble


def test_cpu_ranks_sharing_cores_idle_only_while_too_few_compute():
    w = P.Workload.llama(llama2.CONFIGS["tiny"], 64)
    kw = dict(gpu_memory_gib=1e3, peak_tflops=0.02, efficiency=1)
    devices = P.evaluate(w, P.Cluster(1, 4, **kw), 16, dp=2, tp=1, pp=2, micro_batch=2)
    cores = P.evaluate(w, P.Cluster(1, 4, cores=2, **kw), 16, dp=2, tp=1, pp=2, micro_batch=2)
    assert devices.time["bubble"] > 0 == cores.time["bubble"]  # 2 ranks per stage fill 2 cores


def test_balanced_cuts():
    from helpers.parallel.composed.plancost import balanced_cuts

    assert balanced_cuts([1, 1, 1, 1], 2) == (2,)
    assert balanced_cuts([1, 1, 1, 9], 2) == (3,)
    cuts = balanced_cuts([5, 1, 1, 1, 1, 1], 3)  # the big block alone; the others fill 2 stages
    assert cuts[0] == 1 and len(cuts) == 2


def test_coatnet_workload_counts_every_block_and_splits_only_attention():
    from helpers.models import coatnet
    from helpers.parallel.composed import coatnet_parallel as cp

    cfg = coatnet.CONFIGS["tiny"]
    w = cp.workload(cfg)
    assert w.layers == 1 + sum(cfg.depths[1:]) + 1  # stem, every block, head
    assert sum(b.params for b in w.blocks) == coatnet.param_count(cfg)
    transformer = sum(d for d, k in zip(cfg.depths[1:], cfg.kinds, strict=True) if k == "T")
    assert sum(b.tp for b in w.blocks) == transformer and all(b.tp_bytes for b in w.blocks if b.tp)
    assert coatnet.CONFIGS["CoAtNet-7"].stage_names() == ["S1", "S2", "S3-MBConv", "S3-TFM", "S4"]


def test_the_blocks_own_activations_and_the_loss_and_embeddings_on_the_edge_stages():
    from helpers.parallel.composed import workloads

    w = P.Workload.llama(llama2.CONFIGS["13B"], 4096)
    b = w.blocks[0]
    # the workbook's eager block in bf16: 32 h + 8 f + 4 hd + 4 H + 8 bytes a token
    assert b.act_bytes == 4096 * (32 * 5120 + 8 * 13824 + 4 * 128 + 4 * 40 + 8)
    assert b.act_bytes > 1.5 * P.activation_bytes(5120, 4096)["block"]  # Korthikanti's 34 s h
    assert w.logits_bytes == 4096 * 32000 * workloads.LOSS_BYTES  # 1.57 GB a sequence
    assert w.edge_params == (32000 * 5120, 32000 * 5120 + 5120)  # the final norm: last stage
    no_sp = P.Workload.llama(llama2.CONFIGS["13B"], 4096, sequence_parallel=False)
    assert no_sp.blocks[0].act_replicated > b.act_replicated > 0  # the norms stay whole
    c = P.Cluster(nodes=1, gpus_per_node=8, gpu_memory_gib=1e4)
    lay = P.evaluate(w, c, 16, dp=1, tp=2, pp=4, micro_batch=1)
    per = [g * 1e9 for g in lay.stage_gb]
    # 1F1B: stage s holds pp - s micro-batches; the last holds one, plus the loss and output
    act = 10 * (b.act_replicated + (b.act_bytes - b.act_replicated) / 2)  # 10 layers a stage
    output = 18 * (32000 * 5120 + 5120) / 2  # 18 bytes a parameter (Megatron), tp = 2
    assert per[3] - per[2] == pytest.approx(w.logits_bytes + output - act, rel=1e-6)
    blocks = P.Workload.llama(llama2.CONFIGS["13B"], 4096, embeddings=False)
    assert blocks.logits_bytes == 0 and blocks.edge_params == (0, 0)
