"""What a learner or a job runs, as Python: the sources the floor check reads.

``helpers/**/*.py`` (helpers/compat.py left out), the code cells of the notebooks, solution labs
and student labs (``%%program``, ``%%torchrun``, ``%%sbatch`` and ``%%writefile`` programs
included: the magic line blanked, line magics rewritten as IPython does), and the labs' wrong
answers cell by cell (they copy a learner's code), each with its file's line numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from helpers.course.grading.scanner import split_magic

__all__ = ["ROOT", "Source", "cell_python", "workbook_sources"]

ROOT = Path(__file__).resolve().parents[3]
_PY_CELLS = {None, "program", "torchrun", "sbatch"}


@dataclass(frozen=True)
class Source:
    """One piece of Python the workbook runs: a file, or one code cell of a notebook."""

    where: str  # "helpers/x.py" or "notebooks/02_collectives.ipynb cell 14"
    text: str


def cell_python(source: str) -> str | None:
    """The Python of a code cell (magic line blanked, line magics rewritten), None if not Python."""
    from IPython.core.inputtransformer2 import TransformerManager

    magic, body = split_magic(source)
    if magic == "writefile":
        target = source.partition("\n")[0].split()[-1]
        if not (target.endswith(".py") or "{" in target):
            return None
    elif magic not in _PY_CELLS:
        return None
    return TransformerManager().transform_cell(body)


def _wrong_answers(path: Path, where: str) -> list[Source]:
    """A lab's wrong answers, cell by cell ("# %% cell: NAME" sections), lines kept."""
    lines, out, start = path.read_text().splitlines(), [], 0
    for i in range(len(lines) + 1):
        if i == len(lines) or lines[i].startswith(("# %%", "# ===")):
            python = cell_python("\n".join(lines[start:i])) if i > start else None
            if python:
                out.append(Source(where, "\n" * start + python))  # blank lines: the file's numbers
            start = i + 1
    return out


def workbook_sources(root: Path = ROOT) -> list[Source]:
    """What a learner or a job runs, compat.py left out (see the module docstring)."""
    out = [
        Source(str(p.relative_to(root)), p.read_text())
        for p in sorted(root.glob("helpers/**/*.py"))
        if p != root / "helpers" / "compat.py"
    ]
    for p in sorted(root.glob("solutions/*/wrong_answers.py")):
        out += _wrong_answers(p, str(p.relative_to(root)))
    for pattern in ("notebooks/*.ipynb", "solutions/*/*.ipynb", "labs/*/*.ipynb"):
        for p in sorted(root.glob(pattern)):
            cells = json.loads(p.read_text())["cells"]
            for i, cell in enumerate(cells):
                text = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
                python = cell_python(text) if text.strip() else None
                if python:
                    out.append(Source(f"{p.relative_to(root)} cell {i}", python))
    return out
