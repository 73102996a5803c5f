"""notebooks/00b_slurm_jobs.ipynb runs in papermill with a cluster and without one.

With the local cluster up, its %%sbatch cells submit and collect metrics. With
the controller down (a slurm.conf pointing at a port nobody listens on), the
same notebook runs in write-only mode and still completes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.slurm

TOP = Path(__file__).resolve().parents[2]
NOTEBOOK = TOP / "notebooks" / "00b_slurm_jobs.ipynb"


def run_notebook(tmp_path: Path, env: dict) -> nbformat.NotebookNode:
    out = tmp_path / "out.ipynb"
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", "--cwd", str(TOP / "notebooks"), str(NOTEBOOK),
         str(out), "-p", "SMOKE", "True", "--kernel", "python3"],
        env={**os.environ, "WORKBOOK_RUNS": str(tmp_path / "runs"), **env},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return nbformat.read(out, as_version=4)


def text_of(nb) -> str:
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(o.get("text", "") or str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "pdl-workbook"  # the venv's kernel (make setup)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert (
        params and "SMOKE = False" in params[0].source and 'PROFILE = "local"' in params[0].source
    )


def test_notebook_submits_to_the_local_cluster(cluster, tmp_path):
    text = text_of(run_notebook(tmp_path, {}))
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout.strip()
    assert version and f"Slurm is reachable ({version};" in text  # read, never hard-coded
    assert "PENDING" in text and "RUNNING" in text and "COMPLETED" in text
    assert "after cancel(): CANCELLED" in text and "queued (s)" in text
    assert "--- log of rank 1 (tail)" in text and "[rank1]" in text
    assert "submitted job" in text and "'sum': 3.0" in text and "'world_size': 2" in text
    assert "re-attached to job" in text and "same job: True" in text


def test_notebook_runs_write_only_when_the_controller_is_down(cluster, tmp_path):
    live = Path("/etc/slurm/slurm.conf").read_text()
    conf = tmp_path / "slurm.conf"
    lines = [ln for ln in live.splitlines() if not ln.startswith("SlurmctldPort=")]
    conf.write_text("\n".join(lines + ["SlurmctldPort=6999"]) + "\n")  # nobody listens there
    text = text_of(run_notebook(tmp_path, {"SLURM_CONF": str(conf)}))
    assert "write-only mode: the Slurm controller is not responding" in text
    assert "helpers.launch.run(" in text and "submitted job" not in text
    # Nothing it did not observe: no states, timings, logs or metrics of a job that never ran.
    for unseen in (
        "Slurm is reachable",
        "COMPLETED",
        "RUNNING",
        "metrics written",
        "queued (s)",
        "log of rank",
        "after cancel()",
        "slurm-wlm",
    ):
        assert unseen not in text, unseen
