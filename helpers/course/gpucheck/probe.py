"""Inside a checked rank: when it reached each milestone, so the check can say where time went.

The check runs a small wrapper program (``wrapper_source``) in place of the job's program; it
calls ``run(program, events)``, which records, one JSON line each, with wall-clock times:

* ``start``: the rank begins the program (after its process started and torch was imported);
* ``group`` / ``group-ready``: ``init_process_group`` called and returned (with NCCL and a
  ``device_id``, as ``helpers.dist.init`` passes, the communicators are made there);
* ``forward``: the first forward of any module; ``step``: each optimizer step's end;
* ``op``: DeepSpeed's "Time to load cpu_adam op: 41.2 seconds" (its JIT compile and load);
* ``out``: the last line the rank printed, kept for "last reached: ...".

Then it runs the program as ``__main__`` from the program's own folder, as the runner would.
Nothing here changes what the program computes.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import sys
import time
from pathlib import Path

__all__ = ["run", "wrapper_source", "read_events"]

_OP = re.compile(r"Time to load (\w+) op: ([\d.]+) seconds")


class _Events:
    def __init__(self, folder: str):
        rank = os.environ.get("RANK", "0")
        self.path = Path(folder) / f"rank{rank}.jsonl"
        self.first_forward = True
        self.last_out = 0.0

    def __call__(self, event: str, **data) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"event": event, "t": time.time(), **data}) + "\n")


class _Tee:
    """A text stream that notes DeepSpeed's op load times and the last line printed."""

    def __init__(self, stream, events: _Events):
        self._stream, self._events = stream, events

    def write(self, text: str) -> int:
        for m in _OP.finditer(text):
            self._events("op", op=m.group(1), seconds=float(m.group(2)))
        line = text.strip().splitlines()[-1] if text.strip() else ""
        now = time.time()
        if line and now - self._events.last_out > 0.5:  # at most two a second
            self._events.last_out = now
            self._events("out", line=line[:200])
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _hooks(events: _Events) -> None:
    import torch
    import torch.distributed as tdist
    from torch.optim.optimizer import register_optimizer_step_post_hook

    original = tdist.init_process_group

    def init_process_group(*args, **kwargs):
        events("group")
        out = original(*args, **kwargs)
        events("group-ready")
        return out

    def forward(*_):
        if events.first_forward:
            events.first_forward = False
            events("forward")

    tdist.init_process_group = init_process_group
    torch.nn.modules.module.register_module_forward_pre_hook(forward)
    register_optimizer_step_post_hook(lambda *_: events("step"))


def run(program: str, folder: str) -> None:
    """Record milestones into ``folder``, then run ``program`` as __main__ from its folder."""
    events = _Events(folder)
    events("start")
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)  # the log is read while the rank runs
        setattr(sys, name, _Tee(stream, events))
    _hooks(events)
    path = Path(program)
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    sys.argv[0] = str(path)
    runpy.run_path(str(path), run_name="__main__")


def wrapper_source(program: Path, folder: Path) -> str:
    """The program the runner starts in place of ``program``."""
    return ("# written by helpers.course.gpucheck: times the program's phases, then runs it\n"
            "from helpers.course.gpucheck import probe\n\n"
            f"probe.run({str(program)!r}, {str(folder)!r})\n")  # fmt: skip


def read_events(folder: Path, rank: int = 0) -> list[dict]:
    """A rank's events, oldest first ([] if it wrote none)."""
    path = Path(folder) / f"rank{rank}.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip().endswith("}")]
