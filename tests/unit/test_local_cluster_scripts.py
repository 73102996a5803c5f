"""slurm/local/{start,stop}.sh refuse a state directory another user could control.

slurmctld runs as root with its configuration in that directory, and stop.sh
kills the pids listed there, so it must be root's own and writable by no one else.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKBOOK_SLURM_STATE": str(state)}
    return subprocess.run(
        ["bash", str(ROOT / "slurm" / "local" / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("script", ["start.sh", "stop.sh"])
@pytest.mark.parametrize("problem", ["not root's", "group-writable", "a symlink"])
def test_unsafe_state_directories_are_refused(tmp_path, script, problem):
    if os.geteuid() != 0:
        out = _run(script, tmp_path / "state")
        assert out.returncode != 0 or script == "stop.sh"
        return
    state = tmp_path / "state"
    if problem == "a symlink":
        (tmp_path / "elsewhere").mkdir()
        state.symlink_to(tmp_path / "elsewhere")
    else:
        state.mkdir()
        if problem == "not root's":
            os.chown(state, 65534, 65534)  # nobody
        else:
            state.chmod(0o775)
    (state / "run").mkdir(exist_ok=True) if not state.is_symlink() else None
    out = _run(script, state)
    assert out.returncode != 0, out.stdout
    assert "unsafe state directory" in out.stderr
    assert {
        "not root's": "not root",
        "group-writable": "writable by group",
        "a symlink": "not a plain directory",
    }[problem] in out.stderr


def test_the_default_state_directory_is_not_under_tmp():
    text = (ROOT / "slurm" / "local" / "state_dir.sh").read_text()
    assert "WORKBOOK_SLURM_STATE:-/var/lib/workbook-slurm" in text
