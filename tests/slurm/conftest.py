"""The local Slurm cluster for tests/slurm: started once per session, in two-node mode.

slurm/local/start.sh is idempotent (a no-op when the cluster is already up in
this mode), so running it here is cheap. If it cannot start, every test in this
folder fails with the script's output: a missing cluster is a failure, not a skip.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

START = Path(__file__).resolve().parents[2] / "slurm" / "local" / "start.sh"


@pytest.fixture(scope="session")
def cluster():
    try:
        out = subprocess.run(
            ["bash", str(START), "--nodes", "2"], capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{START} --nodes 2 did not finish in 600 s:\n{e.stdout}\n{e.stderr}")
    if out.returncode != 0:
        pytest.fail(
            f"could not start the local Slurm cluster ({START} --nodes 2, exit {out.returncode}):\n"
            f"{out.stdout}\n{out.stderr}\nIt needs root and Debian's slurm packages "
            "(the script installs them with apt-get)."
        )
    return out.stdout
