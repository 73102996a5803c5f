"""Notebook 05's DeepSpeed program, as the notebook writes it, on 4 real gloo ranks.

SMOKE runs of the notebook skip DeepSpeed (about 40 s), so this test runs the very
cell that writes ``ds_pipe.py``: an AlexNet-like PipelineModule with 2 stages and
2-way data parallelism, ``engine.train_batch()`` for 2 steps.
"""

import re
from pathlib import Path

import nbformat
import pytest

from helpers import launch

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "05_pipeline.ipynb"
LINE = re.compile(r"rank (\d): stage (\d), replica (\d), step (\d+), loss ([\d.]+)")


def _program_cell() -> str:
    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells]
    [cell] = [s for s in cells if s.startswith("%%writefile {DS_PROGRAM}")]
    return cell.split("\n", 1)[1]


def test_deepspeed_pipeline_module_two_stages_two_replicas(tmp_path):
    program = tmp_path / "ds_pipe.py"
    program.write_text(_program_cell())
    res = launch.run(program, nproc=4, name="test-ds-pipe", timeout=600, threads=1,
                     env={"OMP_NUM_THREADS": "1", "DS_STEPS": "2"}, stream=False)  # fmt: skip
    res.raise_for_status()
    reports = [m.groups() for log in res.logs.values() for m in LINE.finditer(log)]
    # Only the last stage reports: DeepSpeed puts the pipeline outermost, so stage 1 is
    # ranks 2 and 3, one per data-parallel replica.
    assert sorted((r, s, dp) for r, s, dp, _, _ in reports) == sorted(
        [("2", "1", "0"), ("3", "1", "1")] * 2
    ), reports
    for step in ("0", "1"):  # train_batch() returns the loss averaged over the replicas
        losses = {loss for _, _, _, st, loss in reports if st == step}
        assert len(losses) == 1, f"step {step}: replicas report different losses {losses}"
        assert 1.0 < float(losses.pop()) < 4.0  # cross-entropy over 10 classes starts near ln 10
