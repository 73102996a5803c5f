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


def _bf16_lesson() -> str:
    (cell,) = [c for c in _code_cells() if "ratio, wide = statistics.median(RATIOS)" in c]
    return cell


class _Keep:
    @staticmethod
    def keep(_):
        pass


def _run_bf16_lesson(cnn: float, wide: float, accuracies: tuple[float, float], native: bool,
                     device: str = "cpu") -> None:  # fmt: skip
    import statistics
    from types import SimpleNamespace

    scope = {"RATIOS": [cnn] * 3, "WIDE_RATIOS": [wide] * 3, "PAIRS": 3, "WIDE_N": 1024,
             "ACCURACIES": dict(zip(("fp32", "bf16"), accuracies, strict=True)), "AMP_EPOCHS": 2,
             "NATIVE_BF16": native, "HARDWARE": "test", "SMOKE": False, "statistics": statistics,
             "device": torch.device(device), "devices": devices, "gpucheck": _Keep,
             "info": SimpleNamespace(num_classes=10), "print": lambda *a, **k: None}  # fmt: skip
    exec(compile(_bf16_lesson(), str(NOTEBOOK), "exec"), scope)


def test_the_bf16_cell_asserts_what_the_hardware_shows():
    # The full run on a CPU with AMX: bf16 0.86x on the CNN, 79.1 % against 74.9 %.
    _run_bf16_lesson(0.86, 2.5, (0.791, 0.749), native=True)
    _run_bf16_lesson(0.82, 6.0, (0.587, 0.5865), native=True, device="cuda:0")  # the H100's CNN
    _run_bf16_lesson(0.95, 1.0, (0.79, 0.78), native=False)  # no bf16 instructions
    # A slowdown where the lesson promises a speed-up fails: bf16 instructions that do not pay
    # on a wide product, a GPU whose tensor cores do not, emulated bf16 that is faster.
    with pytest.raises(AssertionError, match="wide product"):
        _run_bf16_lesson(0.86, 0.9, (0.79, 0.78), native=True)
    with pytest.raises(AssertionError, match="wide product"):
        _run_bf16_lesson(0.82, 1.2, (0.59, 0.59), native=True, device="cuda:0")
    with pytest.raises(AssertionError, match="without bf16 instructions"):
        _run_bf16_lesson(0.95, 2.0, (0.79, 0.78), native=False)
    # This CNN gaining from bf16 would contradict the text; so would a gap beyond the bound.
    with pytest.raises(AssertionError, match="convolutions this small"):
        _run_bf16_lesson(1.6, 2.5, (0.79, 0.78), native=True)
    with pytest.raises(AssertionError, match="within 10%"):
        _run_bf16_lesson(0.86, 2.5, (0.80, 0.69), native=True)


def test_the_text_claims_no_bf16_gain_for_this_cnn():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "gains only modestly" not in text and "similar accuracy" not in text
    assert "gain nothing from bf16" in text


def test_pick_threads_measures_each_count_and_keeps_the_callers():
    from helpers.training import threads

    assert threads.candidates(1) == [1] and threads.candidates(2) == [1, 2]
    assert threads.candidates(8) == [1, 4, 8]
    before = torch.get_num_threads()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10))  # tiny: fast steps
    batch = (torch.randn(4, 3, 2, 2), torch.randint(0, 10, (4,)))
    # One count: a second one starts OpenMP's pool, seconds on a busy machine (the lesson itself).
    best, rates = threads.pick_threads(model, batch, torch.device("cpu"), [1], steps=2, rounds=2)
    assert best == 1 and set(rates) == {1} and rates[1] > 0
    assert torch.get_num_threads() == before


def test_the_cnn_flops_by_hand_equal_torchs_count():
    from helpers import models
    from helpers.training import flops

    model, x, y = models.CifarCNN(), torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    per_layer = flops.layer_flops(model, x[:1])
    assert per_layer["conv1"] == 2 * 3 * 25 * 6 * 28 * 28 and per_layer["fc1"] == 2 * 400 * 120
    counted = flops.counted_flops(model, x, y)
    assert counted["forward"] == sum(per_layer.values()) == 1_303_440
    # backward: twice the forward, less conv1's input gradient (its input is the data)
    assert counted["backward"] == 2 * counted["forward"] - per_layer["conv1"]
    assert flops.mfu(3.2e6, 8127, 494.7e12) == pytest.approx(5.26e-5, rel=1e-2)
