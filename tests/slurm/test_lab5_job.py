"""Lab 5's cluster cells on the local Slurm cluster: the learner's mesh and TP plan run as a job.

papermill runs the solution notebook top to bottom (SMOKE) in a scratch directory. Its
``%%program lab5_plan`` cell writes the learner's ``make_mesh`` and ``block_plan`` to
programs/, its ``%%sbatch lab5_bench`` cell submits a real job (1 node x 4 ranks) that
imports them and trains FSDP x TP = 2 x 2, and the result cell waits for the job. The
test then reads the job's metrics: its losses equal one rank's, and the job kept the
learner's file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TOP = Path(__file__).resolve().parents[2]
LAB = TOP / "solutions" / "lab5" / "lab5.ipynb"


def _outputs(nb) -> str:
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(o.get("text", "") or str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def test_lab5_bench_job_trains_with_the_learners_plan(cluster, tmp_path):
    work = tmp_path / "lab5"
    work.mkdir()
    shutil.copy(LAB, work / LAB.name)
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", "--cwd", str(work), str(work / LAB.name),
         str(work / "out.ipynb"), "-p", "SMOKE", "True", "--kernel", "python3"],
        env={**os.environ, "WORKBOOK_RUNS": str(runs), "PYTHONPATH": str(TOP)},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = _outputs(nbformat.read(work / "out.ipynb", as_version=4))
    assert "submitted job" in text and "largest loss difference" in text, text[-2000:]

    [run_dir] = [m.parent for m in (runs / "lab5_bench").glob("*/metrics.json")]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 4 and metrics["backend"] == "gloo"
    assert len(metrics["losses"]) == len(metrics["one_rank_losses"]) == 5
    assert metrics["max_loss_difference"] < 1e-4  # 2 x 2 FSDP + TP trains like one rank
    assert metrics["losses"][-1] < metrics["losses"][0]  # and it learns the sequences
    assert metrics["tokens_per_s"] > 0
    # The job imported the learner's cell, saved by %%program, and kept it with the run.
    assert (run_dir / "lab5_plan.py").read_text() == (
        work / "programs" / "lab5_plan.py"
    ).read_text()
    assert "def block_plan" in (run_dir / "lab5_plan.py").read_text()
