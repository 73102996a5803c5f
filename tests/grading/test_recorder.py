"""The labs' recorder out of the learner's reach: streamed events, tamper in flight, allocations.

Real gloo ranks (helpers.launch.spawn). What a rank's code does to its own copy of the
log after the fact changes nothing in the grading process's copy (the EventLog); a
message changed on its way changes the result as the maths says; a recorder switched
off leaves fewer events than the work requires; allocations are seen whatever object
keeps them.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist

from helpers.course.grading.recorder.allocations import track_allocations
from helpers.course.grading.recorder.recording import Recording
from helpers.course.grading.recorder.traffic import EventLog, Tamper, record_traffic
from helpers.launch import spawn


def _sum_then_rewrite(d, tamper=None):
    t = torch.arange(4.0) + 10 * d.rank
    with record_traffic(allow=["all_reduce"], content=True, tamper=tamper) as traffic:
        tdist.all_reduce(t)
        tdist.all_reduce(torch.ones(2))  # a second call, which the rank's own log then hides
    traffic.collectives[:] = ["all_reduce"]
    traffic.calls[1:] = []
    return t, len(traffic.calls)


def test_the_grading_process_keeps_what_the_rank_rewrites():
    with EventLog() as log:
        out = spawn(_sum_then_rewrite, world_size=2)
    for rank, (_, local_calls) in enumerate(out):
        assert local_calls == 1  # the rank's own log was rewritten
        (rec,) = log.recordings(rank)
        assert rec.closed and rec.calls == [("all_reduce", 16), ("all_reduce", 8)]
        torch.testing.assert_close(rec.contents("collective")[0], torch.arange(4.0) + 10 * rank)


def test_a_message_changed_in_flight_changes_the_sum():
    double = Tamper(rank=1, op="all_reduce", change=lambda t: 2 * t)
    with EventLog() as log:
        out = spawn(_sum_then_rewrite, world_size=2, args=(double,))
    want = torch.arange(4.0) + 2 * (torch.arange(4.0) + 10)  # rank 1's part counted twice
    for t, _ in out:
        torch.testing.assert_close(t, want)
    assert [len(r.tampered) for r in log.recordings()] == [0, 1]


def _switched_off(d):
    from torch.utils._python_dispatch import _disable_current_modes  # refused in learner code

    with record_traffic(allow=["all_reduce"]):
        with _disable_current_modes():
            tdist.all_reduce(torch.ones(3))
    return True


def test_a_recorder_switched_off_leaves_fewer_events_than_the_work():
    with EventLog() as log:
        spawn(_switched_off, world_size=2)
    assert all(r.closed and r.calls == [] for r in log.recordings())  # the maths needs one


def _keeps(d):
    kept = []
    with record_traffic():
        scratch = torch.zeros(8 << 20)  # 32 MiB, dropped
        kept.append(torch.ones(2 << 20) + scratch[: 2 << 20])  # 8 MiB, kept in a list
        del scratch
    return True


def test_allocations_are_seen_whatever_keeps_them():
    # measured by the grading process from the OS (/proc), not counted by the rank (issue 38 B)
    with EventLog(memory=True) as log:
        spawn(_keeps, world_size=1)
    (rec,) = log.recordings(0)
    mib = 1 << 20
    assert 7.5 * mib <= rec.kept_bytes <= 8.5 * mib and rec.peak_bytes >= 39.5 * mib, (
        rec.kept_bytes / mib,
        rec.peak_bytes / mib,
    )
    with track_allocations() as mem:
        view = torch.arange(10.0)[2:5]  # a view keeps its whole storage
    assert mem.kept_bytes == 40 and view.numel() == 3


def _sample(name, rss, hwm, files, files_peak=None):
    mark = {"kind": "mark", "name": name, "rss": rss, "hwm": hwm, "anon": rss, "shmem": 0}
    mark["files"] = files
    if files_peak is not None:
        mark["files_peak"] = files_peak
    return mark


def test_files_written_and_removed_between_two_samples_count_in_the_peak():
    # What the relay saw in the rank's tmpfs at its operations between two samples (files_peak)
    # counts; what it saw before the recording opened (the first sample's) does not.
    mib = 1 << 20
    start = _sample("open", 10 * mib, 10 * mib, 0, files_peak=64 * mib)
    end = _sample("close", 10 * mib, 11 * mib, 0, files_peak=24 * mib)
    rec = Recording(0, "run", 1, [start, end], closed=True)
    assert rec.peak_bytes == 25 * mib and rec.kept_bytes == 0, rec.peak_bytes / mib
    end.pop("files_peak")  # the samples alone: the files came and went between them
    assert rec.peak_bytes == 1 * mib, rec.peak_bytes / mib
