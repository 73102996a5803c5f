"""Notebook 01 asserts each hardware lesson for the device it runs on.

On an H100 the data-loading cell stopped on the CPU's lesson ("an in-memory dataset should load
fast next to CPU compute"): loading cost 9-14 us a sample while compute fell from 146 to 4.6 us
a sample between batch 16 and 512. Here the cell's lesson code runs on such figures, and on a
CPU's, for both devices, without measuring anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import devices

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "01_single_gpu_cnn.ipynb"
# (batch size, compute us/sample, loading us/sample)
H100 = [(16, 146.0, 12.7), (512, 4.6, 10.2)]  # loading's share 8 % -> 69 %
CPU = [(16, 900.0, 6.0), (512, 600.0, 7.0)]  # about 1 %


def _code_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _loading_lesson() -> str:
    """The data-loading cell from its lesson on (after the measurements)."""
    (cell,) = [c for c in _code_cells() if "loading per sample should not depend much" in c]
    return cell[cell.index("shares = ") :]


def _run_lesson(figures, device: str) -> None:
    rows = [{"batch size": bs, "compute us/sample": c, "loading us/sample": ld}
            for bs, c, ld in figures]  # fmt: skip
    scope = {"rows": rows, "SMOKE": False, "device": torch.device(device), "devices": devices,
             "print": lambda *a, **k: None}  # fmt: skip
    exec(compile(_loading_lesson(), str(NOTEBOOK), "exec"), scope)


def test_the_data_loading_cell_asserts_the_lesson_of_its_device():
    _run_lesson(H100, "cuda:0")  # the GPU's lesson: loading's share grows and becomes large
    _run_lesson(CPU, "cpu")  # the CPU's: a small share
    with pytest.raises(AssertionError, match="CPU compute"):
        _run_lesson(H100, "cpu")
    with pytest.raises(AssertionError, match="on a GPU"):
        _run_lesson(CPU, "cuda:0")


def test_notebook_01_runs_on_the_torch_floor_and_labels_its_device():
    code = "\n".join(_code_cells())
    assert "fp32_precision" not in code, "torch >= 2.9 only: use helpers.compat.tf32_allowed()"
    assert "viz.device_label(device)" in code and "machine_label" not in code
    assert "device=device" in code.split("make_loader(train_ds, BATCH_SIZE")[1].splitlines()[0]
