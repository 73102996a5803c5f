"""Correct work in any style scores full: each style in a lab where it lost marks (issue 38).

Each submission is the solution with one answer written another way: names bound by tuple
assignment (labs 0 and 7), a NamedTuple returned for a tuple (lab 2), a numpy float64 for
a float (lab 5), and in lab 0 a helper of one's own in a cell of one's own, bound with
functools.partial, and a from-import of one's own program. The grader grades it as it
grades a class (``grade``, the sandbox, the guard first); only the test cells that look at
the rewritten answer are kept, so each case costs a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from helpers.course.grading import roundtrip as grading
from helpers.course.grading.grader.preprocessor import shared_pool
from helpers.course.grading.grader.run import grade
from helpers.course.grading.lab_policy import nbgrader_meta

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

SHARD = """%%program lab0_shard
def _block(n, rank, world_size):
    if world_size < 1 or not 0 <= rank < world_size or n < 0:
        raise ValueError(f"no block {rank} of {n} items on {world_size} ranks")
    q, r = divmod(n, world_size)
    start = rank * q + min(rank, r)
    return range(start, start + q + (rank < r))


def _size(n, rank, world_size):
    return len(_block(n, rank, world_size))


shard_range, block_size = _block, _size
"""

BLOCKS = """%%program lab7_blocks
import math

import torch


def causal_mask(q_pos, k_pos):
    return q_pos[:, None] >= k_pos[None, :]


def _attend(q, k, v, mask=None):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    out = (p @ v) / torch.where(total > 0, total, torch.ones_like(total))
    return out, (m + torch.log(total)).squeeze(-1)


def _merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    ref = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.exp(lse_a - ref)[..., None] * out_a + torch.exp(lse_b - ref)[..., None] * out_b, lse


block_attention, merge = _attend, _merge
"""

NAMED_TUPLE = """from typing import NamedTuple


class ModelStates(NamedTuple):
    weights: float
    gradients: float
    optimizer: float


def model_state_bytes(num_params: int, dp: int, stage: int, precision: str = "fp32") -> ModelStates:
    per_param = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}
    if precision not in per_param or stage not in (0, 1, 2, 3):
        raise ValueError(f"stage {stage}, precision {precision!r}")
    w, g, o = (num_params * b for b in per_param[precision])
    return ModelStates(w / dp if stage >= 3 else w, g / dp if stage >= 2 else g, o / dp if stage >= 1 else o)
"""

NUMPY_FLOAT = """%%program lab5_layout
import numpy as np


def states_gb(n_params: int, dp: int, tp: int, pp: int, zero: int = 0) -> float:
    sharded = np.array([0, 8, 12, 16], dtype=np.float64)[zero]
    return (16 - sharded + sharded / dp) * n_params / (tp * pp) / 1e9  # a numpy float64


def choose_layout(*args, **kwargs):
    raise NotImplementedError
"""

# Lab 0's sum, from a helper in a cell of the learner's own, bound with functools.partial, and
# shard_range taken from the learner's own program by a from-import.
OWN_HELPER = """import functools


def _reduced(op, d, n, read):
    block = owned(n, d.rank, d.world_size)
    local = read(block.start, block.stop).sum()
    total = local.clone()
    tdist.all_reduce(total, op=op)
    return local.item(), total.item()


summed = functools.partial(_reduced, tdist.ReduceOp.SUM)
"""
SUM_FROM_HELPER = """from lab0_shard import shard_range as owned


def sum_on_ranks(d, n: int, read) -> tuple[float, float]:
    return summed(d, n, read)
"""

STYLES = {
    "tuple assignment, lab 0": ("lab0", {"shard_range": SHARD}, {}, ["test_shard_range", "test_shard_range_edges"]),
    "tuple assignment, lab 7": ("lab7", {"blocks": BLOCKS}, {}, ["test_block_attention", "test_merge"]),
    "NamedTuple, lab 2": ("lab2", {"memory_estimate": NAMED_TUPLE}, {}, ["test_estimate_paper"]),
    "numpy float64, lab 5": ("lab5", {"layout": NUMPY_FLOAT}, {}, ["test_states"]),
    "own helper, partial and from-import, lab 0": (
        "lab0", {"sum_on_ranks": SUM_FROM_HELPER}, {"sum_on_ranks": OWN_HELPER}, ["test_sum_on_ranks"],
    ),
}  # fmt: skip


def _submission(lab: str, answers: dict, before: dict, keep: list[str]):
    released = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    solution = nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    nb = grading.fill_in(released, solution, answers)
    for grade_id, source in before.items():  # a cell of the learner's own, before that answer
        at = next(i for i, c in enumerate(nb.cells) if nbgrader_meta(c).get("grade_id") == grade_id)
        nb.cells.insert(at, new_code_cell(source))
    nb.cells = [  # only the tests that look at the rewritten answer
        c for c in nb.cells
        if not (nbgrader_meta(c).get("grade") and nbgrader_meta(c).get("grade_id") not in keep)
    ]  # fmt: skip
    return nb


@pytest.mark.parametrize("style", STYLES)
def test_a_correct_answer_in_another_style_scores_full(style):
    lab, answers, before, keep = STYLES[style]
    nb = _submission(lab, answers, before, keep)
    pool = shared_pool()
    try:
        outputs = grade(nb, ROOT / "solutions" / lab, pool)
    finally:
        pool.end_learner()
    ran = []
    for i, cell in enumerate(nb.cells):
        meta = nbgrader_meta(cell)
        errors = [o for o in outputs.get(i, []) if o.get("output_type") == "error"]
        assert not errors, f"{style}: cell {meta.get('grade_id') or i}: {errors[0]['evalue'][:800]}"
        if meta.get("grade"):
            ran.append(meta["grade_id"])
    assert ran == keep, ran
