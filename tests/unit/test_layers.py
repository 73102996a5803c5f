"""The package's architecture: import-linter contracts, and what a program imports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_layers_hold_here():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    "target,line,contract",
    [
        # a technique reaching up to the notebook glue: a layer violation
        ("helpers/parallel/data/ddp.py", "from helpers.notebook import magics", "layered"),
        # two sibling modules importing each other: a cycle
        ("helpers/launch/results.py", "from helpers.launch import pool", "no import cycles"),
        # a program's import pulling in matplotlib
        ("helpers/training/loop.py", "import matplotlib", "never pulls in"),
    ],
)
def test_lint_imports_fails_on_an_injected_violation(tmp_path, target, line, contract):
    copy = tmp_path / "wb"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy)
    shutil.copytree(
        ROOT / "helpers", copy / "helpers", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = copy / target
    path.write_text(path.read_text() + f"\n{line}  # injected by the test\n")
    out = _lint(copy)
    assert out.returncode != 0, f"lint-imports accepted: {line} in {target}"
    broken = out.stdout[out.stdout.index("Broken contracts") :]
    assert contract in broken, broken[:2000]


PROBE = textwrap.dedent(
    """
    import json, sys
    from helpers import dist
    from helpers.programs import train_cnn, train_ddp  # noqa: F401
    from helpers.runs import write_metrics

    d = dist.init()
    heavy = sorted(m for m in ("IPython", "matplotlib", "nbgrader", "ipywidgets") if m in sys.modules)
    if d.rank == 0:
        print("HEAVY=" + json.dumps(heavy), flush=True)
    dist.cleanup()
    """
)


def test_a_torchrun_program_imports_no_notebook_or_plotting_library(tmp_path):
    from helpers import launch

    prog = tmp_path / "probe.py"
    prog.write_text(PROBE)
    res = launch.run(prog, nproc=2, timeout=300, stream=False)
    assert res.ok, res.traceback
    line = next(ln for ln in res.logs[0].splitlines() if ln.startswith("HEAVY="))
    assert line == "HEAVY=[]", f"a program imported {line[6:]}"
