"""Preemptible jobs on the local Slurm cluster: interrupted, requeued, resumed, bit-identical.

The job is the real data-parallel program (helpers/programs/train_ddp.py, 2 gloo
ranks under torchrun) with checkpoints in a shared directory. It is stopped
mid-run twice over: by a signal to the batch shell (what ``--signal=B:USR1@90``
sends before the time limit) and by ``scontrol requeue`` (what an operator or a
preemption does). Either way it must come back under the same job id, resume
from its checkpoint, and end with the parameters of a run that never stopped.
"""

from __future__ import annotations

import secrets
import time

import pytest

import helpers.programs.train_ddp as program
from helpers import launch
from helpers.cluster.history import start_now
from helpers.cluster.job import Job
from helpers.cluster.slurmcli import job_state, run
from helpers.config import parse
from helpers.parallel.sharded import checkpoint

pytestmark = pytest.mark.slurm

# 384 samples, 16 per rank, 2 ranks: 12 steps per epoch, 24 in all; 0.4 s per step
# leaves time to interrupt the job between its first checkpoint and its end.
ARGS = ["--epochs", 2, "--n-train", 384, "--n-test", 40, "--batch-size", 16,
        "--offline", "true", "--deterministic", "true", "--evaluate", "false"]  # fmt: skip
STEPS = 24


_REFERENCES: dict[str, dict] = {}


@pytest.fixture(params=["ddp", "fsdp"])
def uninterrupted(request):
    """(sync, metrics of the same training never stopped), once per module and sync."""
    sync = request.param
    if sync not in _REFERENCES:
        # The same options parsed as the program parses them, on 2 pooled ranks (no
        # torchrun start-up) with one thread each, as the local profile's jobs run.
        cfg = parse(program.DDPConfig, [str(a) for a in [*ARGS, "--sync", sync]])
        metrics = launch.spawn(program.train, world_size=2, args=(cfg,), threads=1)[0]
        assert metrics["steps"] == STEPS
        _REFERENCES[sync] = metrics
    return sync, _REFERENCES[sync]


def _poll(what: str, ok, timeout: float, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def _interrupt_and_resume(
    tmp_path, interrupt: list[str], expected_signal: str, reference, nodes: int = 1
):
    sync, uninterrupted = reference
    ckpt = tmp_path / "ckpt"
    job = Job(f"requeue-{secrets.token_hex(3)}", program.__file__, nodes=nodes, gpus_per_node=2 // nodes,
              args=[*ARGS, "--sync", sync, "--ckpt-dir", ckpt, "--ckpt-every", 4, "--step-delay", 0.4],
              signal="USR1@60", requeue=True, time="00:05:00")  # fmt: skip
    assert "#SBATCH --signal=B:USR1@60" in job.write().read_text()
    job.submit()
    try:
        # Training has begun (a checkpoint exists), and is far from done.
        first = _poll("a first checkpoint", lambda: checkpoint.latest(ckpt), timeout=60)
        assert first.name == "step-00000004"
        out = run([*interrupt, job.job_id])
        assert out.returncode == 0, out.stderr

        # The job goes back to the queue and starts again under the same id (released
        # from the 120 s hold Slurm puts on a requeued job instead of waiting it out).
        def started_again() -> bool:
            start_now(job.job_id)
            return len(job.history()["runs"]) >= 2

        _poll("a second start", started_again, timeout=60)
        metrics = job.result(timeout=120)
    except BaseException:
        print(job.logs(tail=60))
        raise
    finally:
        if job_state(job.job_id) not in ("COMPLETED", "UNKNOWN"):
            job.cancel()
    history = job.history()
    assert history["restarts"] == 1
    assert [r["restart"] for r in history["runs"]] == [0, 1]
    assert history["runs"][0]["stopped_by"] == expected_signal
    assert any(s == "RUNNING" for _, s in history["states_seen"])
    (stopped_at,) = metrics["resumed_at"]
    assert 4 <= stopped_at < STEPS  # it resumed from a checkpoint taken when it was stopped
    assert metrics["loss"] == uninterrupted["loss"]
    assert metrics["params_sha256"] == uninterrupted["params_sha256"]
    return job, stopped_at


def test_warning_signal_checkpoints_requeues_and_ends_bit_identical(cluster, tmp_path,
                                                                    uninterrupted):  # fmt: skip
    # What Slurm sends --signal=B:USR1@N seconds before the time limit, sent now.
    job, _ = _interrupt_and_resume(tmp_path, ["scancel", "--signal=USR1", "--batch"], "USR1",
                                   uninterrupted)  # fmt: skip
    log = job.log_path.read_text()
    assert "SIGUSR1 received: asking the ranks to checkpoint" in log
    assert "requeueing job" in log


def test_scontrol_requeue_resumes_and_ends_bit_identical(cluster, tmp_path, uninterrupted):
    # Slurm sends SIGTERM to every process of the job, then SIGKILL after KillWait (30 s).
    _interrupt_and_resume(tmp_path, ["scontrol", "requeue"], "TERM", uninterrupted)


@pytest.mark.parametrize("uninterrupted", ["ddp"], indirect=True)
def test_two_node_job_stopped_by_the_warning_signal_resumes_bit_identical(cluster, tmp_path,
                                                                          uninterrupted):  # fmt: skip
    # Two nodes x 1 rank: the job script hands SIGTERM to srun, which ends the step; the
    # ranks may die before their own checkpoint, and then resume from the last periodic one.
    job, _ = _interrupt_and_resume(tmp_path, ["scancel", "--signal=USR1", "--batch"], "USR1",
                                   uninterrupted, nodes=2)  # fmt: skip
    assert "--nnodes=$SLURM_NNODES" in job.script.read_text()
