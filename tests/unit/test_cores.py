"""helpers.launch.cores: the cores a timed part really had, and lessons checked only then."""

from __future__ import annotations

import sys
import time

import pytest

from helpers.launch import cores


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_busy_thread_either_runs_or_waits_for_a_core():
    # However busy the machine, a thread that never blocks is running or ready to run: its CPU
    # time plus its waiting time is its wall time. That is what makes 'wanted' a measurement.
    with cores.clock() as c:
        _spin(0.2)
    r = c.reading
    assert r.wall_s >= 0.2 and r.cpu_s > 0
    if sys.platform == "linux":
        assert r.wait_s is not None, "Linux reports each thread's waiting time in schedstat"
        assert 0.8 < (r.cpu_s + r.wait_s) / r.wall_s < 1.2, r


def test_a_sleeping_thread_wants_no_core():
    with cores.clock() as c:
        time.sleep(0.1)
    assert c.reading.cpu_s < 0.05 and (c.reading.wait_s or 0.0) < 0.05, c.reading


def test_the_premise_holds_when_the_ranks_had_what_they_wanted_up_to_the_cores():
    one_each = [cores.Reading(1.0, 0.95, 0.02)] * 2
    assert cores.premise(one_each, cores=2).holds
    crowded = [cores.Reading(1.0, 0.5, 0.5)] * 2  # half of each rank's time spent waiting
    p = cores.premise(crowded, cores=2)
    assert not p.holds and p.had == pytest.approx(1.0) and p.wanted == pytest.approx(2.0)
    # 4 compute-bound ranks on 2 free cores: they wanted 4, could use 2, had 2
    assert cores.premise([cores.Reading(1.0, 0.5, 0.5)] * 4, cores=2).holds
    # a ping-pong wants one core at a time, and had it
    assert cores.premise([cores.Reading(1.0, 0.45, 0.0)] * 2, cores=2).holds
    assert not cores.premise(one_each, cores=2).requiring(False, "more ranks than cores").holds


def test_where_the_os_does_not_say_the_caller_says_what_the_work_wants():
    unknown = [cores.Reading(1.0, 0.45)] * 2
    assert not cores.premise(unknown, cores=2).holds  # one core a rank assumed
    assert cores.premise(unknown, cores=2, wants=1).holds
    assert "assumed" in str(cores.premise(unknown, cores=2))


def test_check_asserts_only_when_the_premise_holds_and_says_what_it_found(capsys):
    held, failed = (
        cores.premise([cores.Reading(1.0, c, 1.0 - c)] * 2, cores=2) for c in (0.99, 0.3)
    )
    cores.check(held, "the lesson", True, "1.5x")
    with pytest.raises(AssertionError, match=r"found 0\.9x.*had 1\.98 of the 2\.00 cores"):
        cores.check(held, "the lesson", False, "0.9x")
    assert held.holds and not failed.holds and failed.crowded
    cores.check(failed, "the lesson", False, "0.9x")  # no assert: prints instead
    out = capsys.readouterr().out
    assert "not checked here: the lesson" in out and "had 0.60 of the 2.00" in out and "0.9x" in out


def test_clocked_returns_the_value_and_a_reading():
    value, reading = cores.clocked(lambda d, x: x + 1)(None, 1)
    assert value == 2 and isinstance(reading, cores.Reading)
    with pytest.raises(TypeError, match="Reading of each rank"):
        cores.premise([(value, reading)])


def test_the_message_names_what_was_timed_and_each_unmet_condition_once(capsys):
    kernel = cores.premise([cores.Reading(1.0, 0.3, 0.7)], cores=2, who="the kernel")
    assert str(kernel).startswith("the kernel had 0.30 of the 1.00 cores it could use")
    four = cores.premise([cores.Reading(1.0, 0.5, 0.5)] * 4, cores=2)  # had its 2 cores
    four = four.requiring(False, "the 2-rank reference to have had its cores")
    assert not four.holds and not four.crowded
    cores.check(four, "the lesson", True, "1.5x")
    out = capsys.readouterr().out
    assert "; the lesson needs the 2-rank reference to have had its cores: not so." in out, out
    assert out.count("but") == 1 and "Other programs" not in out, out
