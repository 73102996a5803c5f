"""A requeued job's life: how often it started, what stopped it, what Slurm says now.

One job id can run several times: ``scontrol requeue``, a preemption, or its own
job script after a warning signal (``--signal=B:USR1@90 --requeue``) put it back
in the queue, and it starts again under the same id. Slurm keeps a count
(``Restarts=`` in ``scontrol show job``); accounting, when there is any, keeps
one row per run (``sacct --duplicates``). The job script of a preemptible job
(slurm/templates/base.sh.j2) also writes one line per start and one per stop
into ``slurm-<id>.out``, opened in append mode, which is all this needs when
accounting is off (as on the local cluster):

    start 1795424167 restart 0
    job script: stopped by SIGUSR1 (launcher exit 0): requeueing job 42
    start 1795424190 restart 1
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from helpers.cluster.slurmcli import run

__all__ = ["job_history", "start_now"]

_START = re.compile(r"^start (\d+) restart (\d+)$")
_STOP = re.compile(r"^job script: stopped by SIG(\w+)")


def _scontrol(job_id: str) -> dict:
    try:
        out = run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def _sacct_runs(job_id: str) -> list[dict]:
    """One row per run from accounting (empty without slurmdbd)."""
    cols = ("JobID", "State", "Start", "End", "ExitCode")
    try:
        out = run(["sacct", "--duplicates", "-X", "-n", "-P", "-j", str(job_id),
                   "-o", ",".join(cols)])  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [
        dict(zip(cols, line.split("|"), strict=False)) for line in out.stdout.splitlines() if line
    ]


def _runs_from_log(log: Path | None) -> list[dict]:
    """[{"restart": 0, "started": epoch_s, "stopped_by": "USR1" or None}, ...] in order."""
    runs: list[dict] = []
    if log is None or not log.is_file():
        return runs
    for line in log.read_text(errors="replace").splitlines():
        if m := _START.match(line.strip()):
            runs.append({"restart": int(m.group(2)), "started": int(m.group(1)),
                         "stopped_by": None})  # fmt: skip
        elif (m := _STOP.match(line.strip())) and runs:
            runs[-1]["stopped_by"] = m.group(1)
    return runs


def job_history(job_id: str, log: Path | None = None) -> dict:
    """What is known about every run of ``job_id`` (see the module docstring).

    Returns {"job_id", "state", "restarts", "runs", "accounting"}: restarts is
    Slurm's count (None once the controller forgot the job), runs come from
    the job's log, accounting from sacct (empty when accounting is off).
    """
    info = _scontrol(job_id)
    restarts = info.get("Restarts")
    return {
        "job_id": str(job_id),
        "state": info.get("JobState", "UNKNOWN"),
        "restarts": int(restarts) if restarts is not None else None,
        "runs": _runs_from_log(log),
        "accounting": _sacct_runs(job_id),
    }


def start_now(job_id: str, delay_s: int = 3) -> bool:
    """Make a requeued job eligible in ``delay_s`` seconds; True if it was held longer.

    Slurm holds a requeued batch job for a while (EligibleTime = requeue time +
    the job credential's lifetime, 120 s by default): the old run's credential is
    revoked, and a new one issued within the same second would be refused ("Job
    credential revoked": the job FAILs). A few seconds are enough on one cluster;
    the notebook and the tests would otherwise spend two minutes idle. Call it in
    a polling loop until the job runs: once the job is due, another call asks the
    scheduler to start it (else it waits for the next backfill pass).
    """
    from datetime import datetime

    info = _scontrol(job_id)
    if info.get("JobState") != "PENDING":
        return False
    try:
        wait = (datetime.fromisoformat(info["EligibleTime"]) - datetime.now()).total_seconds()
    except (KeyError, ValueError):
        return False
    if info.get("Reason") == "BeginTime" and wait > delay_s + 2:  # held after a requeue
        out = run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{int(delay_s)}"])
        return out.returncode == 0
    if wait < 0:  # eligible, still waiting: an update makes the scheduler look now, not
        # at its next backfill pass (up to 30 s later)
        out = run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
        return out.returncode == 0
    return False
