"""House rules for committed files: clean notebooks, one parameters cell, agreeing pins.

Notebooks are committed without outputs (executed copies live in build/), use
the ``python3`` kernel, and carry exactly one ``parameters`` cell that sets
SMOKE (papermill and CI rely on it). environment.yml, for conda users on
clusters, must agree with pyproject.toml.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _notebooks(*folders: str) -> list[Path]:
    found = [p for f in folders for p in sorted((ROOT / f).rglob("*.ipynb"))]
    return [p.relative_to(ROOT) for p in found if ".ipynb_checkpoints" not in p.parts]


COMMITTED = _notebooks("notebooks", "solutions", "labs")
RUNNABLE = _notebooks("notebooks", "solutions")


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / path, as_version=4)


def test_the_rules_see_the_notebooks():
    # Guard against a glob that silently finds nothing.
    assert Path("solutions/lab0/lab0.ipynb") in RUNNABLE
    assert Path("labs/lab0/lab0.ipynb") in COMMITTED


@pytest.mark.parametrize("path", COMMITTED, ids=str)
def test_committed_notebook_has_no_outputs(path):
    dirty = [
        i
        for i, c in enumerate(_read(path).cells)
        if c.cell_type == "code" and (c.outputs or c.execution_count is not None)
    ]
    assert not dirty, (
        f"{path}: cells {dirty} carry outputs or execution counts. Clear them "
        f"(jupyter nbconvert --clear-output --inplace {path}) before committing."
    )


@pytest.mark.parametrize("path", COMMITTED, ids=str)
def test_kernelspec_names_the_kernel_that_runs_it(path):
    # Course notebooks run in this checkout's own kernel (make setup installs it into
    # .venv); labs travel to learners' environments, where python3 is what exists.
    want = "pdl-workbook" if Path(path).parts[0] == "notebooks" else "python3"
    name = _read(path).metadata.get("kernelspec", {}).get("name")
    assert name == want, f"{path}: kernelspec is {name!r}; set it to {want!r}"


def _assigns_smoke(source: str) -> bool:
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "SMOKE" for t in targets):
            return True
    return False


@pytest.mark.parametrize("path", RUNNABLE, ids=str)
def test_one_parameters_cell_that_sets_smoke(path):
    cells = [c for c in _read(path).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, (
        f"{path}: {len(cells)} cells tagged 'parameters'; papermill needs exactly one"
    )
    assert cells[0].cell_type == "code" and _assigns_smoke(cells[0].source), (
        f"{path}: the parameters cell must set SMOKE (e.g. `SMOKE = False`)"
    )


# ----------------------------------------------------------------- environment.yml vs pyproject

_CONDA_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)\s*(=|==|>=|<=|>|<|~=|!=)?\s*([^\s=<>!~]*)\s*$")


def _environment():
    path = ROOT / "environment.yml"
    assert path.is_file(), "environment.yml is missing (conda set-up for clusters)"
    return yaml.safe_load(path.read_text())


def _pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {canonicalize_name(r.name): r for r in map(Requirement, reqs)}


def _env_entries():
    """(conda specs, pip lines) of environment.yml."""
    conda, pip = [], []
    for dep in _environment()["dependencies"]:
        if isinstance(dep, dict):
            pip += dep.get("pip", [])
        else:
            conda.append(str(dep))
    return conda, pip


def test_environment_python_satisfies_pyproject():
    conda, _ = _env_entries()
    python = [s for s in conda if _CONDA_PIN.match(s) and _CONDA_PIN.match(s).group(1) == "python"]
    assert python, "environment.yml must pin python (e.g. python=3.11)"
    version = _CONDA_PIN.match(python[0]).group(3)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert version and SpecifierSet(requires).contains(version + ".0"), (
        f"environment.yml has python {version}, pyproject.toml requires-python {requires}"
    )


def test_environment_installs_this_package_with_dev_extra():
    _, pip = _env_entries()
    assert any(re.fullmatch(r"-e\s+\.(\[.*\bdev\b.*\])", line.strip()) for line in pip), (
        f"environment.yml's pip section must install this package: `-e .[dev]`; found {pip}"
    )


def test_environment_pins_agree_with_pyproject():
    conda, pip = _env_entries()
    declared = _pyproject_requirements()
    pins: dict[str, SpecifierSet] = {}
    for spec in conda:
        m = _CONDA_PIN.match(spec)
        assert m, f"environment.yml: cannot read the conda spec {spec!r}"
        name, op, version = m.groups()
        if name in ("python", "pip") or not op:
            continue
        pins[canonicalize_name(name)] = SpecifierSet(("==" if op == "=" else op) + version)
    for line in pip:
        if line.strip().startswith(("-e", ".", "-r", "--")):
            continue
        req = Requirement(line)
        pins[canonicalize_name(req.name)] = req.specifier
    problems = []
    for name, spec in sorted(pins.items()):
        if name not in declared:
            problems.append(
                f"{name} is pinned in environment.yml but not a pyproject.toml dependency"
            )
        elif spec != declared[name].specifier:
            problems.append(
                f"{name}: environment.yml says {spec or 'any'}, "
                f"pyproject.toml says {declared[name].specifier or 'any'}"
            )
    assert not problems, "environment.yml disagrees with pyproject.toml:\n  " + "\n  ".join(
        problems
    )
