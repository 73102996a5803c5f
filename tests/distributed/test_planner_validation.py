"""The planner predicts what it ranks: every layout it can express, run on 4 CPU ranks.

DP, DP with accumulation, ZeRO-3, GPipe and 1F1B pipelines, TP and the 2 x 2 hybrids train a
stack of Llama 2 blocks; the planner, fed this machine's rates measured in the same run,
predicts each step time and peak memory. A measured order holds when every round orders
the pair the same way (a shared 2-core machine: the other pairs are ties within the spread);
the planner must predict each such order, and its memory within 10 % of the allocator's peak.
The frameworks' memory rules are measured on their own (framework_probe): DDP's bucket copy,
FSDP2's shards and gathered blocks.
"""

import pytest

from helpers.course.bench import planner as bench
from helpers.parallel.composed import plancheck, planner


@pytest.fixture(scope="module")
def validated():
    return bench.validate(bench.SMALL)


def _wrong(pairs) -> list[str]:
    return [f"{p.a} / {p.b}: predicted {p.predicted:.2f}, measured {p.measured:.2f} "
            f"({p.low:.2f}-{p.high:.2f})" for p in pairs if p.violation]  # fmt: skip


def test_planner_ranks_layouts_in_the_measured_order(validated):
    pairs = validated["pairs"]
    decisive = [p for p in pairs if p.decisive]
    wrong = _wrong(pairs)
    if wrong:  # a burst of load on a shared 2-core machine: measure once more, all rounds again
        again = bench.validate(bench.SMALL)
        if again["premise"].holds:  # the ranks had their cores: the order must hold
            assert not _wrong(again["pairs"]), (
                "the planner orders these the other way round (twice): "
                + "; ".join(wrong) + " | " + "; ".join(_wrong(again["pairs"]))
                + f" ({again['premise']})"
            )  # fmt: skip
        else:
            print(f"not checked: orders {wrong}; {again['premise']}")
    called = [p for p in decisive if not p.predicted_tie]
    found = f"{len(decisive)} of {len(pairs)} pairs ordered by all rounds, {len(called)} predicted"
    # a count of timings: on a crowded machine the rounds disagree (07's full run at load 8-10: 2 of 36)
    if not validated["premise"].holds:
        print(f"not checked: {found}; {validated['premise']}")
        return
    # the check has teeth: enough layouts are told apart by every round to be ranked
    assert len(decisive) >= 5, f"{found} ({validated['premise']})"
    # and the planner commits to most of them: calling every pair a tie would never be wrong
    assert len(called) >= len(decisive) // 2, f"{found} ({validated['premise']})"


def test_planner_memory_matches_the_allocator(validated):
    # the activations of the block that runs (its own count, not 34 s h) and the frameworks'
    # rules (DDP's bucket views, FSDP2's gathered blocks, Adam's foreach temporary)
    act = validated["activations"]
    assert act["rule"] == act["counted"] and act["rule_replicated"] == act["counted_replicated"]
    for r in validated["rows"]:
        assert abs(r["predicted_mb"] / r["measured_mb"] - 1) < 0.1, r["name"]
    by = {r["name"]: r["measured_mb"] for r in validated["rows"]}
    # what the layouts are for: ZeRO-3 and 1F1B hold far less than a DDP replica
    assert by["dp=4 ZeRO-3"] < 0.8 * by["dp=4"] and by["pp=4 1F1B, m=8"] < 0.5 * by["dp=4"]
    assert by["pp=4 1F1B, m=8"] < by["pp=4 GPipe, m=8"]  # 1F1B bounds the micro-batches in flight


def test_ranking_flags_a_planner_that_orders_wrongly():
    rounds = [[1.0, 1.1, 1.05], [2.0, 2.1, 1.9], [1.02, 1.12, 1.0]]
    good = plancheck.ranking(["a", "b", "c"], [[1.0] * 3, [2.0] * 3, [1.0] * 3], rounds)
    bad = plancheck.ranking(["a", "b", "c"], [[2.0] * 3, [1.0] * 3, [3.0] * 3], rounds)
    assert not any(p.violation for p in good)
    flagged = {(p.a, p.b) for p in bad if p.violation}
    assert flagged == {("a", "b"), ("b", "c")}  # a vs c is a measured tie: never a violation
    assert [p.decisive for p in good] == [True, False, True]
    assert planner.TIE == pytest.approx(0.05)


def test_a_predicted_tie_is_the_planners_five_percent_band_and_nothing_else():
    rounds = [[1.0, 1.1, 1.05], [2.0, 2.1, 1.9], [1.7, 1.8, 1.75]]
    # one round's rates disagreeing on the order does not make a tie: the median ratio decides
    # (the old rule called a measured 2x gap a tie when any round's prediction straddled 1)
    straddles = plancheck.ranking(["a", "b", "c"], [[2.0, 0.9, 2.0], [1.0] * 3, [1.0] * 3], rounds)
    assert not straddles[0].predicted_tie and straddles[0].violation
    # within 5 %: a tie, never a violation, even the wrong way round
    close = plancheck.ranking(["a", "b", "c"], [[1.03] * 3, [1.0] * 3, [1.0] * 3], rounds)
    assert close[0].predicted_tie and not close[0].violation
    assert close[0].tie(band=0.01) is False and close[0].wrong(band=0.01)
    e = plancheck.errors([{"predicted_s": 1.0, "measured_s": 1.25}, {"predicted_s": 2.0,
                          "measured_s": 2.0}], close)  # fmt: skip
    assert e["step_worst"] == pytest.approx(0.2) and e["band_needed"] == pytest.approx(0.03)
    assert close[0].ratio_error == pytest.approx(1.03 / close[0].measured - 1)


# ------------------------------------------- the frameworks' memory rules, on CPU ranks


def _probe(kind, **cfg):
    from helpers import launch
    from helpers.parallel.composed import framework_probe as F

    out = launch.spawn(F.probe, 2, args=(kind, F.ProbeConfig(**cfg)))
    # the ranks hold the same states; now and then one of them still holds a bucket-sized buffer
    # of the collective machinery after the warm-up steps (seen under load): the lesser rank
    measured = min(r["held"] + r["peak"] for r in out)
    return measured, F.predict(kind, out[0], 2), out


def test_ddp_holds_a_flat_copy_of_the_gradients_unless_they_are_bucket_views():
    # small activations: the end of the backward is the peak, where DDP without the view holds
    # param.grad beside its buckets (4 bytes a parameter more)
    copy, rule_copy, out = _probe("ddp")
    view, rule_view, _ = _probe("ddp-bucket-view")
    params = out[0]["params"]
    assert copy - view == pytest.approx(4 * params, rel=0.1), (copy, view, params)
    for got, rule in ((copy, rule_copy), (view, rule_view)):
        assert got == pytest.approx(rule["total"], rel=0.15), (got, rule)


def test_fsdp2_holds_its_shards_and_two_gathered_blocks():
    got, rule, out = _probe("fsdp2-fp32")
    # between steps: its shards (16 bytes / 2 a parameter), and at times a gathered block or two
    # that FSDP2 has not freed yet (the peak's two gathered blocks count them)
    block = 4 * out[0]["largest"]
    held = min(r["held"] for r in out)
    assert rule["held"] * 0.99 < held < rule["held"] + 2.1 * block, (held, rule, block)
    assert got == pytest.approx(rule["total"], rel=0.3), (got, rule)
