"""Every lab's cluster cells on the local Slurm cluster: the learner's own code runs as a job.

A lab is picked up here as soon as its solution notebook has a ``%%sbatch`` cell
(every lab today; a new lab needs no edit). papermill runs the solution top to
bottom (SMOKE) in a scratch directory, so its ``%%program`` cells write the
learner's answers to programs/ and its ``%%sbatch NAME`` cell submits a real job
whose driver imports them. The test then checks, for every such cell:

- the job COMPLETED in Slurm and rank 0's metrics came back into the notebook
  (the result cell printed them, not the "not submitted" message);
- the run directory holds a copy of each learner module the driver imports,
  identical to the one the ``%%program`` cell wrote: the job ran the learner's code;
- the metrics show as many gloo ranks as the cell asked for, and where this file
  knows the lab, that the learner's code gave the right answer inside the job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.cluster.slurmcli import job_state
from helpers.course import dryrun
from helpers.course.grading.labs import labs_with_jobs, sbatch_cells

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TOP = Path(__file__).resolve().parents[2]


def ranks_asked(args: str) -> int:
    def option(flag: str) -> int:
        m = re.search(rf"--{flag}[ =](\d+)", args)
        return int(m.group(1)) if m else 1

    return option("nodes") * option("gpus-per-node")


def _lab3(r, run_dir) -> bool:
    p = r["world_size"]
    assert r["max_relative_gradient_error"] < 1e-4  # float32: the whole model's gradients
    assert 0.5 < r["parallel_devices"] < 1.5 * p  # how many ranks really ran at once
    assert [row["m"] for row in r["rows"]] == [1, 2, 4, 8]
    for row in r["rows"]:  # the learner's formulas ran in the job
        m = row["m"]
        assert row["your_speedup"] == pytest.approx(m * p / (m + p - 1))
        assert row["your_bubble"] == pytest.approx((p - 1) / (m + p - 1))
        assert row["step_s"] > 0
    return "def gpipe_step" in (run_dir / "lab3_gpipe.py").read_text()


def _lab5(r, run_dir) -> bool:
    assert len(r["losses"]) == len(r["one_rank_losses"]) == 5
    assert r["max_loss_difference"] < 1e-4  # 2 x 2 FSDP + TP trains like one rank
    assert r["losses"][-1] < r["losses"][0]  # and it learns the sequences
    assert r["tokens_per_s"] > 0
    return "def block_plan" in (run_dir / "lab5_plan.py").read_text()


# What the learner's code must have computed inside the job, per lab (rank 0's metrics
# and the run directory, which holds the learner's modules).
CORRECT = {
    "lab0": lambda r, _: (
        r["your_mean"] == pytest.approx(r["expected_mean"], rel=1e-9)
        and r["gathered_mean"] == pytest.approx(r["expected_mean"], rel=1e-9)
        and r["your_calls"] == [["all_reduce", 16]]  # one all-reduce of (sum, count) in float64
        and r["gather_bytes_sent_per_rank"]
        >= (r["world_size"] - 1) / r["world_size"] * r["n_items"] * 8
    ),
    "lab1": lambda r, _: r["rows"] and all(row["equal"] for row in r["rows"]),
    "lab2": lambda r, _: r["max_abs_diff"] < 1e-5,
    "lab3": _lab3,
    "lab4": lambda r, _: r["max_abs_error"] < 1e-4,
    "lab5": _lab5,
    "lab6": lambda r, _: (
        r["widths"]
        and all(  # per width: after backward, overlap, buckets
            len(w["rows"]) == 3 and all(row["max_abs_diff"] < 1e-4 for row in w["rows"])
            for w in r["widths"]
        )
    ),
    "lab7": lambda r, _: r["rows"] and all(row["max_abs_error"] < 1e-4 for row in r["rows"]),
    "lab8": lambda r, _: (
        max(r["errors"].values()) < 1e-4  # forward and backward against the serial twin
        and sum(r["load"]) == r["world_size"] * r["tokens"] * r["k"]  # every assignment arrived
    ),
}


def outputs_after(nb, source: str) -> str:
    """Text output of the cell that follows the %%sbatch cell (the result cell)."""
    cells = [c for c in nb.cells if c.cell_type == "code"]
    i = next(k for k, c in enumerate(cells) if c.source == source)
    parts = []
    for o in cells[i + 1].get("outputs", []):
        data = o.get("data", {})
        parts.append(
            o.get("text", "") or data.get("text/markdown", "") or data.get("text/plain", "")
        )
    return "\n".join(map(str, parts))


@pytest.mark.parametrize("lab", labs_with_jobs(TOP), ids=lambda p: p.parent.name)
def test_lab_job_runs_the_learners_code(cluster, tmp_path, lab):
    work, runs = tmp_path / lab.parent.name, tmp_path / "runs"
    shutil.copytree(lab.parent, work, ignore=shutil.ignore_patterns("programs", ".ipynb*"))
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", "--cwd", str(work), str(work / lab.name),
         str(work / "out.ipynb"), "-p", "SMOKE", "True", "--kernel", "python3"],
        env={**os.environ, "WORKBOOK_RUNS": str(runs), "PYTHONPATH": str(TOP)},
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    nb = nbformat.read(work / "out.ipynb", as_version=4)

    for name, args, source in sbatch_cells(nb):
        [run_dir] = [m.parent for m in (runs / name).glob("*/metrics.json")]
        [log] = run_dir.glob("slurm-*.out")
        job_id = log.stem.removeprefix("slurm-")
        assert job_state(job_id).split()[0] == "COMPLETED", log.read_text()[-2000:]

        shown = outputs_after(nb, source)
        assert shown.strip() and "not submitted" not in shown, shown  # the result came back

        imported = re.findall(r"^from (\w+) import", source, re.M)
        mine = [m for m in imported if (work / "programs" / f"{m}.py").is_file()]
        assert mine, f"{name}: the driver imports no %%program module of the learner"
        for module in mine:
            kept = run_dir / f"{module}.py"
            assert kept.read_text() == (work / "programs" / f"{module}.py").read_text(), module

        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics.get("world_size") == ranks_asked(args), f"{name}: world_size? {metrics}"
        assert metrics.get("backend") == "gloo", f"{name}: rank 0 should report its backend"
        check = CORRECT.get(lab.parent.name)
        if check is not None:
            assert check(metrics, run_dir), metrics

    # The lab's jobs as a GPU cluster would run them (helpers.course.dryrun)
    rows = dryrun.check_written(runs, f"solutions/{lab.parent.name}")
    assert rows and all(r.ok for r in rows), dryrun.table(rows)
