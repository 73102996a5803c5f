"""Notebook 01 asserts each hardware lesson for the device it runs on.

On an H100 the data-loading cell stopped on the CPU's lesson ("an in-memory dataset should load
fast next to CPU compute"): loading cost 9-14 us a sample while compute fell from 146 to 4.6 us
a sample between batch 16 and 512. The cells now assert the host's work in CPU seconds in every
run (the loader's cost per sample on every device; a CPU's loading share and bf16 ratios), and a
GPU's lessons in wall time behind helpers.launch.cores (checked only where the kernel had the
cores it wanted). Here the cells' lesson code runs on such figures, and on a CPU's, for both
devices, without measuring anything: figures that contradict a device's lesson must stop the cell.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import devices
from helpers.launch import cores

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "01_single_gpu_cnn.ipynb"
# The timed part's clock: the kernel had the core it wanted (the premise holds, lessons are
# asserted), or waited most of the time for one (they are printed, "not checked here").
HAD_ITS_CORE = SimpleNamespace(reading=cores.Reading(wall_s=1.0, cpu_s=1.0, wait_s=0.0))
CROWDED = SimpleNamespace(reading=cores.Reading(wall_s=1.0, cpu_s=0.3, wait_s=0.7))
# (batch size, compute us/sample, loading us/sample, the same two in CPU us/sample)
# The H100's wall figures; its host's CPU seconds are not recorded: the in-process loader's are
# taken equal to its wall time, compute's to the host busy for the whole step.
H100 = [(16, 146.0, 12.7, 146.0, 12.7), (512, 4.6, 10.2, 4.6, 10.2)]  # share 8 % -> 69 %
# A busy CPU (SMOKE at load 10, 10d7085: loading 8.8-9.5 CPU us, 25 wall), a burst of load at
# batch 32 slowing the loader's wall time tenfold: a share of 38 % in wall time, 4 % in CPU seconds.
CPU = [(32, 400.0, 250.0, 210.0, 9.5), (256, 300.0, 25.0, 180.0, 8.8)]
# A loader with a cost per step, not per sample: 40 CPU us a sample at batch 16, 8 at 512.
PER_STEP = [(16, 900.0, 40.0, 900.0, 40.0), (512, 600.0, 8.0, 600.0, 8.0)]


def _code_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _loading_lesson() -> str:
    """Section 6's data-loading cell from its lesson on (after the measurements)."""
    (cell,) = [c for c in _code_cells() if "def loading_seconds_per_sample" in c]
    return cell[cell.index("shares = ") :]


def _exec(code: str, scope: dict) -> list[str]:
    """Run a cell's ``code`` in ``scope``; the lines it printed (cores.check's included)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(NOTEBOOK), "exec"), scope)
    return out.getvalue().splitlines()


def _run_lesson(figures, device: str, clock=HAD_ITS_CORE) -> list[str]:
    """The loading lesson run on ``figures`` for ``device``; the lines it printed."""
    rows = [{"batch size": bs, "compute us/sample": c, "loading us/sample": ld,
             "compute CPU us/sample": c_cpu, "loading CPU us/sample": ld_cpu}
            for bs, c, ld, c_cpu, ld_cpu in figures]  # fmt: skip
    scope = {"rows": rows, "SMOKE": False, "device": torch.device(device), "devices": devices,
             "cores": cores, "timing_clock": clock}  # fmt: skip
    return _exec(_loading_lesson(), scope)


def test_the_data_loading_cell_asserts_the_lesson_of_its_device():
    gpu = _run_lesson(H100, "cuda:0")  # the GPU's lesson: loading's share grows and becomes large
    assert any(line.startswith("checked: on a GPU, loading's share grows") for line in gpu), gpu
    cpu = _run_lesson(CPU, "cpu")  # the CPU's, in CPU seconds: a small share
    assert any("loads fast next to CPU compute" in line for line in cpu), cpu
    with pytest.raises(
        AssertionError, match="of a sample's CPU seconds next to this CPU's compute"
    ):
        _run_lesson(H100, "cpu")
    with pytest.raises(AssertionError, match="on a GPU, loading's share grows .*: not so here"):
        _run_lesson(CPU, "cuda:0")
    # On every device, in CPU seconds: a loader whose cost per sample falls with the batch fails.
    for device in ("cpu", "cuda:0"):
        with pytest.raises(AssertionError, match="not about the same at every batch size"):
            _run_lesson(PER_STEP, device)
    # A GPU's share is wall time: where the kernel waited for its core it is printed, not asserted.
    crowded = _run_lesson(CPU, "cuda:0", clock=CROWDED)
    assert any(line.startswith("not checked here: on a GPU") for line in crowded), crowded


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
                     device: str = "cpu", cpu: tuple[float, float] | None = None,
                     clock=HAD_ITS_CORE) -> list[str]:  # fmt: skip
    """The bf16 lesson on bf16/fp32 ratios ``cnn`` and ``wide`` in wall time and ``cpu`` (the
    CNN's and the wide product's) in CPU seconds (default: the same); the lines it printed."""
    cpu_cnn, cpu_wide = cpu or (cnn, wide)
    scope = {"RATIOS": [cnn] * 3, "WIDE_RATIOS": [wide] * 3, "CPU_RATIOS": [cpu_cnn] * 3,
             "WIDE_CPU_RATIOS": [cpu_wide] * 3, "PAIRS": 3, "WIDE_N": 1024,
             "ACCURACIES": dict(zip(("fp32", "bf16"), accuracies, strict=True)), "AMP_EPOCHS": 2,
             "NATIVE_BF16": native, "HARDWARE": "test", "SMOKE": False, "statistics": statistics,
             "device": torch.device(device), "devices": devices, "gpucheck": _Keep,
             "cores": cores, "bf16_clock": clock, "info": SimpleNamespace(num_classes=10)}  # fmt: skip
    return _exec(_bf16_lesson(), scope)


def test_the_bf16_cell_asserts_what_the_hardware_shows():
    # A CPU with bf16 instructions, in CPU seconds (10d7085: this CNN 0.91x, the wide product
    # 6.49x, where wall time said 21.7x under load; 65b1969's full run: the CNN 1.15x).
    _run_bf16_lesson(0.86, 21.7, (0.791, 0.749), native=True, cpu=(0.91, 6.49))
    _run_bf16_lesson(1.4, 0.9, (0.79, 0.78), native=True, cpu=(1.15, 2.5))  # wall: printed only
    _run_bf16_lesson(0.95, 1.0, (0.79, 0.78), native=False)  # no bf16 instructions
    # The H100's CNN (0.82x, its record) and a wide product 6x, in wall time; its host's CPU
    # seconds are not the GPU's work and are not asserted.
    gpu = _run_bf16_lesson(0.82, 6.0, (0.587, 0.5865), native=True, device="cuda:0", cpu=(3, 0.5))
    assert any(line.startswith("checked: bf16 tensor cores pay") for line in gpu), gpu
    _run_bf16_lesson(0.95, 1.0, (0.59, 0.59), native=False, device="cuda:0")  # emulated (V100)
    # Figures against the lesson stop the cell: on a CPU those in CPU seconds, whatever wall says.
    with pytest.raises(AssertionError, match=r"with bf16 instructions: bf16 = 0\.90x fp32 on the "
                       r"wide product, 0\.91x on this CNN, in CPU seconds"):  # fmt: skip
        _run_bf16_lesson(0.86, 6.0, (0.79, 0.78), native=True, cpu=(0.91, 0.9))
    with pytest.raises(AssertionError, match=r"with bf16 instructions: .* 1\.60x on this CNN"):
        _run_bf16_lesson(0.86, 2.5, (0.79, 0.78), native=True, cpu=(1.6, 2.5))  # the CNN gains
    with pytest.raises(AssertionError, match="without bf16 instructions: bf16 = 2.00x"):
        _run_bf16_lesson(0.95, 1.0, (0.79, 0.78), native=False, cpu=(0.95, 2.0))
    # On a GPU, in wall time: tensor cores that do not pay on the wide product, this CNN gaining,
    # emulated bf16 that is faster.
    for cnn, wide in ((0.82, 1.2), (1.6, 6.0)):
        with pytest.raises(
            AssertionError, match="bf16 tensor cores pay on the wide .*: not so here"
        ):
            _run_bf16_lesson(cnn, wide, (0.59, 0.59), native=True, device="cuda:0", cpu=(0.82, 6))
    with pytest.raises(AssertionError, match="without bf16 instructions bf16 is no faster.*not so"):
        _run_bf16_lesson(0.95, 2.0, (0.59, 0.59), native=False, device="cuda:0")
    # ... asserted only where the kernel had its cores; otherwise printed, "not checked here".
    crowded = _run_bf16_lesson(0.82, 1.2, (0.59, 0.59), native=True, device="cuda:0", clock=CROWDED)
    assert any(line.startswith("not checked here: bf16 tensor cores") for line in crowded), crowded
    # A gap beyond the bound fails on every device.
    for device in ("cpu", "cuda:0"):
        with pytest.raises(AssertionError, match="within 10%"):
            _run_bf16_lesson(0.86, 2.5, (0.80, 0.69), native=True, device=device)


def test_the_text_claims_little_or_no_bf16_gain_for_this_cnn():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "gains only modestly" not in text and "similar accuracy" not in text
    # 65b1969: a full run here measured 1.15x, so "nothing" claimed more than the cell asserts.
    assert "gain nothing from bf16" not in text and "gain little or nothing from bf16" in text
    # The bound the prose quotes for this CNN on a CPU with bf16 instructions is the cell's.
    (bound,) = re.findall(r"asserts stays below ([\d.]+)×", text)
    assert f"ratio < (1.5 if SMOKE else {bound})" in _bf16_lesson(), bound


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
