"""The rule that keeps one code path for two worlds: a program never tests for CUDA itself.

A size or a path chosen by ``device.type == "cuda"`` is invisible to the dry run, whose
ranks are the stand-in GPU (device type ``gpu``) or the CPU: lab 7's bench ran its laptop
sizes there, passed, and went out of memory on an H100 at the sizes it picked for CUDA.
Programs ask ``helpers.devices`` (``is_gpu``, ``gpu_sized``, ``pin_memory``) or take a
parameter; only ``helpers/devices.py`` and the stand-in itself may name CUDA's device type.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `device.type == "cuda"`, `d.device.type != 'cuda'`, `x.device.type in ("cuda", ...)`
CUDA_TEST = re.compile(r"""\.type\s*(==|!=|\bin\b)\s*[(\[]?\s*["']cuda["']""")
ALLOWED = {"helpers/devices.py"}


def _sources():
    for path in sorted(ROOT.glob("helpers/**/*.py")):
        yield path, path.read_text().splitlines()
    for folder in ("notebooks", "solutions", "labs"):
        for path in sorted((ROOT / folder).rglob("*.ipynb")):
            if ".ipynb_checkpoints" in path.parts:
                continue
            cells = json.loads(path.read_text())["cells"]
            lines = [line for c in cells if c["cell_type"] == "code"
                     for line in "".join(c["source"]).splitlines()]  # fmt: skip
            yield path, lines
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, path.read_text().splitlines()


def test_the_pattern_catches_each_spelling():
    for bad in ('if device.type == "cuda":', "on = d.device.type != 'cuda'",
                'x.device.type in ("cuda", "xpu")'):  # fmt: skip
        assert CUDA_TEST.search(bad), bad
    assert not CUDA_TEST.search('torch.device("cuda", 0)')


def test_no_program_branches_on_cuda_itself():
    offences = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path, lines in _sources()
        if str(path.relative_to(ROOT)) not in ALLOWED
        for line in lines
        if CUDA_TEST.search(line)
    ]
    assert not offences, (
        "these lines choose a path or a size by testing for CUDA, which the dry run cannot "
        "follow; ask helpers.devices (is_gpu, gpu_sized, pin_memory) or take a parameter:\n"
        + "\n".join(offences)
    )
