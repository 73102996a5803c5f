"""Llama 2 cut into pipeline stages: the stages compose to the model, costs add up to the
published count, the LM head unbalances the last stage, a FLOPs-balanced cut is never worse."""

import pytest
import torch

from helpers.models import llama2
from helpers.parallel.pipeline import pipeline_llama as PL


def test_stages_compose_to_the_whole_model():
    model = llama2.Transformer(llama2.config("tiny", n_layers=3)).init_weights(seed=1)
    tokens = torch.randint(
        0, model.args.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0)
    )
    bounds = [0, 1, 3]  # uneven on purpose
    h = tokens
    with torch.no_grad():
        for a, b in zip(bounds, bounds[1:], strict=False):
            h = PL.LlamaStage(model, a, b)(h)
        torch.testing.assert_close(h, model(tokens))
    with pytest.raises(ValueError, match="0 <= first < last <= 3"):
        PL.LlamaStage(model, 2, 2)


def test_costs_add_up_and_the_head_unbalances_the_last_stage():
    args = llama2.config("7B")
    costs = PL.stage_costs(args, PL.even_bounds(32, 8), 4096)
    assert sum(c["params"] for c in costs) == llama2.PUBLISHED_PARAMS["7B"]
    flops = [c["flops"] for c in costs]
    assert flops[-1] == max(flops) and flops[-1] - flops[0] == PL.head_flops(args)
    assert costs[0]["params"] - costs[1]["params"] == args.vocab_size * args.dim  # embedding
    for p in (3, 5, 8, 16):  # the exhaustive split is never slower than the even one
        best = max(
            c["flops"] for c in PL.stage_costs(args, PL.balanced_bounds(args, p, 4096), 4096)
        )
        even = max(c["flops"] for c in PL.stage_costs(args, PL.even_bounds(32, p), 4096))
        assert best <= even
    # a head as heavy as 3 blocks: the balanced cut gives the last stage fewer layers
    heavy = llama2.config("tiny", n_layers=8, vocab_size=4096)
    cut = PL.balanced_bounds(heavy, 2, 8)
    assert cut[1] > 4 and max(c["flops"] for c in PL.stage_costs(heavy, cut, 8)) < max(
        c["flops"] for c in PL.stage_costs(heavy, PL.even_bounds(8, 2), 8)
    )


def test_boundary_bytes_and_bad_splits():
    args = llama2.config("7B")
    assert PL.boundary_bytes(args, 1, 4096, 2) == 32 * 2**20  # 1 x 4096 x 4096 bf16
    with pytest.raises(ValueError, match="at most one per layer"):
        PL.even_bounds(4, 5)
