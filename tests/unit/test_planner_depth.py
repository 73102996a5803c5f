"""Notebook 07's depth in the planner: interleaved 1F1B (Megatron's bubble, sends and stage-0
memory) and the roofline efficiency of a block's matmuls (micro-batch tokens, TP split width)."""

from __future__ import annotations

import pytest

from helpers.models import llama2
from helpers.parallel.composed import plancost, planner

W13 = planner.Workload.llama(llama2.CONFIGS["13B"], seq_len=4096)
A100 = planner.CLUSTERS["2x8 A100-40GB"]


def _layouts(v):
    one = planner.evaluate(W13, A100, 256, dp=2, tp=2, pp=4, zero=1)
    inter = planner.evaluate(W13, A100, 256, dp=2, tp=2, pp=4, zero=1, schedule="interleaved",
                             virtual=v)  # fmt: skip
    return one, inter


@pytest.mark.parametrize("v", [2, 5])
def test_interleaving_divides_the_bubble_multiplies_the_sends_and_adds_stage_0_memory(v):
    one, inter = _layouts(v)
    per_mb = {lay.schedule: sum(lay.time[k] for k in ("compute", "tp", "pp")) / lay.micro_batches
              for lay in (one, inter)}  # fmt: skip
    assert one.time["bubble"] == pytest.approx(3 * per_mb["1f1b"])  # pp - 1 slots
    assert inter.time["bubble"] == pytest.approx(3 / v * per_mb["interleaved"])  # (pp - 1) / v
    assert inter.time["pp"] == pytest.approx(one.time["pp"] * v)
    assert inter.time["compute"] == pytest.approx(one.time["compute"])
    # stage 0 holds pp + (pp - 1) / v micro-batches (Megatron's warm-up) where 1F1B holds pp
    act = {lay.schedule: lay.memory["activations"] for lay in (one, inter)}
    assert act["interleaved"] / act["1f1b"] == pytest.approx((4 + 3 / v) / 4)
    assert plancost.in_flight_microbatches(inter, 3) == pytest.approx((1 + (v - 1) * 4) / v)


def test_interleaving_needs_layers_and_micro_batches_that_divide():
    bad = planner.evaluate(W13, A100, 256, dp=2, tp=2, pp=4, schedule="interleaved", virtual=3)
    assert "chunks" in bad.reason  # 40 layers do not split into 4 x 3
    odd = planner.evaluate(W13, A100, 12, dp=2, tp=2, pp=4, schedule="interleaved", virtual=2)
    assert "divisible by pp" in odd.reason  # 6 micro-batches per step on 4 stages


def test_gemm_efficiency_falls_with_narrow_splits_and_few_tokens():
    # time = FLOPs at the large-matmul rate + bytes at the memory bandwidth (A100: ridge
    # 0.69 x 312 / 1.555 = 138 FLOPs a byte): a share, never more than 1
    wide = plancost.gemm_efficiency(A100, 4096, 5120, 5120 / 8)
    assert 0.75 < wide < 1.0  # 13B at TP = 8, one 4,096-token sequence: 560 FLOPs a byte
    assert plancost.gemm_efficiency(A100, 65536, 8192, 8192) > 0.95  # a large product
    assert plancost.gemm_efficiency(A100, 64, 5120, 5120 / 8) < 0.35  # 64 tokens: memory-bound
    assert plancost.gemm_efficiency(A100, 4096, 1024, 1024 / 16) < 0.35  # a 64-wide split
    small = planner.Workload.llama(llama2.ModelArgs(dim=1024, n_layers=8, n_heads=16), 512)
    fixed = planner.evaluate(small, planner.Cluster(1, 8, gemm_model=False), 64, dp=1, tp=8, pp=1)
    modelled = planner.evaluate(small, planner.Cluster(1, 8), 64, dp=1, tp=8, pp=1)
    assert modelled.time["compute"] > 1.5 * fixed.time["compute"]
