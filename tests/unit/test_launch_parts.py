"""The pieces of helpers.launch that need no processes: command lines, threads, root cause."""

from __future__ import annotations

import pytest

from helpers import launch
from helpers.launch.supervise import _root_cause


def test_torchrun_command_matches_the_cluster_form():
    cmd = launch.torchrun_command(
        "prog.py", 4, rdzv_endpoint="localhost:1234", rdzv_id="r1", args=["--epochs", 2]
    )
    assert cmd == [
        "torchrun",
        "--nnodes=1",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:1234",
        "--rdzv-id=r1",
        "prog.py",
        "--epochs",
        "2",
    ]
    local = launch.torchrun_command("p.py", 2, exe=["python", "-m", "x"], options=["--tee=3"])
    assert local[:3] == ["python", "-m", "x"] and local[-2:] == ["--tee=3", "p.py"]


@pytest.mark.parametrize(("n", "cores", "want"), [(4, 2, 1), (2, 8, 4), (3, 8, 2), (1, 1, 1)])
def test_threads_per_rank_never_oversubscribes(n, cores, want):
    assert launch.threads_per_rank(n, cores) == want


PEER = [
    "Traceback (most recent call last):",
    '  File "p.py", line 9, in <module>',
    "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:54984.",
]
OWN = [
    "Traceback (most recent call last):",
    '  File "p.py", line 6, in <module>',
    "ValueError: boom",
]


def test_root_cause_prefers_a_rank_whose_error_is_its_own():
    # Rank 1 noticed rank 2's death first, but rank 2's error is the cause.
    errs = {0: [], 1: ["some warning", *PEER], 2: OWN, 3: PEER}
    rank, tb = _root_cause(errs, [1, 2, 3], [])
    assert rank == 2 and tb.startswith("Traceback") and tb.endswith("ValueError: boom")


def test_root_cause_falls_back_to_torchrun_then_first_traceback():
    summary = ["Root Cause (first observed failure):", "[0]:", "  rank      : 3 (local_rank: 3)"]
    assert _root_cause({0: PEER, 3: []}, [0], summary) == (3, "")
    assert _root_cause({0: PEER, 1: PEER}, [1, 0], [])[0] == 1
    assert _root_cause({0: []}, [], []) == (None, "")


def test_rank_failure_names_the_rank_and_carries_the_traceback():
    e = launch.RankFailure(2, "ValueError: boom", "Traceback ...\nValueError: boom")
    assert isinstance(e, RuntimeError) and e.rank == 2
    assert str(e).startswith("rank 2 failed: ValueError: boom")
    assert "--- traceback from rank 2 ---" in str(e)


def test_rank_failure_headline_with_and_without_a_world_size():
    # torchrun's path may not know the world size: the headline must still be built
    assert launch.RankFailure(1, "E: x").headline() == "rank 1 failed: E: x"
    two = launch.RankFailure(1, "E: x", world_size=2).headline()
    assert two == "rank 1 failed; the other rank was stopped: E: x"
    four = launch.RankFailure(0, "E: x", world_size=4).headline()
    assert four == "rank 0 failed; the other 3 ranks were stopped: E: x"


def test_rank_failure_survives_pickling():
    import pickle

    e = pickle.loads(pickle.dumps(launch.RankFailure(1, "boom", "tb")))
    assert (e.rank, e.summary, e.remote_traceback) == (1, "boom", "tb")


def test_failed_run_result_message_leads_with_the_error(tmp_path):
    res = launch.RunResult(
        ok=False,
        returncode=1,
        run_dir=tmp_path,
        command=[],
        wall_time=1.0,
        failed_rank=2,
        traceback="Traceback (most recent call last):\n  ...\nValueError: boom\n",
    )
    with pytest.raises(launch.RankFailure, match=r"rank 2 failed: ValueError: boom \(torchrun"):
        res.raise_for_status()


def test_deepspeeds_build_line_is_kept_in_the_log_and_not_echoed(tmp_path, capsys):
    from helpers.launch.supervise import _Relay

    (tmp_path / "logs").mkdir()
    relay = _Relay(1, tmp_path, stream=True)
    relay.line(
        "[rank0] DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully", False
    )
    relay.line("[rank0] step 0 loss 2.30", False)
    relay.close()
    shown = capsys.readouterr().out
    assert "built successfully" not in shown and "[rank0] step 0 loss 2.30" in shown
    assert "built successfully" in (tmp_path / "logs" / "rank0.log").read_text()
