"""The GPU world, checked without a GPU: every job the notebooks write, dry-run.

    python -m helpers.course.dryrun --execute     # run every notebook and lab (SMOKE),
                                                  # then check every job they wrote
    python -m helpers.course.dryrun runs/         # check the jobs already written there

See check.py for what is checked, fake.py for the fake-tensor rank and
helpers/standin.py for the stand-in GPU.
"""

from helpers.course.dryrun.check import Job, Row, check_jobs, find_jobs
from helpers.course.dryrun.report import combined, save_rows, table

__all__ = ["Job", "Row", "check_jobs", "find_jobs", "table", "save_rows", "combined",
           "check_written"]  # fmt: skip


def check_written(runs, label: str, out=None) -> list[Row]:
    """Check every job written under ``runs`` (one notebook's run), keep the rows, return them."""
    from pathlib import Path

    from helpers.runs import workbook_root

    rows = check_jobs(find_jobs(Path(runs)))
    save_rows(rows, label, Path(out or (workbook_root() or Path.cwd()) / "build" / "dryrun"))
    return rows
