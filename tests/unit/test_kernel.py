"""The notebooks' kernel belongs to the checkout: nothing user-wide, each venv its own code."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.course.book import kernel

ROOT = Path(__file__).resolve().parents[2]


def test_the_kernel_spec_lives_in_this_venv_and_runs_its_python():
    where = kernel.spec_dir()
    assert where is not None, "no pdl-workbook kernel: run `make setup`"
    assert where.resolve().is_relative_to(Path(sys.prefix).resolve()), where
    argv = json.loads((where / "kernel.json").read_text())["argv"]
    assert Path(argv[0]).resolve() == Path(sys.executable).resolve()
    assert not kernel.user_wide_dir().exists(), "a user-wide pdl-workbook spec shadows the venv's"


def _checkout(tmp: Path, name: str) -> Path:
    """A second checkout: its own helpers/ and a venv that reuses this one's packages."""
    top = tmp / name
    shutil.copytree(ROOT / "helpers", top / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", top)
    (top / "helpers" / "MARK").write_text(name)
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(top / ".venv")], check=True)
    py = top / ".venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # The checkout's own code first, then this venv's third-party packages.
    (Path(purelib) / "checkout.pth").write_text(f"{top}\n{site.getsitepackages()[0]}\n")
    subprocess.run(
        [str(py), "-m", "ipykernel", "install", "--sys-prefix", "--name", kernel.NAME],
        check=True, capture_output=True,
    )  # fmt: skip
    return top


@pytest.mark.slow
def test_two_checkouts_side_by_side_each_run_their_own_code(tmp_path):
    nb = new_notebook(
        cells=[
            new_code_cell("import helpers, pathlib\nprint(pathlib.Path(helpers.__file__).parent)")
        ]
    )
    nb.metadata["kernelspec"] = {"name": kernel.NAME, "display_name": "x", "language": "python"}
    seen = {}
    for name in ("one", "two"):
        top = _checkout(tmp_path, name)
        src = top / "probe.ipynb"
        nbformat.write(nb, src)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JUPYTER_PATH")}
        subprocess.run(
            [str(top / ".venv" / "bin" / "python"), "-m", "papermill", str(src), str(top / "out.ipynb")],
            check=True, capture_output=True, env=env, cwd=top, timeout=300,
        )  # fmt: skip
        out = nbformat.read(top / "out.ipynb", as_version=4).cells[0].outputs[0]["text"].strip()
        seen[name] = Path(out)
    assert seen["one"] == tmp_path / "one" / "helpers"
    assert seen["two"] == tmp_path / "two" / "helpers"
