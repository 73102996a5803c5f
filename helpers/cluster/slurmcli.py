"""Talking to Slurm's command-line tools: is a controller there, what state is a job in.

Kept apart from helpers.cluster.job so the Job class reads as the workflow it is.
Every call has a timeout and takes a list of arguments (no shell).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence

__all__ = [
    "TERMINAL",
    "run",
    "slurm_available",
    "slurm_version",
    "job_state",
    "job_times",
    "base_state",
    "Progress",
    "mmss",
]

TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def run(cmd: Sequence[str], cwd=None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout)


def slurm_available(timeout: float = 10) -> tuple[bool, str]:
    """(True, what answered) when sbatch exists and the controller answers, else (False, why).

    What answered is read, never assumed: ``sinfo --version`` and the controller
    line of ``scontrol ping``, e.g. "slurm-wlm 22.05.8; Slurmctld(primary) at vm is UP".
    """
    if shutil.which("sbatch") is None:
        return False, "no sbatch on PATH"
    try:
        ping = run(["scontrol", "ping"], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"scontrol ping failed: {e}"
    if ping.returncode != 0 or " is UP" not in ping.stdout:
        return (
            False,
            f"the Slurm controller is not responding ({(ping.stdout + ping.stderr).strip()})",
        )
    return True, "; ".join(filter(None, [slurm_version(timeout), ping.stdout.strip()]))


def slurm_version(timeout: float = 10) -> str:
    """What ``sinfo --version`` prints (e.g. "slurm-wlm 22.05.8"), or "" if it says nothing."""
    try:
        out = run(["sinfo", "--version"], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def job_state(job_id: str) -> str:
    """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... or UNKNOWN."""
    try:
        out = run(["scontrol", "show", "job", "-o", str(job_id)])
        for tok in out.stdout.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        # Gone from the controller's memory: ask accounting (slurmdbd, then the text log).
        for extra in ([], ["-c"]):
            acct = run(["sacct", *extra, "-j", str(job_id), "-X", "-n", "-P", "-o", "State"])
            rows = acct.stdout.strip().splitlines()
            if acct.returncode == 0 and rows:
                return rows[-1].split()[0]  # "CANCELLED by 0" -> "CANCELLED"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "UNKNOWN"


def job_times(job_id: str) -> dict[str, float]:
    """Seconds spent waiting in the queue and running, from scontrol (1 s resolution)."""
    from datetime import datetime

    out = run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    try:
        t = {k: datetime.fromisoformat(fields[f"{k}Time"]) for k in ("Submit", "Start", "End")}
    except (KeyError, ValueError):
        return {}
    return {
        "queued_s": (t["Start"] - t["Submit"]).total_seconds(),
        "ran_s": (t["End"] - t["Start"]).total_seconds(),
    }


def base_state(state: str) -> str:
    return state.split()[0].rstrip("+") if state else state


def mmss(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 60}:{s % 60:02d}"


def _notebook_display():
    """IPython's ``display`` when this runs inside a Jupyter kernel, else None.

    Looked up in ``sys.modules``, never imported: the cluster layer must not pull
    IPython into a program, and a kernel has always loaded it already.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return ipython.display.display if getattr(shell, "kernel", None) is not None else None


class Progress:
    """One updating line in a notebook; one line per change elsewhere."""

    def __init__(self, enabled: bool):
        self.enabled, self.handle = enabled, None
        self.last = self.state = self.printed = None
        self.display = _notebook_display() if enabled else None
        self.notebook = self.display is not None

    def __call__(self, state: str, line: str) -> None:
        if not self.enabled:
            return
        if self.notebook:
            if self.handle is None:
                self.handle = self.display({"text/plain": line}, raw=True, display_id=True)
            else:
                self.handle.update({"text/plain": line}, raw=True)
        elif state != self.state:
            print(line, flush=True)  # only when the state changes
            self.printed = line
        self.last, self.state = line, state

    def done(self) -> None:
        if self.enabled and not self.notebook and self.last != self.printed:
            print(self.last, flush=True)  # the final elapsed time
