"""Lab 8 accepts the combine weighted at the expert (Megatron-Core's choice) as well as at home.

The lab's own grading cells (imports, tools, the solution's router and dispatch) run in a real
kernel with the combine replaced by one that sends each row's gate to the experts first and
brings the weighted outputs home (two all-to-alls): the combine's visible tests (its messages on
2 and 4 ranks, a message changed on its way) and the whole layer's (2 and 4 ranks, top-1, an EP
group of 2 inside 4 ranks) must pass. The same cells with the gates applied twice must fail both, so the test
can tell.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from helpers.course.grading.draws import draw_notebook

ROOT = Path(__file__).resolve().parents[2]
LAB8 = ROOT / "solutions" / "lab8" / "lab8.ipynb"
KEEP = ("imports", "router", "setup_router", "dispatch", "setup_ep", "combine", "setup_layer",
        "test_combine", "test_ep_layer")  # fmt: skip

AT_THE_EXPERT = """%%program lab8_combine
import torch

if __name__ != "__main__":
    from lab8_dispatch import AllToAll


def combine(y, weights, plan):
    order, send, recv, group = plan
    k = weights.shape[1]
    gates = AllToAll.apply(weights.reshape(-1)[order].unsqueeze(-1), recv, send, group)
    home = AllToAll.apply(y * gates, send, recv, group)  # weighted where the expert ran
    return home.new_zeros(weights.shape[0], home.shape[1]).index_add(0, order // k, home)
"""
TWICE = AT_THE_EXPERT.replace("index_add(0, order // k, home)",
                              "index_add(0, order // k, home * weights.reshape(-1)[order, None])")  # fmt: skip

pytestmark = pytest.mark.slow


def _visible(source: str) -> str:
    return source.split("### BEGIN HIDDEN TESTS")[0]


def test_weighting_at_the_expert_scores_like_weighting_at_home():
    """One kernel: the tools, then the combine at the expert with the combine's and the layer's
    visible tests, then the gates applied twice with the same tests."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell

    nb = draw_notebook(LAB8, draws=1)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    head = [c for c in nb.cells if c.source.startswith("HIDDEN_DRAWS")
            or "parameters" in c.metadata.get("tags", [])]  # fmt: skip
    tools = [by_id[g] for g in ("imports", "router", "setup_router", "dispatch", "setup_ep",
                                "setup_layer")]  # fmt: skip
    tests = [by_id["test_combine"].source, by_id["test_ep_layer"].source]
    visible = [_visible(t) for t in tests]
    runs = [new_code_cell(s) for s in (AT_THE_EXPERT, *visible, TWICE, *visible)]
    nb.cells = [head[0], tools[0], head[1], *tools[1:], *runs]
    with tempfile.TemporaryDirectory(prefix="lab8-styles-") as tmp:
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": tmp}}).execute()  # fmt: skip
    errors = []
    for cell in nb.cells:
        failed = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        errors.append(f"{failed[0]['ename']}: {failed[0]['evalue']}"[:300] if failed else None)
    assert not any(errors[: -len(runs)]), errors  # the tools ran
    right, wrong = errors[-len(runs) : -3], errors[-3:]
    assert right == [None, None, None], right  # at the expert: the combine and the layer pass
    assert wrong[0] is None and wrong[1] and wrong[2], wrong  # the gates squared: both caught
