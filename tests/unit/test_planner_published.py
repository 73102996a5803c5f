"""The planner against published runs (helpers.parallel.composed.published): what notebook 07's
table shows, asserted, so that a change to the rules that breaks agreement fails here."""

import statistics

import pytest

from helpers.parallel.composed import planner
from helpers.parallel.composed import published as P


@pytest.fixture(scope="module")
def megatron():
    return {r.name.removeprefix("GPT "): r for r in P.megatron_2021()}


def test_the_one_fitted_number_reproduces_its_run():
    # A100_EFFICIENCY is fitted to torchtitan's Llama 2 70B run: it must still reproduce it
    seventy = P.torchtitan_a100()[1]
    assert abs(seventy.error) < 0.02, seventy.predicted
    # and the H100 efficiency to the H100 record's run: 68,677 tokens/s
    h100 = P.h100_record()
    assert 8 * 2048 / h100.step_time == pytest.approx(68_677, rel=0.02)


def test_megatron_table_1_throughput_within_a_few_percent(megatron):
    errors = [abs(r.error) for r in megatron.values()]
    assert statistics.median(errors) < 0.04, errors  # 2.3 % now
    assert max(errors) < 0.08, errors  # 5.8 % now (530B, predicted low)
    # the rise from 1.7B to 1T that one fixed efficiency missed: here from shapes and traffic
    assert megatron["1T"].predicted > 1.05 * megatron["7.5B"].predicted


def test_every_published_layout_fits_and_with_room(megatron):
    for r in megatron.values():  # inside the 10 % margin: 42-55 GB of 70.1 usable
        assert r.layout.fits and r.layout.memory_gb < 60, (r.name, r.layout.reason)
    # torchtitan ran 13B without recomputation: it fits the capacity, not the 10 % margin
    thirteen = P.torchtitan_a100()[0]
    c = P.selene(64)
    assert c.usable_gb < thirteen.layout.memory_gb < c.capacity_gb


def test_where_planner_and_paper_agree_and_disagree(megatron):
    big = ["310B", "530B", "1T"]  # memory forces recomputation: the pick is the paper's time
    for name in big:
        r = megatron[name]
        assert r.pick.recompute == "full" and 0.95 < r.pick_speedup < 1.05, (name, r.pick)
    small = [n for n in megatron if n not in big]  # the pick drops recomputation, 1.25-1.5x
    for name in small:
        r = megatron[name]
        assert r.pick.recompute == "none" and 1.2 < r.pick_speedup < 1.5, (name, r.pick)


def test_recomputation_costs_what_korthikanti_et_al_measured():
    k = P.korthikanti_530b()
    assert k["full"].fits and k["selective"].fits
    assert k["predicted"] == pytest.approx(k["published"], rel=0.05)  # 1.30 against 1.29


def test_the_h100_record_peak_memory():
    from dataclasses import replace

    from helpers.models import llama2
    from helpers.parallel.composed import frameworks

    # the workbook's eager 7B-width run on one H100: 24.05 GiB (torch.cuda.max_memory_allocated)
    lay = P.h100_record()
    assert lay.memory_gb * 1e9 / 2**30 == pytest.approx(24.05, rel=0.05)
    # with Korthikanti et al.'s 34 s h in place of this block's own count: a fifth low
    w = planner.Workload.llama(llama2.config("7B", n_layers=4), 2048, act_bytes=34 * 2048 * 4096)
    sgd = replace(frameworks.lookup("fsdp2-bf16"), moments=0)
    c = planner.Cluster(1, 1, gpu_memory_gb=80, peak_tflops=989.4, memory_gbs=3350)
    low = planner.evaluate(w, c, 8, dp=1, tp=1, pp=1, micro_batch=8, zero=3, framework=sgd)
    assert low.memory_gb < 0.85 * lay.memory_gb
