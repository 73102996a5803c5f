"""Lab 8 gives full marks to correct work written in the styles production code uses.

The lab's own grading cells (imports, tools, the solution's router and dispatch) run in one real
kernel, each style followed by the tests that look at it:

- the combine weighted at the expert (Megatron-Core's choice: each row's gate sent to the experts
  first, the weighted outputs brought home, two all-to-alls): the combine's visible tests (its
  messages on 2 and 4 ranks, a message changed on its way) and the whole layer's (2 and 4 ranks,
  top-1, an EP group of 2 inside 4 ranks) must pass; the same cells with the gates applied twice
  must fail both, so the test can tell;
- a router kept in float32 (notebook 10's ``softmax(logits.float())``, HF Mixtral's
  ``softmax(..., dtype=torch.float)``) on the tests' float64 logits: the router's test and the
  layer's, hidden cases included (all 24 of the layer's hidden shapes), must pass at float32's
  tolerance (at float64's, the layer failed 41 of 120 drawn cases); a bf16 router must fail the
  router's test with a message that names its dtype.
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
FLOAT32_ROUTER = """%%program lab8_router
import torch


def router_topk(logits, k):
    probs = torch.softmax(logits.float(), dim=-1)  # float32 whatever the logits' dtype (notebook 10)
    top, experts = probs.topk(k, dim=-1)
    if k > 1:
        top = top / top.sum(dim=-1, keepdim=True)
    return top, experts


def switch_aux_loss(probs, experts):
    tokens, k = experts.shape
    f = torch.bincount(experts.reshape(-1), minlength=probs.shape[-1]).to(probs.dtype) / (tokens * k)
    return probs.shape[-1] * (f * probs.mean(dim=0)).sum()
"""
BF16_ROUTER = FLOAT32_ROUTER.replace("logits.float()", "logits.bfloat16()")
TWICE = AT_THE_EXPERT.replace("index_add(0, order // k, home)",
                              "index_add(0, order // k, home * weights.reshape(-1)[order, None])")  # fmt: skip

pytestmark = pytest.mark.slow


def _visible(source: str) -> str:
    return source.split("### BEGIN HIDDEN TESTS")[0]


def test_weighting_at_the_expert_and_a_float32_router_score_full():
    """One kernel: the tools; the combine at the expert with the combine's and the layer's
    visible tests, then the gates applied twice with the same tests; then the solution's combine
    back, a float32 router with the router's and the layer's tests in full (HIDDEN_DRAWS = 24:
    every hidden shape of the layer's test), and a bf16 router with the router's visible test."""
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
    router_test, layer_test = by_id["test_router_topk"].source, by_id["test_ep_layer"].source
    weighting = [AT_THE_EXPERT, *visible, TWICE, *visible]
    float32 = [FLOAT32_ROUTER, by_id["combine"].source, "HIDDEN_DRAWS = 24", router_test, layer_test,
               BF16_ROUTER, _visible(router_test)]  # fmt: skip
    runs = [new_code_cell(s) for s in (*weighting, *float32)]
    nb.cells = [head[0], tools[0], head[1], *tools[1:], *runs]
    with tempfile.TemporaryDirectory(prefix="lab8-styles-") as tmp:
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": tmp}}).execute()  # fmt: skip
    errors = []
    for cell in nb.cells:
        failed = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        errors.append(f"{failed[0]['ename']}: {failed[0]['evalue']}"[:400] if failed else None)
    assert not any(errors[: -len(runs)]), errors  # the tools ran
    at_expert = errors[-len(runs) : -len(runs) + len(weighting)]
    assert at_expert[:4] == [None] * 4, at_expert  # at the expert: the combine and the layer pass
    assert at_expert[4] and at_expert[5], at_expert  # the gates squared: both caught
    f32 = errors[-len(float32) :]
    assert f32[:6] == [None] * 6, f32  # float32 router: the router's and the layer's tests pass
    assert f32[6] and "bfloat16" in f32[6], f32  # a bf16 router fails, and is told why
