"""Following a submitted job: its state, a live wait, cancel, its runs, its logs, its result.

``Job`` (helpers.cluster.job) inherits these; they read what ``Job`` keeps: ``job_id``,
``name``, ``run_dir``, the state last seen (``_state``) and the job's record.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from helpers.cluster.history import job_history
from helpers.cluster.slurmcli import (
    TERMINAL,
    Progress,
    base_state,
    job_state,
    mmss,
    run,
    slurm_available,
)
from helpers.runs import read_metrics

_RANK_TAG = re.compile(r"(?=\[(?:rank ?\d+|default\d+)\]:? )")  # zero-width: keeps the tag


class Following:
    """The follow-up half of a Slurm job (see helpers.cluster.job.Job)."""

    job_id: str | None
    name: str
    run_dir: Path
    _state: str

    def status(self) -> str:
        if not self.job_id:
            return "NOT_SUBMITTED"
        if self._state not in TERMINAL:
            state = base_state(job_state(self.job_id))
            if state != self._state:
                self._state = state
                seen = self._load_record().get("states", [])  # every change this Job saw
                self._save_record(states=[*seen, [round(time.time(), 1), state]])
        return self._state

    def wait(self, timeout: float | None = None, poll: float = 0.5, progress: bool = True) -> str:
        """Block until the job ends; show its state and elapsed time as it goes."""
        if not self.job_id:
            print(f"{self.name}: not submitted (write-only mode), nothing to wait for")
            return "NOT_SUBMITTED"
        if self._state not in TERMINAL and not slurm_available()[0]:
            print(f"job {self.job_id} ({self.name}): Slurm is not reachable from here; "
                  f"last known state {self._state}")  # fmt: skip
            return self._state
        show = Progress(progress)
        t0 = self._load_record().get("submitted", time.time())
        start, unknown = time.monotonic(), 0
        while True:
            state = self.status()
            unknown = unknown + 1 if state == "UNKNOWN" else 0
            if unknown >= 10:  # the controller answers but has no record of the job
                raise RuntimeError(
                    f"Slurm no longer knows job {self.job_id} (was the cluster reset?); "
                    "run it again with submit(force=True) or %%sbatch ... --resubmit"
                )
            show(
                state,
                f"job {self.job_id} ({self.name}): {state:<10} {mmss(time.time() - t0)} elapsed",
            )
            if state in TERMINAL:
                show.done()
                return state
            if timeout is not None and time.monotonic() - start > timeout:
                show.done()
                raise TimeoutError(
                    f"job {self.job_id} still {state} after {timeout:.0f} s "
                    "(call wait() again, or cancel())"
                )
            time.sleep(poll)

    def cancel(self, timeout: float = 30) -> str:
        """scancel the job and wait until Slurm reports it ended."""
        if not self.job_id:
            return "NOT_SUBMITTED"
        run(["scancel", str(self.job_id)])
        return self.wait(timeout=timeout, progress=False)

    def history(self) -> dict:
        """Every run of a requeued job: Slurm's restart count, the runs its log records
        (start time, the signal that stopped it), the state changes this Job saw."""
        if not self.job_id:
            return {"job_id": None, "state": "NOT_SUBMITTED", "restarts": 0, "runs": []}
        return {**job_history(self.job_id, self.log_path),
                "states_seen": self._load_record().get("states", [])}  # fmt: skip

    @property
    def log_path(self) -> Path | None:
        return self.run_dir / f"slurm-{self.job_id}.out" if self.job_id else None

    def logs(self, tail: int = 30, rank: int | None = None) -> str:
        """The last lines of the job's output; rank=r keeps lines tagged with that rank."""
        p = self.log_path
        if p is None or not p.is_file():
            return ""
        lines = p.read_text(errors="replace").splitlines()
        if rank is not None:
            # Ranks share one output file. A print is two writes (text, then "\n"), so
            # two ranks' lines can land on one line: split again before each rank tag.
            lines = [part for ln in lines for part in _RANK_TAG.split(ln) if part]
            tags = (f"[rank{rank}]", f"[rank {rank}]", f"[default{rank}]:", f"{rank}: ")
            lines = [ln for ln in lines if ln.lstrip().startswith(tags)]
        return "\n".join(lines[-tail:])

    def result(self, timeout: float | None = None) -> dict | None:
        """The metrics rank 0 wrote; waits for the job. None in write-only mode."""
        if not self.job_id:
            print(
                f"{self.name}: not submitted (write-only mode), no result; run it locally with:\n"
                f"  {self.local_command()}"
            )
            return None
        state = self.wait(timeout=timeout, progress=False)
        if state != "COMPLETED":
            raise RuntimeError(
                f"job {self.job_id} ({self.name}) ended {state}; "
                f"last lines of {self.log_path}:\n{self.logs(tail=20)}"
            )
        metrics = read_metrics(self.run_dir / "metrics.json")
        if not metrics:
            raise RuntimeError(
                f"job {self.job_id} completed but wrote no {self.run_dir}/metrics.json: "
                "call helpers.runs.write_metrics({...}) in the program"
            )
        return metrics
