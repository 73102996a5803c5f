"""helpers.course.book.runner on a scratch checkout: discovery, the failure report and the exit status."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from helpers.course.book import runner as book


def _notebook(path: Path, *sources: str) -> Path:
    cells = [new_code_cell("SMOKE = False")]
    cells[0].metadata["tags"] = ["parameters"]
    cells += [new_code_cell(s) for s in sources]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _checkout(tmp_path: Path) -> Path:
    """The smallest tree helpers.runs.workbook_root() accepts, with two notebooks and a lab."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "helpers").mkdir()
    _notebook(tmp_path / "notebooks" / "01_ok.ipynb", "assert SMOKE is True, SMOKE")
    _notebook(
        tmp_path / "notebooks" / "02_fails.ipynb",
        "x = 1",
        "raise ValueError('the learner should see this message')",
    )
    _notebook(tmp_path / "solutions" / "lab9" / "lab9.ipynb", "y = 2")
    return tmp_path


def test_discover_orders_filters_and_adds_solutions(tmp_path):
    root = _checkout(tmp_path)
    names = [str(p) for p in book.discover(root)]
    assert names == ["notebooks/01_ok.ipynb", "notebooks/02_fails.ipynb"]
    assert [str(p) for p in book.discover(root, solutions=True)][-1] == "solutions/lab9/lab9.ipynb"
    assert [str(p) for p in book.discover(root, only="fails")] == ["notebooks/02_fails.ipynb"]
    assert [str(p) for p in book.discover(root, solutions=True, only="*/lab*")] == [
        "solutions/lab9/lab9.ipynb"
    ]


def test_run_reports_the_failing_cell_and_exits_nonzero(tmp_path, monkeypatch, capsys):
    root = _checkout(tmp_path)
    before = (root / "notebooks" / "02_fails.ipynb").read_bytes()
    monkeypatch.chdir(root)
    status = book.main(["run", "--smoke"])
    out = capsys.readouterr().out
    assert status == 1
    assert "notebooks/01_ok.ipynb" in out and "notebooks/02_fails.ipynb" in out
    assert "FAILED" in out and "1 failed" in out
    assert "ValueError: the learner should see this message" in out
    # Executed copies go to build/executed/, the committed notebook is untouched.
    executed = nbformat.read(root / "build/executed/notebooks/01_ok.ipynb", as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    assert (root / "notebooks" / "02_fails.ipynb").read_bytes() == before


def test_full_mode_keeps_the_default_parameters(tmp_path, monkeypatch):
    root = _checkout(tmp_path)
    monkeypatch.chdir(root)
    # 01_ok asserts SMOKE is True, so without --smoke it must fail: the flag really is passed.
    assert book.main(["run", "--only", "01_ok"]) == 1
    assert book.main(["run", "--smoke", "--only", "01_ok"]) == 0


def test_an_output_widget_runs_headless_its_outputs_in_the_cell(tmp_path):
    """nbclient would play the browser's part for an Output widget, writing to the kernel's
    shell while the cell runs (the ipykernel 7 hang that helpers.course.book.headless explains).
    book.execute does not: nothing is sent mid-cell, and what the widget captured is kept
    as the cell's own output, so the executed notebook still shows it."""
    src = _notebook(
        tmp_path / "widget.ipynb",
        "import ipywidgets as W\n"
        "out = W.Output()\n"
        "with out:\n"
        "    print('drawn inside the widget')\n"
        "out",
    )
    done = book.execute(src, tmp_path / "out.ipynb", root=tmp_path, cell_timeout=60)
    assert done.ok, done.error
    cell = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[1]
    texts = [o.get("text", "") for o in cell.outputs if o.output_type == "stream"]
    assert texts == ["drawn inside the widget\n"], cell.outputs
    widget = [o for o in cell.outputs if o.output_type == "execute_result"]
    assert "application/vnd.jupyter.widget-view+json" in widget[0].data
