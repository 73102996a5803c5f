"""Pipeline schedules: valid orders, closed forms for equal stages, exact hand-made cases."""

import pytest

from helpers.parallel.pipeline import schedules as S

CASES = [(p, m) for p in (2, 3, 4) for m in (1, 4, 8)]


def _by_key(tl):
    return {(e.stage, e.chunk, e.kind, e.mb): e for e in tl.events}


@pytest.mark.parametrize("name", S.SCHEDULES)
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 6)])
def test_every_op_once_and_dependencies_respected(name, p, m):
    v = 2 if name.startswith("interleaved") else 1
    tl = S.simulate(name, p, m, tf=[1, 2, 1.5, 1][:p], tb=[2, 3, 2.5, 2][:p], latency=0.3, v=v)
    ev = _by_key(tl)
    mbs = [0] if name == "naive" else range(m)
    kinds = "FBW" if "zb" in name else "FB"
    assert len(ev) == len(tl.events) == p * v * len(mbs) * len(kinds)
    for (s, c, kind, mb), e in ev.items():
        ms = c * p + s  # model stage
        if kind == "F" and ms > 0:  # needs the previous model stage's activations
            prev = ev[((ms - 1) % p, (ms - 1) // p, "F", mb)]
            assert e.start >= prev.end + 0.3 - 1e-9
        if kind == "B":
            assert e.start >= ev[(s, c, "F", mb)].end  # forward precedes its backward
            if ms < p * v - 1:  # needs the next model stage's gradient
                nxt = ev[((ms + 1) % p, (ms + 1) // p, "B", mb)]
                assert e.start >= nxt.end + 0.3 - 1e-9
        if kind == "W":
            assert e.start >= ev[(s, c, "B", mb)].end
    for s in range(p):  # a rank does one thing at a time
        mine = sorted((e.start, e.end) for e in tl.events if e.stage == s)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(mine, mine[1:], strict=False))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "interleaved", "interleaved-zb"])
def test_the_two_bubbles_are_told_apart(name):
    # overhead = idle / busy, fraction = idle / (p x makespan): for GPipe (p-1)/m and (p-1)/(m+p-1)
    tl = S.simulate(name, 4, 8, tf=1.0, tb=2.0, v=2)
    idle = 4 * tl.makespan - sum(tl.busy)
    assert tl.overhead == pytest.approx(idle / sum(tl.busy))
    assert tl.bubble == pytest.approx(idle / (4 * tl.makespan))
    assert tl.overhead > tl.bubble  # the same idle time over a smaller whole
    if name == "gpipe":
        assert (tl.overhead, tl.bubble) == (pytest.approx(3 / 8), pytest.approx(3 / 11))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", CASES)
def test_equal_stages_match_seed_closed_forms(name, p, m):
    tl = S.simulate(name, p, m, tf=1.0, tb=2.0)
    assert tl.makespan == pytest.approx((m + p - 1) * 3.0)
    assert tl.bubble == pytest.approx((p - 1) / (m + p - 1))
    assert tl.speedup == pytest.approx(m * p / (m + p - 1))
    cf = S.closed_form(p, m, 1.0, 2.0)
    idle = p * tl.makespan - sum(tl.busy)
    assert idle / sum(tl.busy) == pytest.approx(cf["overhead"]) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize(
    "p,m,v", [(2, 4, 2), (2, 8, 3), (4, 8, 2), (4, 8, 4), (3, 6, 2), (4, 12, 2)]
)
def test_interleaving_divides_the_bubble_by_v(p, m, v):
    for tf, tb in [(1.0, 1.0), (1.0, 2.0)]:
        plain = S.simulate("1f1b", p, m, tf, tb)
        inter = S.simulate("interleaved", p, m, tf, tb, v=v)
        useful = m * (tf + tb)
        assert inter.makespan - useful == pytest.approx((plain.makespan - useful) / v)


def test_one_f_one_b_holds_fewer_activations_than_gpipe():
    p, m = 4, 8
    assert S.simulate("gpipe", p, m).peak_activations == [m] * p
    assert S.simulate("1f1b", p, m).peak_activations == [4, 3, 2, 1]  # p - s
    assert max(S.simulate("zb-h1", p, m).peak_activations) == p  # 1F1B's peak


def test_zero_bubble_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w():
    # Qi et al.: with F = B = W = 1 (tb = 2 split in halves) the bubble is (p-1)(F+B-W) = p-1
    for p, m in [(2, 8), (4, 8), (4, 12)]:
        assert S.simulate("zb-h1", p, m, 1.0, 2.0).makespan == pytest.approx(3 * m + p - 1)


def test_naive_has_no_overlap():
    tl = S.simulate("naive", 3, 4, 1.0, 2.0)
    assert tl.makespan == pytest.approx(3 * 4 * 3.0)
    assert tl.speedup == pytest.approx(1.0)


def test_heterogeneous_gpipe_with_latency_by_hand():
    # stage 0: F0 [0,1] F1 [1,2]; stage 1: F0 [1.5,3.5] F1 [3.5,5.5] B0 [5.5,9.5] B1 [9.5,13.5]
    # stage 0: B0 arrives 10 -> [10,12]; B1 arrives 14 -> [14,16]
    tl = S.simulate("gpipe", 2, 2, tf=[1, 2], tb=[2, 4], latency=0.5)
    got = {(e.stage, e.kind, e.mb): (e.start, e.end) for e in tl.events}
    assert got == {
        (0, "F", 0): (0, 1), (0, "F", 1): (1, 2), (1, "F", 0): (1.5, 3.5), (1, "F", 1): (3.5, 5.5),
        (1, "B", 0): (5.5, 9.5), (1, "B", 1): (9.5, 13.5), (0, "B", 0): (10, 12),
        (0, "B", 1): (14, 16),
    }  # fmt: skip
    assert tl.makespan == 16
    assert tl.bubble == pytest.approx(1 - (6 + 12) / 32)


def test_one_f_one_b_with_latency_by_hand():
    # p=2, m=3, tf=1, tb=2, latency=1 (worked out in the test's comment table):
    # s0: F0 [0,1] F1 [1,2] B0 [6,8] F2 [8,9] B1 [9,11] B2 [14,16]
    # s1: F0 [2,3] B0 [3,5] F1 [5,6] B1 [6,8] F2 [10,11] B2 [11,13]
    tl = S.simulate("1f1b", 2, 3, tf=1, tb=2, latency=1)
    got = [(e.stage, e.kind, e.mb, e.start, e.end) for e in sorted(tl.events)]
    assert sorted(got) == sorted([
        (0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "B", 0, 6, 8), (0, "F", 2, 8, 9),
        (0, "B", 1, 9, 11), (0, "B", 2, 14, 16), (1, "F", 0, 2, 3), (1, "B", 0, 3, 5),
        (1, "F", 1, 5, 6), (1, "B", 1, 6, 8), (1, "F", 2, 10, 11), (1, "B", 2, 11, 13),
    ])  # fmt: skip
    assert tl.makespan == 16


def test_bad_input_says_what_to_change():
    with pytest.raises(ValueError, match="tf must be"):
        S.simulate("gpipe", 2, 4, tf=[1, 2, 3])
    with pytest.raises(ValueError, match="unknown schedule"):
        S.simulate("pipedream", 2, 4)
    with pytest.raises(ValueError, match="divisible by its 2 rounds"):  # torch's rule
        S.simulate("interleaved", 4, 9, v=2)
    with pytest.raises(ValueError, match="must not exceed"):
        S.simulate("zb-h1", 2, 4, tb=1.0, tw=2.0)
    with pytest.raises(ValueError, match="deadlocks"):  # stage 0 waits on B0 before sending F0
        S.simulate([[S.Op("B", 0), S.Op("F", 0)], [S.Op("F", 0), S.Op("B", 0)]], 2, 1)


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1),
                                        ("interleaved-zb", 2)])  # fmt: skip
def test_simulation_fed_with_a_timeline_reproduces_it(schedule, v):
    # A "measurement" that is itself a simulation: simulate_like must find its stage times
    # and its latency again (no per-op overhead), and give the same bubble and makespan.
    from helpers.parallel.pipeline import pipeline_measure as PM

    truth = S.simulate(
        schedule, 2, 4, tf=[1.0, 1.5], tb=[2.0, 3.0], latency=0.25, v=v, tw=[0.8, 1.0]
    )
    again = PM.simulate_like(truth, schedule, v=v)
    assert again.makespan == pytest.approx(truth.makespan)
    assert again.bubble == pytest.approx(truth.bubble)
    assert 0 <= again.bubble < 1


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("interleaved", 2), ("interleaved-zb", 2)])
def test_simulation_keeps_the_measured_box_lengths_when_ops_have_overhead(schedule, v):
    # A gap of 0.1 before every box (per-op book-keeping): the simulation must draw each
    # box as long as measured and the gap beside it, with one gap per chunk op.
    from helpers.parallel.pipeline import pipeline_measure as PM

    meas = S.simulate(schedule, 2, 4, tf=[1.0, 1.5], tb=[2.0, 3.0], latency=0.25, v=v)
    meas.events = [e._replace(start=e.start + 0.1) for e in meas.events]
    again = PM.simulate_like(meas, schedule, v=v)
    got, want = PM.stage_means(again.events, 2), PM.stage_means(meas.events, 2)
    assert got[0] == pytest.approx(want[0]) and got[1] == pytest.approx(want[1])
    assert 0 <= again.bubble < 1


def test_torchs_relaxed_rule_on_m():
    # torch: r = max(1, m // p) rounds, m divisible by r; Megatron wanted m a multiple of p
    assert [m for m in range(1, 17) if _accepts(4, m)] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16]
    for m in (3, 6, 10):  # not multiples of p = 4, and they play to the end
        tl = S.simulate("interleaved", 4, m, v=2)
        assert len(tl.events) == 4 * 2 * m * 2


def _accepts(p, m):
    try:
        S.rounds(p, m)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", ["interleaved", "zb-h1", "interleaved-zb"])
def test_orders_are_torchs(name):
    # The op order each rank runs, against the pipeline_order torch's schedule object holds
    # (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble), on a fake process group.
    import torch
    import torch.distributed as tdist
    from torch.distributed.pipelining import PipelineStage

    from helpers.parallel.composed.simulate import fake_rank
    from helpers.parallel.pipeline import pipeline as PP

    cls = PP.TORCH_SCHEDULES[name]
    compared = 0
    with fake_rank(0, 4):
        for p in (2, 3, 4):
            group = tdist.new_group(list(range(p)))
            for v in (1,) if name == "zb-h1" else (2, 3):
                for m in [m for m in range(1, 3 * p + 1) if _accepts(p, m)]:
                    stages = [PipelineStage(torch.nn.Linear(2, 2), s, p * v, torch.device("cpu"),
                                            group=group) for s in range(0, p * v, p)]  # fmt: skip
                    sched = cls(stages, n_microbatches=m, loss_fn=torch.nn.functional.mse_loss)
                    assert PP.torch_order(sched, p) == S.orders(name, p, m, v), (p, m, v)
                    compared += 1
    assert compared > 20


def test_explorers_slow_stage_sets_the_pace():
    from helpers.viz.pipeline import stage_times

    tf, tb = stage_times(4, 1.0, 2.0, slow=2, slowdown=2.0)
    assert tf == [1, 1, 2, 1] and tb == [2, 2, 4, 2]
    tl = S.simulate("1f1b", 4, 8, tf, tb)
    busy = tl.busy
    assert tl.makespan > S.simulate("1f1b", 4, 8, 1, 2).makespan and busy[2] == max(busy)
    assert stage_times(4, 1.0, 2.0, slow=7, slowdown=3.0) == ([1.0] * 4, [2.0] * 4)


def test_timed_records_the_cpu_seconds_of_each_box_not_its_waiting():
    # A forward that sleeps costs no CPU however long it takes; a backward that computes for
    # 30 ms of CPU costs 30 ms, however long other programs keep it waiting for a core.
    import time
    from types import SimpleNamespace

    from helpers.parallel.pipeline import pipeline_measure as PM

    def compute(mb):
        start = time.thread_time()
        while time.thread_time() - start < 0.03:
            pass

    stage = SimpleNamespace(stage_index=0, group_size=1, forward_one_chunk=lambda mb: time.sleep(0.05),
                            backward_one_chunk=compute, backward_weight_one_chunk=compute)  # fmt: skip
    events: list = []
    PM.timed(stage, 0, events)
    stage.forward_one_chunk(0)
    stage.backward_one_chunk(0)
    (tf,), (tb,) = PM.cpu_means(events, 1)
    assert tf < 0.01 and 0.03 <= tb < 0.2, (tf, tb)
    assert PM.stage_means(events, 1)[0][0] >= 0.05  # the wall time counts the sleep
    with pytest.raises(ValueError, match="no CPU seconds"):
        PM.cpu_means(S.simulate("1f1b", 2, 2).events, 2)  # simulated ops have none
