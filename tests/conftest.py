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
