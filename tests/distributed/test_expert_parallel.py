"""Expert parallelism by hand equals its serial twin (helpers.parallel.expert), forward and backward.

One process: the router's top-k gates are renormalised over the k chosen when k >= 2 and are
Switch's own probability at k = 1 (whose router then learns from the task: renormalised, its
gradient vanishes), scores stay in float32 for bf16 logits, the bias steers the choice and not
the gates, DeepSeek-V3's sigmoid gates with node-limited choice, the Switch loss is 1 balanced
and E/k collapsed, the drop policies keep what they say, the rows regrouped by expert and run as
one grouped product equal the per-chunk products forward and backward, a routing draw's bytes
fall with the capacity factor, the counts of a Mixtral layer. On 2 and 4 gloo ranks, with a load
skewed onto one expert and one expert left empty: the outputs, the tokens' and the router's
gradients and each rank's expert gradients equal the serial ones, dropless and with a capacity
per source (dropped rows never sent: fewer rows sent, and the padded dispatcher of static shapes
equal to it), weighting at home or at the expert; the count exchange tells each rank what it
will receive; the Switch loss's per-rank parts sum to the serial loss; and EP inside DP on a
(dp, ep) = (2, 2) mesh: expert gradients summed over dp alone equal the serial ones.
"""

from __future__ import annotations

import pytest
import torch

from helpers import launch
from helpers.parallel.expert import capacity as CAP
from helpers.parallel.expert import dispatch as EP
from helpers.parallel.expert import ep_cost as COST
from helpers.parallel.expert import grouped as GROUPED
from helpers.parallel.expert import moe as MOE
from helpers.parallel.expert import padded as PADDED
from helpers.parallel.expert import router as ROUTER

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
    sizes = [TOKENS] * (x.shape[0] // TOKENS)  # each rank's tokens: a source with its capacity
    res = MOE.moe_serial(x, router, experts, K, cap, bias, sizes=sizes)
    (res.out * upstream).sum().backward()
    return res, x.grad, router.grad, experts.w1.grad.clone(), experts.w2.grad.clone()


def _rank(d, x, router, experts, upstream, bias, cap):
    """This rank's layer three ways: dispatch with a capacity applied here (weighting at home),
    weighting at the expert, and the padded dispatcher (only with a capacity)."""
    lo, hi = EP.expert_range(E, d.rank, d.world_size)
    mine = experts.shard(lo, hi)
    me = slice(d.rank * TOKENS, (d.rank + 1) * TOKENS)
    out = {}
    for way in ("home", "expert", "padded"):
        if way == "padded" and cap is None:
            continue
        xs, r = x[me].clone().requires_grad_(), router.clone().requires_grad_()
        mine.zero_grad()
        routing = ROUTER.router_topk(xs @ r, K, bias)
        if way == "padded":
            received, plan = PADDED.dispatch_padded(xs, routing, E, cap)
            y = PADDED.run_experts_padded(received, mine, d.world_size)
            res = PADDED.combine_padded(y, routing, plan)
            sent = None
        else:
            kept = CAP.keep_mask(routing, E, cap)
            received, disp = EP.dispatch(xs, routing, E, None, kept, send_gates=way == "expert")
            y = EP.run_experts(received, disp.recv_counts, mine)
            if way == "expert":
                y = y * disp.gates.unsqueeze(-1)
            res = EP.combine(y, routing, disp, weighted=way == "expert")
            sent = (sum(disp.send_splits), int(kept.sum()), disp.recv_counts)
        (res * upstream[me]).sum().backward()
        out[way] = (res.detach(), xs.grad, r.grad, mine.w1.grad.clone(), mine.w2.grad.clone(), sent)
    aux = ROUTER.switch_aux_loss(routing, E, all_tokens=x.shape[0]).item()
    return out, aux


@pytest.mark.parametrize("world", [2, 4])
def test_ep_equals_serial_forward_and_backward(world):
    x, router, experts, upstream, bias = _problem(world)
    for cap in (None, 3):
        twin, dx, drouter, dw1, dw2 = _serial(x, router, experts, upstream, bias, cap)
        counts = ROUTER.expert_counts(twin.routing.experts, E)
        assert counts[5] == 0 and counts[2] == world * TOKENS and counts.max() > 2 * counts.min()
        assert (cap is None) == bool(twin.kept.all())
        res = launch.spawn(_rank, world_size=world, args=(x, router, experts, upstream, bias, cap))
        for way in res[0][0]:
            got = [r[0][way] for r in res]
            torch.testing.assert_close(torch.cat([g[0] for g in got]), twin.out, **TOL)
            torch.testing.assert_close(torch.cat([g[1] for g in got]), dx, **TOL)
            torch.testing.assert_close(sum(g[2] for g in got), drouter, **TOL)  # summed over ranks
            torch.testing.assert_close(torch.cat([g[3] for g in got]), dw1, **TOL)  # each its own
            torch.testing.assert_close(torch.cat([g[4] for g in got]), dw2, **TOL)
        per = E // world
        for rank, r in enumerate(res):
            rows_sent, kept, recv_counts = r[0]["home"][5]
            mine = slice(rank * TOKENS, (rank + 1) * TOKENS)
            assert rows_sent == kept == int(twin.kept[mine].sum())  # the dropped never leave
            for src in range(world):  # what each source sends to each of this rank's experts
                theirs = slice(src * TOKENS, (src + 1) * TOKENS)
                chosen, kept_src = twin.routing.experts[theirs], twin.kept[theirs]
                want = [
                    int(((chosen == e) & kept_src).sum())
                    for e in range(rank * per, (rank + 1) * per)
                ]
                assert recv_counts[src] == want
        if cap is not None:  # every source keeps at most cap rows per expert
            for src in range(world):
                theirs = slice(src * TOKENS, (src + 1) * TOKENS)
                chosen = twin.routing.experts[theirs][twin.kept[theirs]]
                assert ROUTER.expert_counts(chosen.view(-1, 1), E).max() <= cap
        serial_aux = ROUTER.switch_aux_loss(twin.routing, E).item()
        assert sum(r[1] for r in res) == pytest.approx(serial_aux, rel=1e-5)


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
    r = ROUTER.router_topk(logits, 2)
    assert r.experts.tolist() == [[0, 1]]
    p = torch.softmax(logits, -1)[0]
    torch.testing.assert_close(r.weights[0], p[:2] / p[:2].sum())
    biased = ROUTER.router_topk(logits, 2, bias=torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert biased.experts.tolist() == [[2, 0]]
    torch.testing.assert_close(biased.weights[0], p[[2, 0]] / p[[2, 0]].sum())
    switch = ROUTER.router_topk(logits, 1)  # Switch: the probability itself, not p / p = 1
    torch.testing.assert_close(switch.weights[0], p[:1])
    half = ROUTER.router_topk(logits.bfloat16(), 2)  # scores and gates stay float32
    assert half.weights.dtype == half.probs.dtype == torch.float32


def test_k1_switch_gate_gives_the_router_a_task_gradient_and_renormalising_kills_it():
    x, router, experts, _, _ = _problem(1)
    grads = {}
    for norm in (None, True):  # None: Switch's p at k = 1; True: renormalised, p / p = 1
        r = router.clone().requires_grad_()
        MOE.moe_serial(x, r, experts, 1, norm=norm).out.square().sum().backward()
        grads[norm] = r.grad.abs().max().item()
    assert grads[None] > 1e-2 and grads[True] < 1e-5, grads


def test_sigmoid_node_limited_gates():
    logits = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    r = ROUTER.router_topk(logits, 4, score="sigmoid", groups=4, group_topk=2, scale=2.5)
    assert all(len(set(row)) <= 2 for row in (r.experts // 4).tolist())  # at most 2 groups
    torch.testing.assert_close(r.weights.sum(-1), torch.full((32,), 2.5))
    s = torch.sigmoid(logits).gather(-1, r.experts)
    torch.testing.assert_close(r.weights, 2.5 * s / s.sum(-1, keepdim=True))


def test_switch_loss_bias_update_and_capacity():
    tokens = 16
    uniform = ROUTER.Routing(torch.arange(tokens).view(-1, 1) % 4, torch.ones(tokens, 1),
                             torch.full((tokens, 4), 0.25))  # fmt: skip
    assert ROUTER.switch_aux_loss(uniform, 4).item() == pytest.approx(1.0)
    collapsed = ROUTER.Routing(torch.zeros(tokens, 1, dtype=torch.long), torch.ones(tokens, 1),
                               torch.tensor([[1.0, 0, 0, 0]]).repeat(tokens, 1))  # fmt: skip
    assert ROUTER.switch_aux_loss(collapsed, 4).item() == pytest.approx(4.0)
    both = ROUTER.Routing(torch.tensor([[0, 1]]).repeat(tokens, 1), torch.full((tokens, 2), 0.5),
                          torch.tensor([[0.5, 0.5, 0, 0]]).repeat(tokens, 1))  # fmt: skip
    assert ROUTER.switch_aux_loss(both, 4).item() == pytest.approx(2.0)  # top-2 collapsed: E/k
    assert CAP.capacity(tokens=64, k=2, n_experts=8, factor=1.25) == 20
    bias = ROUTER.update_bias(torch.zeros(4), torch.tensor([10, 2, 4, 0]), rate=0.1)
    torch.testing.assert_close(bias, torch.tensor([-0.1, 0.1, 0.0, 0.1]))


def test_drop_policies_keep_what_they_say():
    # 4 tokens, top-2, every token on experts 0 and 1; token t's gate for expert 0 grows with t
    experts = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0]])
    weights = torch.tensor([[0.6, 0.4], [0.3, 0.7], [0.9, 0.1], [0.2, 0.8]])
    routing = ROUTER.Routing(experts, weights, torch.zeros(4, 2))
    position = CAP.keep_mask(routing, 2, 2, "position")
    assert position[:2].all() and not position[2:].any()  # the first tokens win
    choice = CAP.keep_mask(routing, 2, 2, "choice")  # every first choice, then second ones
    assert choice[:, 0].all() and not choice[:, 1].any()
    probs = CAP.keep_mask(routing, 2, 2, "probs")  # expert 0: gates .6 .7 .9 .8 -> tokens 2, 3
    assert [bool(probs[t][experts[t] == 0]) for t in range(4)] == [False, False, True, True]
    per_source = CAP.keep_mask(routing, 2, 1, "position", sizes=[2, 2])  # each source its own
    assert per_source.sum() == 4 and per_source[0].all() and per_source[2].all()


def test_grouped_experts_equal_the_per_chunk_products():
    g = torch.Generator().manual_seed(1)
    counts = [[2, 0, 5], [0, 0, 1], [4, 3, 0], [1, 1, 1]]  # 4 sources, 3 local experts, empties
    rows = sum(map(sum, counts))
    for dtype, align, dim in (
        (torch.float32, 1, 6),
        (torch.float32, 8, 6),
        (torch.bfloat16, 8, 16),
    ):
        experts = MOE.Experts(3, dim, 32, generator=g).to(dtype)
        received = torch.randn(rows, dim, generator=g).to(dtype).requires_grad_()
        upstream = torch.randn(rows, dim, generator=g).to(dtype)
        want = EP.run_experts(received, counts, experts)
        want_grads = torch.autograd.grad(
            (want * upstream).sum(), (received, experts.w1, experts.w2)
        )
        got = GROUPED.run_grouped(received, counts, experts, align)
        got_grads = torch.autograd.grad((got * upstream).sum(), (received, experts.w1, experts.w2))
        tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else TOL
        torch.testing.assert_close(got, want, **tol)
        for a, b in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, **tol)
    dest, offsets, size = GROUPED.expert_major(torch.tensor(counts), rows, align=8)
    assert offsets.tolist() == [8, 16, 24] and size == rows + 3 * 7  # each expert padded to 8
    assert sorted(dest.tolist()) == sorted(set(dest.tolist()))  # every row its own place


def test_routing_draw_bytes_fall_with_the_capacity_factor_and_the_receiver_carries_the_skew():
    sent = [COST.routing_draw(4096, 16, 2, 4, f, skew=1.0)["bytes"].sum().item()
            for f in (None, 2.0, 1.25, 1.0)]  # fmt: skip
    assert sent[0] > sent[1] > sent[2] > sent[3], sent
    flat = COST.routing_draw(4096, 16, 2, 4, None, skew=0.0)["received_rows"]
    skewed = COST.routing_draw(4096, 16, 2, 4, None, skew=1.0)
    assert skewed["received_rows"].max() > 1.5 * flat.max()  # the hot experts' rank receives more
    assert skewed["bytes"].sum(1).max() == skewed["bytes"].sum(1).min()  # every rank sends alike


def test_mixtral_counts():
    c = MOE.moe_counts(dim=4096, hidden=14336, n_experts=8, k=2)
    assert round(c["params"] * 32 / 1e9, 1) == 45.1  # of Mixtral 8x7B's 46.7B, the rest attention
    assert c["active_params"] / c["params"] == pytest.approx(0.25, abs=1e-3)


def test_balance_measures_and_the_bias_rule_reading_a_probe():
    """A step's busiest / mean, the averaged load's busiest / mean and the step-to-step change,
    on a load that alternates (the bias's swing): each step 1.5x, on average even, each expert changing by 32 a step.
    ``train`` hands the bias rule the probe batch's counts (probe x k assignments), not the
    training batch's (tokens x k)."""
    from helpers.parallel.expert import balance as BAL

    run = BAL.RunResult(load=[[48, 16], [16, 48]] * 5)
    assert run.imbalance(4) == pytest.approx(1.5) and run.mean_load_imbalance(4) == pytest.approx(
        1.0
    )
    assert run.swing(4) == pytest.approx(32.0) and run.imbalance(2, end=2) == pytest.approx(1.5)
    assert BAL.RunResult(load=[[40, 24]] * 4).swing(4) == 0.0
    seen = []

    def spy(bias, counts, rate):
        seen.append(int(counts.sum()))
        return ROUTER.update_bias(bias, counts, rate)

    res = BAL.train("bias", steps=2, tokens=32, probe=96, update=spy)
    assert seen == [96 * 2] * 2 and all(sum(step) == 32 * 2 for step in res.load)
