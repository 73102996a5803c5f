"""`make run` (helpers.course.book.runner) says which Slurm it found, from what Slurm itself reports."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.course.book import runner as book

pytestmark = pytest.mark.slurm

TOP = Path(__file__).resolve().parents[2]


def test_book_names_the_slurm_it_reached(cluster):
    said = book.ensure_local_cluster(TOP)
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout.strip()
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout.strip()
    assert version and ping.endswith("is UP")
    assert said == f"Slurm is reachable ({version}; {ping}): notebooks submit real jobs"
