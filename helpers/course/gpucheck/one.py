"""One program of the check, in a process of its own: ``python -m helpers.course.gpucheck.one SPEC``.

The check starts this in a new session with a time limit (``supervise``): when the limit
passes, the whole session (this process, the forkserver, the ranks, their data-loader
workers and compilers) is killed, and only this program's row says so.

SPEC (JSON) says what to run and where its result goes:

* ``{"kind": "program", "program", "args", "world", "steps", "mode", "events", "result"}``:
  the ranks of a job or a measurement through ``helpers.course.dryrun.runner.run_ranks``,
  each rank running the probe wrapper (``probe``) so its milestones are timed;
* ``{"kind": "notebook", "notebook", "output", "result"}``: a notebook executed by
  ``helpers.course.book.runner.execute`` with the ``python3`` kernel.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

__all__ = ["main", "run_program", "run_notebook"]


def run_program(spec: dict) -> dict:
    from helpers.course.dryrun.runner import run_ranks
    from helpers.course.gpucheck import probe

    program, events = Path(spec["program"]), Path(spec["events"])
    events.mkdir(parents=True, exist_ok=True)
    wrapper = events / "probe_wrapper.py"
    wrapper.write_text(probe.wrapper_source(program.resolve(), events.resolve()))
    world, mode = spec["world"], spec["mode"]
    results = run_ranks(wrapper, spec["args"], mode, world, gpus_per_node=world,
                        timeout=spec.get("backstop_s", 3600), max_steps=spec["steps"],
                        small=mode == "strict")  # fmt: skip
    first = results[0]
    bad = next((r for r in results if not r.get("ok")), None)
    return {"ok": bad is None, "reached": first.get("reached"), "steps": first.get("steps"),
            "seconds": first.get("seconds"), "error": (bad or {}).get("error", ""),
            "where": _where(bad, program) if bad else "", "metrics": first.get("metrics"),
            "peak_gib": (first.get("peak_bytes") or {}).get("gpu", 0) / 2**30,
            "tail": (bad or {}).get("output_tail", "")[-1500:]}  # fmt: skip


def _where(result: dict, program: Path) -> str:
    """The program's own deepest line in the failure's traceback ('program.py:142: code'),
    else the deepest line with a source."""
    lines = result.get("traceback", "").splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in ', line)
        if m and not m.group(1).startswith("<"):  # not frozen or generated code
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            frames.append((m.group(1), m.group(2), "" if nxt.startswith("File ") else nxt))
    mine = [f for f in frames if Path(f[0]).resolve() == program.resolve()]
    f = (mine or frames or [None])[-1]
    return f"{Path(f[0]).name}:{f[1]}: {f[2]}" if f else ""


def run_notebook(spec: dict) -> dict:
    from helpers.course.book import runner as book

    res = book.execute(Path(spec["notebook"]), Path(spec["output"]), root=Path(spec["root"]),
                       kernel_name="python3", cell_timeout=spec.get("cell_timeout", 1800))  # fmt: skip
    metrics = Path(spec["metrics"]) if spec.get("metrics") else None
    return {"ok": res.ok, "seconds": res.seconds, "output": str(res.output),
            "error": res.error[-2000:],
            "metrics": json.loads(metrics.read_text()) if metrics and metrics.is_file() else None}  # fmt: skip


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    start = time.time()
    run = run_program if spec["kind"] == "program" else run_notebook
    result = run(spec)
    result["ended_at"] = time.time()
    result["process_s"] = result["ended_at"] - start
    tmp = Path(spec["result"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(spec["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
