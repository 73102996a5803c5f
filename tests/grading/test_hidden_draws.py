"""The instructor's solution never fails: 1,000 draws of every randomised hidden test, every lab.

Each lab's hidden tests draw ``HIDDEN_DRAWS`` random cases (1 when grading) and run them
in one spawn per world size; helpers.course.grading.draws runs the lab's own cells and its
solution cells in a real kernel with ``HIDDEN_DRAWS = 1000`` (no nbgrader, no
demonstrations). A draw that fails would fail a learner's correct answer too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.course.grading import labs
from helpers.course.grading.draws import run_draws

ROOT = Path(__file__).resolve().parents[2]
DRAWS = 1000

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("lab", labs.lab_names(ROOT))
def test_the_solution_passes_a_thousand_draws_of_every_hidden_test(lab):
    results = run_draws(lab, DRAWS, ROOT)
    for name, seconds, error in results:
        print(f"{lab} {name[:40]:40s} {seconds:6.2f} s {error or ''}")
    failed = [f"{name}: {error}" for name, _, error in results if error]
    assert not failed, f"{lab}'s solution failed with {DRAWS} hidden draws:\n" + "\n".join(failed)
