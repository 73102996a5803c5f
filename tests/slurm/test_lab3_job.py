"""Lab 3's cluster cells on the local Slurm cluster: the learner's pipeline runs as a job.

papermill runs the solution notebook top to bottom (SMOKE) in a scratch directory.
Its ``%%program`` cells write the learner's ``gpipe_step`` and bubble formulas to
programs/, its ``%%sbatch lab3_bench`` cell submits a real job that imports them,
and the result cell waits for the job. The test then reads the job's metrics: the
gradients of the learner's pipeline equal the whole model's, and the formulas the
job printed are the learner's.
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
LAB = TOP / "solutions" / "lab3" / "lab3.ipynb"


def _outputs(nb) -> str:
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(o.get("text", "") or str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def test_lab3_bench_job_runs_the_learners_pipeline(cluster, tmp_path):
    work = tmp_path / "lab3"
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
    assert "submitted job" in text and "largest relative difference" in text, text[-2000:]

    [run_dir] = [m.parent for m in (runs / "lab3_bench").glob("*/metrics.json")]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    p = metrics["world_size"]
    assert p == 2 and metrics["backend"] == "gloo"
    assert metrics["max_relative_gradient_error"] < 1e-4  # float32: the whole model's gradients
    assert 0.5 < metrics["parallel_devices"] < 1.5 * p  # how many ranks really ran at once
    assert [r["m"] for r in metrics["rows"]] == [1, 2, 4, 8]
    for row in metrics["rows"]:  # the learner's formulas ran in the job
        m = row["m"]
        assert row["your_speedup"] == pytest.approx(m * p / (m + p - 1))
        assert row["your_bubble"] == pytest.approx((p - 1) / (m + p - 1))
        assert row["step_s"] > 0
    # The job imported the learner's cells, saved by %%program, and kept them with the run.
    for module in ("lab3_gpipe.py", "lab3_bubble.py"):
        assert (run_dir / module).read_text() == (work / "programs" / module).read_text()
    assert "def gpipe_step" in (run_dir / "lab3_gpipe.py").read_text()
