"""Letting fresh Unix users reach this checkout's interpreter, for the tests that run commands
as them (tests/grading/test_classroom.py, tests/browser/test_hub.py).

The interpreter may live under /root (pyenv): its ancestors get the search bit (o+x, not
o+r) while a test needs it. `make test` runs two pytest sessions side by side, so two such
tests can overlap; the bits come off only when the last holder, in any process, is done
(a lock file and a small state file in /tmp count the holders; a holder whose process died
is dropped).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

STATE = Path("/tmp/pdl-workbook-searchable.json")
LOCK = Path("/tmp/pdl-workbook-searchable.lock")


@contextlib.contextmanager
def _locked() -> Iterator[dict]:
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(STATE.read_text()) if STATE.exists() else {}
        except ValueError:
            state = {}
        state = {"holders": state.get("holders", {}), "modes": state.get("modes", {})}
        state["holders"] = {k: pid for k, pid in state["holders"].items() if _alive(pid)}
        try:
            yield state
        finally:
            STATE.write_text(json.dumps(state))
            fcntl.flock(lock, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def searchable(*paths: Path) -> Iterator[None]:
    """Every user may reach ``paths`` (o+x on their ancestors) until the last holder leaves."""
    me = uuid.uuid4().hex
    with _locked() as state:
        for path in paths:
            for parent in Path(path).parents:
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH:
                    state["modes"].setdefault(str(parent), stat.S_IMODE(mode))
                    parent.chmod(mode | stat.S_IXOTH)
        state["holders"][me] = os.getpid()
    try:
        yield
    finally:
        with _locked() as state:
            state["holders"].pop(me, None)
            if not state["holders"]:
                for parent, mode in state["modes"].items():
                    with contextlib.suppress(FileNotFoundError):
                        Path(parent).chmod(mode)
                state["modes"] = {}
