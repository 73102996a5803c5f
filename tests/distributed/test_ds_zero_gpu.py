"""04's DeepSpeed program with its GPU config (bf16, overlap_comm, CPU Adam offload), as the
notebook writes it, on one rank of the stand-in GPU (device-strict: CUDA's dtype rules).

DeepSpeed casts the model to bf16 but casts the inputs only for fp16, so the program must cast
its fp32 inputs itself: before it did, the H100 job (and this test) stopped at the first
forward with ``mat1 and mat2 must have the same dtype``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import launch
from helpers.parallel import zero

pytestmark = pytest.mark.slow  # DeepSpeed's import: about 20 s

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _written_by(notebook: str, target: str) -> str:
    """The program a notebook's ``%%writefile target`` cell writes (as the notebook has it now)."""
    for cell in json.loads((NOTEBOOKS / notebook).read_text())["cells"]:
        source = "".join(cell["source"])
        if source.startswith(f"%%writefile {target}\n"):
            return source.split("\n", 1)[1]
    raise LookupError(f"{notebook} has no %%writefile {target} cell")


def test_04s_deepspeed_gpu_config_steps_in_bf16(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_RUNS", str(tmp_path / "runs"))
    program = tmp_path / "ds_zero.py"
    program.write_text(_written_by("04_fsdp_zero.ipynb", "programs/ds_zero.py"))
    config = tmp_path / "ds_config_gpu.json"
    config.write_text(json.dumps(zero.deepspeed_config(3, 8, None, 1e-4, gpu=True)))
    res = launch.run(program, nproc=1, args=["--deepspeed_config", str(config), "--stages", "3",
                                             "--steps", "2"], timeout=300, stream=False,
                     env={"WORKBOOK_DEVICE_CHECK": "strict"})  # fmt: skip
    assert res.ok, res.traceback
    losses = res.metrics["losses"]["3"]
    assert len(losses) == 2 and all(math.isfinite(v) and 1.5 < v < 3.5 for v in losses), losses
