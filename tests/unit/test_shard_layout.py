"""FSDP1's flat layout and FSDP2's per-parameter rows (helpers.parallel.sharded.shard_layout),
with N ranks simulated in one process: what each rank keeps, what travels (padding
included), and that gathering and scattering give every element back to its owner."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.parallel.sharded.shard_layout import FlatLayout, PerParameterLayout, make_layout

# Shapes that do not divide by 4: an embedding of 11 x 7, Linear(7, 13) and its bias,
# a LayerNorm(13) and a head of 5 rows (fewer rows than 2 ranks of 3: rank 3 holds none).
SHAPES = [(11, 7), (13, 7), (13,), (13,), (7, 13), (5, 7)]


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]


def _gathered(name, tensors, world):
    """The all-gather's output: every rank's gather input, rank after rank."""
    layouts = [make_layout(name, [t.shape for t in tensors], r, world) for r in range(world)]
    pieces = [lay.gather_input(lay.shard(tensors), torch.float64) for lay in layouts]
    assert {p.numel() for p in pieces} == {layouts[0].chunk}, "every rank puts in the same length"
    return layouts, torch.cat(pieces)


@pytest.mark.parametrize("name", ["flat", "per-parameter"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_gathering_every_ranks_slice_gives_the_tensors_back(name, world):
    tensors = _tensors()
    layouts, full = _gathered(name, tensors, world)
    for got, want in zip(layouts[0].unshard(full), tensors, strict=True):
        assert torch.equal(got, want)
    assert full.numel() - sum(t.numel() for t in tensors) == layouts[0].padding


@pytest.mark.parametrize("world", [2, 3, 4])
def test_per_parameter_shards_are_torch_chunk_rows(world):
    """What rank r keeps is what FSDP2 keeps: torch.chunk(dim=0)'s r-th piece, or no rows."""
    tensors = _tensors()
    for r in range(world):
        kept = PerParameterLayout([t.shape for t in tensors], r, world).shard(tensors)
        for t, mine in zip(tensors, kept, strict=True):
            chunks = t.chunk(world, dim=0)
            want = chunks[r] if r < len(chunks) else t[:0]
            assert mine.shape == want.shape and torch.equal(mine, want)
    assert PerParameterLayout([(5, 7)], 3, 4).shard([tensors[-1]])[0].shape == (0, 7)


def test_padding_flat_under_n_elements_per_unit_per_parameter_up_to_n_minus_1_rows():
    shapes = [torch.Size(s) for s in SHAPES]
    total = sum(math.prod(s) for s in shapes)
    flat, rows = FlatLayout(shapes, 0, 4), PerParameterLayout(shapes, 0, 4)
    assert flat.padding == -total % 4 and flat.padding < 4
    # per parameter: 4 * ceil(rows / 4) - rows padded rows, each a row of the tensor
    want = sum((4 * math.ceil(s[0] / 4) - s[0]) * math.prod(s[1:]) for s in shapes)
    assert rows.padding == want == 1 * 7 + 3 * 7 + 3 + 3 + 1 * 13 + 3 * 7
    assert rows.chunk * 4 == total + rows.padding


@pytest.mark.parametrize("name", ["flat", "per-parameter"])
def test_reduce_scatter_slices_carry_each_ranks_own_gradients(name):
    """The gradient of the gathered buffer, cut into N equal slices (what reduce_scatter
    hands each rank), holds exactly the gradients of that rank's shards."""
    world, tensors = 4, _tensors()
    grads = [torch.randn_like(t) for t in tensors]
    for r in range(world):
        lay = make_layout(name, [t.shape for t in tensors], r, world)
        layouts, full_grad = _gathered(name, grads, world)  # gradients laid out like weights
        mine = lay.grads(full_grad.view(world, -1)[r])
        assert [g.shape for g in mine] == [s.shape for s in lay.shard(tensors)]
        for g, want in zip(mine, lay.shard(grads), strict=True):
            assert torch.equal(g, want)


def test_unknown_layout_and_zero_dim_parameters_get_clear_errors():
    with pytest.raises(ValueError, match="layout must be one of"):
        make_layout("rows", [(4, 4)], 0, 2)
    with pytest.raises(ValueError, match="0-d parameter"):
        make_layout("per-parameter", [torch.Size([])], 0, 2)
