"""Cluster-sized layouts in one process (fake process groups, meta-device Llama 2).

16 ranks: seed 000's 2 nodes x 8 GPUs (pp=4, dp=2, tp=2), every rank built.
1,024 ranks: Llama 2 70B on 128 nodes x 8 GPUs (pp=8, dp=16, tp=8), a sample of ranks built.
"""

import pytest
import torch

from helpers.models import llama2
from helpers.parallel.composed import planner as P
from helpers.parallel.composed import simulate as S
from helpers.parallel.composed.mesh import ParallelDims

SEED_000 = ParallelDims(dp=2, tp=2, pp=4, world_size=16, gpus_per_node=8)
BIG = ParallelDims(dp=16, tp=8, pp=8, world_size=1024, gpus_per_node=8)


@pytest.fixture(scope="module")
def views_16():
    return S.check_layout(llama2.CONFIGS["13B"], SEED_000)  # raises if a group differs


def _estimate(name, dims, cluster):
    w = P.Workload.llama(llama2.CONFIGS[name])
    lay = P.evaluate(w, cluster, 256, dp=dims.dp, tp=dims.tp, pp=dims.pp, zero=3, recompute="full")
    fw = P.framework_of(w, 3)  # FSDP2: fp32 weights, sharded
    return lay.memory["weights"] / (fw.weights + fw.master)  # parameters on the fullest GPU


def test_16_ranks_groups_are_the_planners(views_16):
    assert [v["rank"] for v in views_16] == list(range(16))
    assert views_16[5]["groups"] == {"pp": [1, 5, 9, 13], "dp": [5, 7], "tp": [4, 5]}
    # every layer lives on exactly one pipeline stage, in order
    stages = {v["stage"]: v["layers"] for v in views_16}
    assert sum(stages.values(), []) == list(range(40))


def test_16_ranks_shard_shapes(views_16):
    for v in views_16:
        first = v["layers"][0]
        shapes = v["shapes"]
        # wq 5120 x 5120: TP column-wise halves the rows, FSDP halves them again
        assert shapes[f"layers.{first}.attention.wq.weight"] == (1280, 5120)
        # w2 5120 x 13824: TP row-wise halves the columns, FSDP the rows
        assert shapes[f"layers.{first}.feed_forward.w2.weight"] == (2560, 6912)
        assert ("tok_embeddings.weight" in shapes) == (v["stage"] == 0)
        assert ("output.weight" in shapes) == (v["stage"] == 3)


def test_16_ranks_memory_matches_estimator(views_16):
    est = _estimate("13B", SEED_000, P.CLUSTERS["2x8 A100-40GB"])
    for v in views_16:  # the estimate is the fullest stage's: 0 and 3 hold the embedding / output
        assert v["local_params"] == pytest.approx(est, rel=0.05 if v["stage"] in (0, 3) else 0.1)
    # all shards together hold the model once per TP rank for the (replicated) norm weights only
    args = llama2.CONFIGS["13B"]
    norms = (2 * args.n_layers + 1) * args.dim
    total = sum(v["local_params"] for v in views_16)
    assert total == llama2.param_count(args) + (SEED_000.tp - 1) * norms


def test_1024_ranks_llama2_70b():
    ranks = [0, 7, 8, 130, 513, 1023]
    views = S.check_layout(llama2.CONFIGS["70B"], BIG, ranks=ranks)
    est = _estimate("70B", BIG, P.CLUSTERS["128x8 H100"])
    for v in views:
        assert v["coords"] == BIG.coords(v["rank"])
        assert len(v["groups"]["dp"]) == 16 and len(v["groups"]["pp"]) == 8
        first = v["layers"][0]
        # wq 8192 x 8192 / (tp=8 rows) / (dp=16 rows); wk 1024 x 8192 (8 kv heads) / 8 / 16
        assert v["shapes"][f"layers.{first}.attention.wq.weight"] == (64, 8192)
        assert v["shapes"][f"layers.{first}.attention.wk.weight"] == (8, 8192)
        assert v["local_params"] == pytest.approx(est, rel=0.05)
    assert not BIG.crosses_nodes("tp") and BIG.crosses_nodes("dp")


def test_fake_rank_leaves_no_process_group():
    with S.fake_rank(3, 8):
        assert torch.distributed.get_rank() == 3
    assert not torch.distributed.is_initialized()


def test_layers_must_divide_into_stages():
    with pytest.raises(ValueError, match="does not divide 40 layers"):
        S.stage_layers(40, 3, 0)
