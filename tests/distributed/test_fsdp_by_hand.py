"""FSDP from collectives (helpers.parallel.sharded.fsdp_by_hand) on real gloo ranks: it trains exactly
like one process and like FSDP2, in FSDP1's flat layout and in FSDP2's per-parameter rows (then
shard for shard and collective for collective like FSDP2), sends what ZeRO-3 sends, frees the
gathered weights between forward and backward, and holds 16 bytes per parameter / N between steps."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import launch
from helpers.course.grading.recorder.traffic import record_traffic
from helpers.dist import Dist
from helpers.models import llama2
from helpers.parallel.sharded import fsdp, fsdp_by_hand, memory

LLAMA = llama2.config("tiny", n_layers=2, vocab_size=250)
COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")


class Odd(nn.Module):
    """Shapes that do not divide by 2 or 4: every unit's flat vector needs padding."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 7)
        self.block = nn.Sequential(nn.Linear(7, 13), nn.LayerNorm(13), nn.GELU(), nn.Linear(13, 7))
        self.head = nn.Linear(7, 5, bias=False)

    def forward(self, tokens):
        return self.head(self.block(self.emb(tokens)))


def _odd(dtype=torch.float64):
    torch.manual_seed(1)
    return Odd().to(dtype)


def _train(d, model, units, tokens, targets, steps=3, dtype=None, calls=None, layout="flat"):
    """AdamW steps; ``calls``: a list that receives the last step's collectives."""
    if units is not None:
        model = fsdp_by_hand.shard_model(d, model, units(model), compute_dtype=dtype, layout=layout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mine = tokens.chunk(d.world_size)[d.rank], targets.chunk(d.world_size)[d.rank]
    losses = []
    for step in range(steps):
        opt.zero_grad()
        with record_traffic(allow=COLLECTIVES) as traffic:
            logits = model(mine[0])
            if logits.dtype == torch.bfloat16:
                logits = logits.float()  # the loss in fp32, as FSDP2's users do
            loss = F.cross_entropy(logits.flatten(0, -2), mine[1].flatten())
            loss.backward()
        if calls is not None and step == steps - 1:
            calls += [(c.name, c.bytes) for c in traffic.calls]
        opt.step()
        total = loss.detach().clone()
        if d.world_size > 1:
            torch.distributed.all_reduce(total)
        losses.append(total.item() / d.world_size)
    return losses, model


def _odd_run(d, tokens, targets, layout):
    losses, model = _train(
        d, _odd(), lambda m: [m.emb, m.block, m.head], tokens, targets, layout=layout
    )
    return losses, fsdp_by_hand.full_state_dict(model)


@pytest.mark.parametrize("layout", ["flat", "per-parameter"])
@pytest.mark.parametrize("world", [2, 4])
def test_equals_one_process_with_odd_shapes(world, layout):
    g = torch.Generator().manual_seed(0)
    tokens, targets = (
        torch.randint(0, 11, (8, 3), generator=g),
        torch.randint(0, 5, (8, 3), generator=g),
    )
    ref_losses, ref = _train(Dist(), _odd(), None, tokens, targets)
    for rank, (losses, state) in enumerate(
        launch.spawn(_odd_run, world, args=(tokens, targets, layout))
    ):
        assert losses == pytest.approx(ref_losses, rel=1e-12, abs=1e-12), f"rank {rank}"
        assert state.keys() == ref.state_dict().keys()  # the original names, every parameter
        for name, value in ref.state_dict().items():
            torch.testing.assert_close(state[name], value, rtol=1e-10, atol=1e-12,
                                       msg=lambda m, n=name, r=rank: f"{n}, rank {r}/{world}: {m}")  # fmt: skip
    assert ref_losses[-1] < ref_losses[0]


def _llama_units(m):
    return [m.tok_embeddings, *m.layers.values(), m.norm, m.output]


def _llama(d, tokens, dtype, by_hand: bool):
    """Three steps of the tiny Llama by hand or with FSDP2 (the same units, the same policy);
    the by-hand run also records the collectives of its last step."""
    torch.manual_seed(0)
    model = llama2.Transformer(LLAMA)
    if not by_hand:
        from torch.distributed.device_mesh import init_device_mesh

        mp = fsdp.mixed_precision() if dtype == torch.bfloat16 else None
        mesh = init_device_mesh("cpu", (d.world_size,))
        fsdp.apply_fsdp(model, mesh, layers=_llama_units(model), mp_policy=mp)
        losses, model = _train(d, model, None, tokens[:, :-1], tokens[:, 1:], dtype=dtype)
        return losses, {k: v.full_tensor() for k, v in model.state_dict().items()}, []
    calls = []
    losses, model = _train(d, model, _llama_units, tokens[:, :-1], tokens[:, 1:], dtype=dtype,
                           calls=calls)  # fmt: skip
    return losses, fsdp_by_hand.full_state_dict(model), calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_equals_fsdp2_and_sends_what_zero3_sends(dtype):
    tokens = torch.randint(0, 250, (4, 17), generator=torch.Generator().manual_seed(0))
    hand = launch.spawn(_llama, 2, args=(tokens, dtype, True))
    ref = launch.spawn(_llama, 2, args=(tokens, dtype, False))
    for (h_losses, h_state, _), (f_losses, f_state, _) in zip(hand, ref, strict=True):
        assert h_losses == pytest.approx(f_losses, abs=1e-6)  # bf16 too: the same arithmetic
        assert h_state.keys() == f_state.keys()
        for name, value in f_state.items():
            torch.testing.assert_close(h_state[name], value, rtol=1e-6, atol=1e-6)
    # what one step sends, per rank: each unit's shard gathered in the compute dtype in
    # forward, again in backward (not the embedding: its backward needs only the tokens),
    # and each unit's full gradient reduce-scattered in fp32; norms all-reduced whole
    model = llama2.Transformer(LLAMA)
    units = _llama_units(model)
    sharded = [sum(p.numel() for m in u.modules() if isinstance(m, fsdp_by_hand.SHARDED_TYPES)
                   for p in m.parameters(recurse=False)) for u in units]  # fmt: skip
    chunks = [-(-n // 2) for n in sharded]
    size = torch.finfo(dtype).bits // 8
    calls = hand[0][2]
    gathers = [b for name, b in calls if name == "all_gather_into_tensor"]
    forward = [c * size for c in chunks if c]
    backward = [c * size for c, u in zip(chunks, units, strict=True)
                if c and not isinstance(u, nn.Embedding)][::-1]  # fmt: skip
    assert gathers == forward + backward
    scatters = [b for name, b in calls if name == "reduce_scatter_tensor"]
    assert sorted(scatters) == sorted(2 * c * 4 for c in chunks if c)
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert sum(b for name, b in calls if name == "all_reduce") == 4 * norms


def _local_shards(d, tokens, by_hand: bool):
    """Rank's local shards (before and after 3 bf16 steps) and the last step's collectives:
    the per-parameter layout by hand, or FSDP2 on the same units."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    model = llama2.Transformer(LLAMA)
    if by_hand:
        fsdp_by_hand.shard_model(
            d, model, _llama_units(model), torch.bfloat16, layout="per-parameter"
        )
    else:
        mesh = init_device_mesh("cpu", (d.world_size,))
        fsdp.apply_fsdp(model, mesh, layers=_llama_units(model), mp_policy=fsdp.mixed_precision())

    def local():
        return [
            (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
            for p in model.parameters()
        ]

    before, calls = local(), []
    _train(d, model, None, tokens[:, :-1], tokens[:, 1:], calls=calls)
    return before, local(), calls


def test_per_parameter_layout_keeps_and_sends_what_fsdp2_does():
    """On 4 ranks (vocabulary 250: 63 rows each, 61 on the last rank, padded on the wire) every
    rank holds FSDP2's local tensors, before and after 3 bf16 steps, bit for bit, and sends
    FSDP2's collectives, byte for byte, less the embedding's backward gather that FSDP2 makes
    and its backward does not need."""
    tokens = torch.randint(0, 250, (4, 17), generator=torch.Generator().manual_seed(0))
    hand = launch.spawn(_local_shards, 4, args=(tokens, True))
    ref = launch.spawn(_local_shards, 4, args=(tokens, False))
    for rank, ((h0, h3, h_calls), (f0, f3, f_calls)) in enumerate(zip(hand, ref, strict=True)):
        for when, h, f in (("before", h0, f0), ("after 3 steps", h3, f3)):
            assert [t.shape for t in h] == [t.shape for t in f], f"rank {rank} {when}"
            assert all(torch.equal(a, b) for a, b in zip(h, f, strict=True)), f"rank {rank} {when}"
        emb_gather = ("all_gather_into_tensor", -(-250 // 4) * LLAMA.dim * 2)  # 63 rows in bf16
        assert sorted(f_calls) == sorted([*h_calls, emb_gather]), f"rank {rank}"
    assert hand[3][0][0].shape == (61, LLAMA.dim)  # torch.chunk: the last rank's rows


def _held(d, steps):
    """Bytes of the shards, their gradients and AdamW's state on this rank after ``steps``,
    and whether the gathered weights were freed after forward."""
    import weakref

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(3)])
    model = fsdp_by_hand.shard_model(d, model, list(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 64, requires_grad=True)
    seen = []
    original = fsdp_by_hand.ShardedUnit.all_gather

    def all_gather(unit):  # watch every gathered vector
        full = original(unit)
        seen.append(weakref.ref(full))
        return full

    fsdp_by_hand.ShardedUnit.all_gather = all_gather
    try:
        out = model(x).sum()
        kept = [unit.gathered is not None for unit in model]  # the units hold no full vector
        # gloo may still hold the last collective's output until its work object is released
        alive_after_forward = (sum(r() is not None for r in seen), any(kept))
        out.backward()
    finally:
        fsdp_by_hand.ShardedUnit.all_gather = original
    opt.step()
    return memory.measure_states(model, opt), alive_after_forward, len(seen)


def test_gathered_weights_are_freed_and_states_are_sharded():
    states, alive, gathers = launch.spawn(_held, 2, args=(1,))[0]
    survivors, kept = alive
    assert not kept and survivors <= 1  # after forward no unit keeps its gathered weights
    assert gathers == 6  # 3 in forward, 3 again in backward (x requires grad: all needed)
    full = memory.estimate(3 * (64 * 64 + 64), dp=2, stage=3, precision="fp32")
    assert states.params == full.params and states.grads == full.grads
    assert states.optimizer == full.optimizer


def test_units_must_cover_the_model():
    model = _odd()
    with pytest.raises(ValueError, match=r"in no unit: \['head.weight'\]"):
        fsdp_by_hand.shard_model(Dist(), model, [model.emb, model.block])


def test_a_unit_without_linear_or_embedding_has_no_shard():
    """A unit of norms only (Llama's final norm) gives the optimizer no empty parameter that no
    gradient reaches, and computes in its parameters' dtype (it took fp32 from an empty shard)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).double()
    names = [n for n, _ in model.named_parameters()]
    fsdp_by_hand.shard_model(Dist(), model, [model[0], model[1]])
    out = model(torch.randn(3, 4, dtype=torch.float64))
    out.sum().backward()
    assert out.dtype == torch.float64
    assert len(model[1].shards) == 0
    assert all(
        p.numel() > 0 and p.grad is not None for p in model.parameters()
    )  # every one trained
    assert sorted(fsdp_by_hand.full_state_dict(model)) == sorted(names)
