"""The planner against published runs (helpers.parallel.composed.published): what notebook 07's
table shows, asserted, so that a change to the rules that moves it fails here."""

import math
import statistics

import pytest

from helpers.parallel.composed import planner
from helpers.parallel.composed import published as P


@pytest.fixture(scope="module")
def megatron():
    return {r.name.removeprefix("GPT "): r for r in P.megatron_2021()}


def test_the_one_fitted_number_is_the_fit_of_its_one_run():
    # A100_EFFICIENCY is fitted to torchtitan's Llama 2 70B run (FIT), and to nothing else
    assert P.fit_a100_efficiency() == pytest.approx(P.A100_EFFICIENCY, abs=0.005)
    fitted = [r for r in P.torchtitan_a100() if r.fitted]
    assert [r.name.split(",")[0] for r in fitted] == [P.FIT] and abs(fitted[0].error) < 0.01
    # and the H100 efficiency to the H100 record's run: 68,677 tokens/s
    h100 = P.h100_record()
    assert 8 * 2048 / h100.step_time == pytest.approx(68_677, rel=0.02)


def test_table_1_is_costed_as_the_sc21_scripts_ran_it(megatron):
    # run_table_1.sh: torch's DDP for the four smallest, scatter/gather, full recomputation,
    # --num-layers-per-virtual-pipeline-stage for 76B-530B (39B and 1T: plain 1F1B)
    for name, (ddp, per_chunk) in P.SC21.items():
        lay = megatron[name].layout
        assert (lay.framework == "megatron-fp16-torch-ddp") == (ddp == "torch"), name
        assert lay.scatter_gather and lay.recompute == "full", name
        assert lay.schedule == ("1f1b" if per_chunk is None else "interleaved"), name
    assert [megatron[n].layout.virtual for n in ("39B", "76B", "145B", "310B", "530B", "1T")] == [
        1, 3, 2, 2, 3, 1]  # fmt: skip


def test_megatron_table_1_throughput_as_the_table_shows_it(megatron):
    errors = [r.error for r in megatron.values()]
    size = [abs(e) for e in errors]
    assert statistics.median(size) < 0.06, errors  # 4.4 % now
    assert max(size) < 0.14, errors  # 12.2 % now: 1.7B, over-predicted
    assert sum(e > 0 for e in errors) >= 8, errors  # systematically high: 9 of 10 now
    assert max(size) == abs(megatron["1.7B"].error)  # the smallest model, torch's DDP
    # the rise from 1.7B to 1T (137 to 163 published, 1.19x): the planner gets a part of it
    rise = megatron["1T"].predicted / megatron["1.7B"].predicted
    assert 1.0 < rise < 163 / 137, rise  # 1.05 now


def test_the_element_wise_pass_count_sets_the_trend():
    # refitted each time to the one run: more passes, more of Table 1's rise (8: all of it)
    worst, rise = {}, {}
    for passes in (2, 4, 8):
        eff = P.fit_a100_efficiency(elementwise_passes=passes)
        rows = P.megatron_2021(eff, picks=False, elementwise_passes=passes)
        worst[passes] = max(abs(r.error) for r in rows)
        rise[passes] = rows[-1].predicted / rows[0].predicted
    assert worst[2] > worst[4] > worst[8] and rise[2] < rise[4] < rise[8], (worst, rise)


def test_every_published_layout_fits_and_with_room(megatron):
    for r in megatron.values():  # inside the 10 % margin: 45-57 GB of 75.4 usable
        assert r.layout.fits and r.layout.memory_gb < 60, (r.name, r.layout.reason)
    for r in P.torchtitan_a100():  # torchtitan ran them: the planner lets every one in
        assert r.layout.fits, (r.name, r.layout.reason)
    assert P.selene(64).usable_gb == pytest.approx((80 - 2) * 2**30 / 1e9 * 0.9)  # GiB, not GB


def test_the_predicted_torchtitan_runs():
    titan = {r.name.split(",")[0]: r for r in P.torchtitan_a100()}
    assert abs(titan["Llama 2 13B"].error) < 0.1, titan["Llama 2 13B"]  # -5.3 % now
    assert abs(titan["Llama 3 70B"].error) < 0.05, titan["Llama 3 70B"]  # +1.5 % now


def test_where_planner_and_paper_agree_and_disagree(megatron):
    for name in ("310B", "530B", "1T"):  # memory forces recomputation: the pick is the paper's
        r = megatron[name]
        assert r.pick.recompute == "full" and 0.95 < r.pick_speedup < 1.05, (name, r.pick)
        assert not r.no_recompute.fits
    # up to 76B the paper's own (tp, pp) fits without recomputation: 1.27-1.37x faster
    small = ["1.7B", "3.6B", "7.5B", "18B", "39B", "76B"]
    for name in small:
        r = megatron[name]
        assert r.pick.recompute == "none" and 1.2 < r.no_recompute_speedup < 1.45, name
    # and the pick ties it, except where it also changes the layout (a narrower TP)
    beyond = {
        n for n in small if megatron[n].pick_speedup > 1.05 * megatron[n].no_recompute_speedup
    }
    assert beyond == {"18B", "39B"}, beyond
    assert all(megatron[n].pick.tp < 8 for n in beyond)
    # 145B: the paper's layout without recomputation does not fit; the pick is a deeper pipeline
    r = megatron["145B"]
    assert math.isnan(r.no_recompute_speedup) and r.pick.recompute == "none" and r.pick.pp > 8


def test_recomputation_costs_what_the_papers_measured():
    k = P.korthikanti_530b()
    assert k["full"].fits and k["selective"].fits
    assert k["predicted"] == pytest.approx(k["published"], rel=0.05)  # 1.33 against 1.29
    for mode in ("full", "selective"):  # and the MFUs themselves: 40.2 / 53.7 % against 42.1 / 54.2
        assert k["mfu"][mode] == pytest.approx(k["published_mfu"][mode], rel=0.06), mode
    # Narayanan et al. 5.6: up to 33 % lower throughput at small batches, and at large batches
    # with recomputation up to 2x the best without it, which ran out of memory (a bigger bubble)
    rows = P.figure_17()
    small = rows[0]["full"] / rows[0]["none"]
    best_without = max(r["none"] for r in rows if not math.isnan(r["none"]))
    assert 0.67 <= small < 0.85 and 1.5 < rows[-1]["full"] / best_without <= 2.2, rows


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
    c = planner.Cluster(1, 1, gpu_memory_gib=80, peak_tflops=989.4, memory_gbs=3350)
    low = planner.evaluate(w, c, 8, dp=1, tp=1, pp=1, micro_batch=8, zero=3, framework=sgd)
    assert low.memory_gb < 0.85 * lay.memory_gb
