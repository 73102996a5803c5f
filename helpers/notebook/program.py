"""Cells that become programs: ``programs/NAME.py`` next to the notebook.

``%%program NAME`` writes the cell to programs/NAME.py *and* runs it in the
kernel, so a lab's solution cell is graded by nbgrader as usual while the very
same code becomes a module that a Slurm job can import::

    %%program ring                       # a learner's solution cell
    def ring_all_reduce(d, tensor): ...

    %%sbatch ring_bench --nodes 1 --gpus-per-node 4
    from ring import ring_all_reduce     # programs/ring.py, the learner's own code
    ...

%%torchrun and %%sbatch write their cell to the same place.
"""

from __future__ import annotations

from pathlib import Path

from helpers import runs

PROGRAMS_DIR = "programs"

__all__ = ["PROGRAMS_DIR", "program_magic", "write_program"]


def write_program(name: str, cell: str, directory: str | Path = PROGRAMS_DIR) -> Path:
    """Save a cell as programs/NAME.py (replacing the previous version of the same cell).

    Only the latest text of a cell is kept here: every launch copies the file it
    ran into its own run directory (runs/NAME/<id>/program.py), which is never
    overwritten.
    """
    path = Path(directory) / f"{runs.check_name(name)}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cell if cell.endswith("\n") else cell + "\n")
    return path


def program_magic(line: str, cell: str, ipython=None) -> Path:
    """``%%program NAME``: write the cell to programs/NAME.py, then run it in the kernel."""
    words = line.split()
    if len(words) != 1:
        raise ValueError(f"usage: %%program NAME (one name, got {line!r})")
    if not words[0].isidentifier():
        raise ValueError(
            f"%%program {words[0]!r}: the name becomes a module that jobs import "
            "(`from NAME import ...`), so use a Python identifier such as ring_allreduce"
        )
    path = write_program(words[0], cell)
    if ipython is not None:
        result = ipython.run_cell(cell)
        result.raise_error()  # a failing cell fails here too (papermill, nbgrader)
    return path
