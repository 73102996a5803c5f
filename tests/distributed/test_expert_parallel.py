"""Expert parallelism by hand equals its serial twin (helpers.parallel.expert), forward and backward.

One process: the router's top-k weights are renormalised over the k chosen, the bias steers the
choice and not the weights, the Switch loss is 1 balanced and E collapsed, a capacity drops the
latest tokens of a full expert, the counts of a Mixtral layer. On 2 and 4 gloo ranks, with a
load skewed onto one expert and one expert left empty: the outputs, the tokens' and the router's
gradients and each rank's expert gradients equal the serial ones, with and without a capacity;
the count exchange tells each rank what it will receive; the Switch loss's per-rank parts sum
to the serial loss; and EP inside DP on a (dp, ep) = (2, 2) mesh: expert gradients summed over
dp alone equal the serial ones.
"""

from __future__ import annotations

import pytest
import torch

from helpers import launch
from helpers.parallel.expert import dispatch as EP
from helpers.parallel.expert import moe as MOE

TOL = {"rtol": 1e-5, "atol": 1e-5}
E, K, DIM, TOKENS = 8, 2, 6, 12  # tokens per rank


def _problem(world: int, seed: int = 0):
    """Tokens of every rank, the router, every expert, an upstream gradient and a bias that
    sends many tokens to expert 2 and none to expert 5 (uneven loads, an empty expert)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(world * TOKENS, DIM, generator=g)
    router = torch.randn(DIM, E, generator=g)
    experts = MOE.Experts(E, DIM, 5, generator=g)
    upstream = torch.randn(world * TOKENS, DIM, generator=g)
    bias = torch.zeros(E)
    bias[2], bias[5] = 0.5, -1.0
    return x, router, experts, upstream, bias


def _serial(x, router, experts, upstream, bias, cap):
    x, router = x.clone().requires_grad_(), router.clone().requires_grad_()
    experts.zero_grad()
    res = MOE.moe_serial(x, router, experts, K, cap, bias)
    (res.out * upstream).sum().backward()
    return res, x.grad, router.grad, experts.w1.grad.clone(), experts.w2.grad.clone()


def _rank(d, x, router, experts, upstream, bias, cap):
    lo, hi = EP.expert_range(E, d.rank, d.world_size)
    mine = experts.shard(lo, hi)
    me = slice(d.rank * TOKENS, (d.rank + 1) * TOKENS)
    xs, r = x[me].clone().requires_grad_(), router.clone().requires_grad_()
    routing = MOE.router_topk(xs @ r, K, bias)
    received, disp = EP.dispatch(xs, routing, E, None)
    out = EP.combine(EP.run_experts(received, disp.recv_counts, mine, cap), routing, disp)
    (out * upstream[me]).sum().backward()
    aux = MOE.switch_aux_loss(routing, E, all_tokens=x.shape[0]).item()
    return out.detach(), xs.grad, r.grad, mine.w1.grad, mine.w2.grad, disp.recv_counts, aux


@pytest.mark.parametrize("world", [2, 4])
def test_ep_equals_serial_forward_and_backward(world):
    x, router, experts, upstream, bias = _problem(world)
    for cap in (None, 3):
        twin, dx, drouter, dw1, dw2 = _serial(x, router, experts, upstream, bias, cap)
        counts = MOE.expert_counts(twin.routing.experts, E)
        assert counts[5] == 0 and counts[2] == world * TOKENS and counts.max() > 2 * counts.min()
        assert (cap is None) == bool(twin.kept.all())
        res = launch.spawn(_rank, world_size=world, args=(x, router, experts, upstream, bias, cap))
        torch.testing.assert_close(torch.cat([r[0] for r in res]), twin.out, **TOL)
        torch.testing.assert_close(torch.cat([r[1] for r in res]), dx, **TOL)
        torch.testing.assert_close(
            sum(r[2] for r in res), drouter, **TOL
        )  # router: summed over ranks
        torch.testing.assert_close(
            torch.cat([r[3] for r in res]), dw1, **TOL
        )  # each rank its experts
        torch.testing.assert_close(torch.cat([r[4] for r in res]), dw2, **TOL)
        per = E // world
        for rank, r in enumerate(res):  # what each source sends to each of this rank's experts
            for src in range(world):
                mine = twin.routing.experts[src * TOKENS : (src + 1) * TOKENS]
                want = [int((mine == e).sum()) for e in range(rank * per, (rank + 1) * per)]
                assert r[5][src] == want
        serial_aux = MOE.switch_aux_loss(twin.routing, E).item()
        assert sum(r[6] for r in res) == pytest.approx(serial_aux, rel=1e-5)


def _mesh_rank(d, x, router, experts, upstream, bias, over):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
    ep = mesh.get_local_rank("ep")
    mine = experts.shard(*EP.expert_range(E, ep, 2))
    me = slice(d.rank * TOKENS, (d.rank + 1) * TOKENS)
    xs, r = x[me].clone(), router.clone().requires_grad_()
    out, _ = EP.ep_moe(xs, r, mine, E, K, group=mesh.get_group("ep"), bias=bias)
    (out * upstream[me]).sum().backward()
    expert_group = mesh.get_group("dp") if over == "dp" else None
    EP.reduce_gradients([mine.w1, mine.w2], [r], expert_group=expert_group)
    return ep, mine.w1.grad, mine.w2.grad, r.grad


def test_ep_inside_dp_reduces_expert_gradients_over_dp_only():
    x, router, experts, upstream, bias = _problem(4, seed=1)
    _, _, drouter, dw1, dw2 = _serial(x, router, experts, upstream, bias, None)
    for over in ("dp", "every rank"):
        res = launch.spawn(
            _mesh_rank, world_size=4, args=(x, router, experts, upstream, bias, over)
        )
        for ep, w1, w2, r in res:
            torch.testing.assert_close(r, drouter, **TOL)
            half = slice(ep * E // 2, (ep + 1) * E // 2)
            same = torch.allclose(w1, dw1[half], **TOL) and torch.allclose(w2, dw2[half], **TOL)
            assert same == (over == "dp"), (over, ep)


def test_router_topk_renormalises_and_bias_steers_the_choice_only():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    r = MOE.router_topk(logits, 2)
    assert r.experts.tolist() == [[0, 1]]
    p = torch.softmax(logits, -1)[0]
    torch.testing.assert_close(r.weights[0], p[:2] / p[:2].sum())
    biased = MOE.router_topk(logits, 2, bias=torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert biased.experts.tolist() == [[2, 0]]
    torch.testing.assert_close(biased.weights[0], p[[2, 0]] / p[[2, 0]].sum())


def test_switch_loss_capacity_and_bias_update():
    tokens = 16
    uniform = MOE.Routing(torch.arange(tokens).view(-1, 1) % 4, torch.ones(tokens, 1),
                          torch.full((tokens, 4), 0.25))  # fmt: skip
    assert MOE.switch_aux_loss(uniform, 4).item() == pytest.approx(1.0)
    collapsed = MOE.Routing(torch.zeros(tokens, 1, dtype=torch.long), torch.ones(tokens, 1),
                            torch.tensor([[1.0, 0, 0, 0]]).repeat(tokens, 1))  # fmt: skip
    assert MOE.switch_aux_loss(collapsed, 4).item() == pytest.approx(4.0)
    assert MOE.capacity(tokens=64, k=2, n_experts=8, factor=1.25) == 20
    bias = MOE.update_bias(torch.zeros(4), torch.tensor([10, 2, 4, 0]), rate=0.1)
    torch.testing.assert_close(bias, torch.tensor([-0.1, 0.1, 0.0, 0.1]))


def test_capacity_drops_the_latest_tokens_of_a_full_expert():
    x, router, experts, _, bias = _problem(1)
    full = MOE.moe_serial(x, router, experts, K, None, bias)
    capped = MOE.moe_serial(x, router, experts, K, 4, bias)
    tok, slot = torch.nonzero(full.routing.experts == 2, as_tuple=True)
    assert capped.kept[tok[:4], slot[:4]].all() and not capped.kept[tok[4:], slot[4:]].any()
    assert int((~capped.kept).sum()) == sum(
        max(0, int(c) - 4) for c in MOE.expert_counts(full.routing.experts, E)
    )


def test_mixtral_counts():
    c = MOE.moe_counts(dim=4096, hidden=14336, n_experts=8, k=2)
    assert round(c["params"] * 32 / 1e9, 1) == 45.1  # of Mixtral 8x7B's 46.7B, the rest attention
    assert c["active_params"] / c["params"] == pytest.approx(0.25, abs=1e-3)
