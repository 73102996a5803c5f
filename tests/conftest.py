"""Shared test set-up: keep test runs out of the learner's runs/ and headless plots."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True, scope="session")
def _isolated_runs(tmp_path_factory):
    # Every launch in the tests writes its run directory here, not in ./runs.
    os.environ["WORKBOOK_RUNS"] = str(tmp_path_factory.mktemp("runs"))
    yield


def pytest_sessionstart(session):
    # The dry run's rows of this session only (the notebook and lab tests add theirs);
    # `make test` clears them once for its two pytest sessions, which run side by side.
    import shutil
    from pathlib import Path

    if os.environ.get("WORKBOOK_KEEP_DRYRUN_ROWS"):
        return
    shutil.rmtree(
        Path(__file__).resolve().parents[1] / "build" / "dryrun" / "rows", ignore_errors=True
    )


def pytest_sessionfinish(session, exitstatus):
    # Every job the notebooks and labs wrote, checked: build/dryrun/report.md
    from pathlib import Path

    from helpers.course import dryrun

    out = Path(__file__).resolve().parents[1] / "build" / "dryrun"
    if (out / "rows").is_dir():
        (out / "report.md").write_text(dryrun.combined(out))


def pytest_collection_modifyitems(session, config, items):
    """Lab jobs (tests/slurm/test_lab_jobs.py) run last in whichever session has them.

    Each is papermill, a Slurm job and a dry run: CPU work that would otherwise meet the
    notebooks' timing lessons, which run first beside the other session (Makefile, test).
    """
    items.sort(key=lambda item: item.nodeid.startswith("tests/slurm/test_lab_jobs.py"))
