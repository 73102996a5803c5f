"""Run one program of the check under its own time limit, and say where its time went.

``supervise(spec, limit, work)`` starts ``helpers.course.gpucheck.one`` in a new session.
Past ``limit`` seconds it kills every process of that session and every descendant (the
ranks, their data-loader workers, a compiler DeepSpeed started), and the row says
"timed out after N s, last reached: ..." from the ranks' milestones (``probe``).

``phases(events, launched, ended)`` turns rank 0's milestones into the time each part took:
start-up (Python, torch, the forkserver, the fork), the program's imports and set-up, the
process group (NCCL's communicators), DeepSpeed's op compile, the time to the first
forward, the first step, and the steady step (median of the later ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from helpers.course.gpucheck.probe import read_events

__all__ = ["supervise", "phases", "last_reached", "kill_tree"]


def _children() -> dict[int, list[int]]:
    """pid -> its children's pids, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(stat.parent.name))
    return tree


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, every descendant of it, and its process group (its session's)."""
    tree, todo, found = _children(), [pid], []
    while todo:
        p = todo.pop()
        found.append(p)
        todo += tree.get(p, [])
    for p in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # started with start_new_session: its pgid is its pid


def supervise(spec: dict, limit: float, work: Path, env: dict | None = None) -> dict:
    """Run ``spec`` (see ``one``) in its own session; the result, or the time-out verdict."""
    work.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "result": str(work / "result.json"), "backstop_s": limit + 120}
    (work / "spec.json").write_text(json.dumps(spec, indent=1))
    top = Path(__file__).resolve().parents[3]
    launched = time.time()
    with (work / "process.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "helpers.course.gpucheck.one",
                                 str(work / "spec.json")], cwd=top, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})  # fmt: skip
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = None
        except BaseException:  # Ctrl-C: leave nothing behind
            kill_tree(proc.pid)
            raise
        finally:
            kill_tree(proc.pid)  # what a finished run left behind, or the run itself
            proc.wait()
    ended = time.time()
    result_path = Path(spec["result"])
    if code is None or not result_path.is_file():
        result = {
            "ok": False,
            "reached": None,
            "seconds": ended - launched,
            "timed_out": code is None,
        }
        events = read_events(Path(spec["events"])) if spec.get("events") else []
        last = last_reached(events)
        result["error"] = (f"timed out after {limit:.0f} s, last reached: {last}" if code is None
                           else f"the check's process ended with code {code} and no result: "
                                + (work / "process.log").read_text()[-800:])  # fmt: skip
    else:
        result = json.loads(result_path.read_text())
        events = read_events(Path(spec["events"])) if spec.get("events") else []
    result["wall"] = round(ended - launched, 1)
    if spec.get("events"):
        result["phases"] = phases(events, launched, result.get("ended_at", ended))
    return result


def last_reached(events: list[dict]) -> str:
    """'step 3 (12.0 s ago; last output: "...")' from a rank's milestones."""
    if not events:
        return "no rank started the program"
    now = time.time()
    marks = [e for e in events if e["event"] != "out"]
    steps = sum(e["event"] == "step" for e in marks)
    last = marks[-1]
    names = {"start": "the program's start (imports)", "group": "init_process_group (NCCL)",
             "group-ready": "the process group, before the first forward",
             "forward": "the first forward", "op": f"DeepSpeed's {last.get('op')} op loaded"}  # fmt: skip
    text = f"step {steps}" if last["event"] == "step" else names.get(last["event"], last["event"])
    text += f" ({now - last['t']:.0f} s before the end"
    out = [e for e in events if e["event"] == "out"]
    return text + (f"; last output: {out[-1]['line']!r})" if out else ")")


def phases(events: list[dict], launched: float, ended: float) -> dict:
    """Seconds per phase of rank 0's run (absent phases left out)."""
    at = {}
    for e in events:
        at.setdefault(e["event"], e["t"])
    steps = [e["t"] for e in events if e["event"] == "step"]
    out: dict = {}
    if "start" in at:
        out["start_up"] = at["start"] - launched
    if "group" in at:
        out["imports_and_setup"] = at["group"] - at.get("start", launched)
    if "group-ready" in at:
        out["process_group"] = at["group-ready"] - at["group"]
    ops = [e for e in events if e["event"] == "op"]
    if ops:
        out["deepspeed_ops"] = {e["op"]: e["seconds"] for e in ops}
    if "forward" in at:
        out["to_first_forward"] = at["forward"] - at.get("group-ready", at.get("start", launched))
    if steps and "forward" in at:
        out["first_step"] = steps[0] - at["forward"]
    if len(steps) > 2:
        gaps = [b - a for a, b in zip(steps[1:], steps[2:], strict=False)]
        out["steady_step"] = statistics.median(gaps)
        out["steady_steps_timed"] = len(gaps)
    last = steps[-1] if steps else at.get("forward") or at.get("start")
    if last:
        out["after_last_mark"] = ended - last
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
