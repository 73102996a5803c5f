"""The planner: seed 000's 2 x 8 grouping, and clear refusals."""

import pytest

from helpers.models import llama2
from helpers.parallel import planner as P
from helpers.parallel.mesh import ParallelDims

LLAMA_13B = P.Workload.llama(llama2.CONFIGS["13B"], seq_len=4096)
TWO_NODES = P.CLUSTERS["2x8 A100-40GB"]


def test_reproduces_seed_000_grouping():
    best = P.plan(LLAMA_13B, TWO_NODES, global_batch=256, recompute="full")[0]
    assert (best.pp, best.dp, best.tp) == (4, 2, 2)
    # the slide's picture: TP pairs of neighbours, DP pairs one apart, PP across both nodes
    assert best.dims.groups("tp")[:2] == [[0, 1], [2, 3]]
    assert best.dims.groups("dp")[:2] == [[0, 2], [1, 3]]
    assert best.dims.groups("pp")[0] == [0, 4, 8, 12]
    assert not best.dims.crosses_nodes("tp") and best.dims.crosses_nodes("pp")


def test_ranked_by_step_time_and_all_fit():
    layouts = P.plan(LLAMA_13B, TWO_NODES, global_batch=256, recompute="full")
    times = [lay.step_time for lay in layouts]
    assert times == sorted(times) and len(layouts) > 3
    assert all(lay.memory_gb <= TWO_NODES.gpu_memory_gb for lay in layouts)


def test_pure_data_parallel_does_not_fit_and_says_why():
    lay = P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=16, tp=1, pp=1)
    assert not lay.fits and "GB per GPU > 40 GB" in lay.reason
    # 13 B parameters x 16 bytes = 208 GB of states on every GPU
    assert lay.memory["optimizer"] + lay.memory["weights"] + lay.memory["gradients"] > 200e9


def test_zero3_shards_the_states_over_dp():
    plain = P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, recompute="full")
    zero3 = P.evaluate(LLAMA_13B, TWO_NODES, 256, dp=2, tp=2, pp=4, recompute="full", zero=3)
    assert zero3.memory["optimizer"] == pytest.approx(plain.memory["optimizer"] / 2)
    assert zero3.memory["weights"] == pytest.approx(plain.memory["weights"] / 2)


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
