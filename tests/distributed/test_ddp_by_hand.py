"""DDP by hand (OverlapDDP, BucketedDDP) on real gloo ranks: equal to one process and to
torch's DDP, odd shapes, tied and frozen parameters; the initial broadcast; hooks in
reverse order, launched while backward still runs; buckets against their cap."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import launch
from helpers.dist import Dist
from helpers.parallel.data import bucketed_ddp, ddp
from helpers.parallel.data.bucketed_ddp import BucketedDDP, assign_buckets, flatten, unflatten
from helpers.parallel.data.overlap_ddp import OverlapDDP


class Odd(nn.Module):
    """Odd shapes, a tied weight (embedding = output layer) and a frozen layer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 7)
        self.frozen = nn.Linear(7, 7)
        self.frozen.requires_grad_(False)
        self.hidden = nn.Linear(7, 13)
        self.back = nn.Linear(13, 7)
        self.out = nn.Linear(7, 11, bias=False)
        self.out.weight = self.embed.weight  # tied: one Parameter, used twice

    def forward(self, idx):  # idx: (B, 3) token ids
        h = self.embed(idx).mean(1)  # (B, 7)
        h = torch.tanh(self.hidden(self.frozen(h)))  # (B, 13)
        return self.out(self.back(h))  # (B, 11)


def _odd_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return Odd().double()


def _batch(n: int):
    g = torch.Generator().manual_seed(5)
    return torch.randint(0, 11, (n, 3), generator=g), torch.randint(0, 11, (n,), generator=g)


def _train(net, x, y, steps: int, sync=None) -> tuple[torch.Tensor, list]:
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        if sync is not None:
            sync()
        opt.step()
    module = getattr(net, "module", net)
    return ddp.flat_params(module), [n for n, p in module.named_parameters() if p.grad is None]


def _every_route(d: Dist, x, y, steps: int):
    xs, ys = x.chunk(d.world_size)[d.rank], y.chunk(d.world_size)[d.rank]
    out = {}
    # Every rank draws different initial weights: the wrappers must copy rank 0's.
    per_param = OverlapDDP(_odd_model(seed=d.rank))
    out["per parameter"] = _train(
        per_param, xs, ys, steps, per_param.finish_gradient_synchronization
    )
    bucketed = BucketedDDP(_odd_model(seed=d.rank), bucket_cap_mb=100 / 2**20)  # 100-byte cap
    out["buckets"] = _train(bucketed, xs, ys, steps, bucketed.finish_gradient_synchronization)
    out["torch DDP"] = _train(ddp.wrap(_odd_model(seed=d.rank), d), xs, ys, steps)
    out["n_buckets"] = len(bucketed.buckets)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_by_hand_equals_one_process_and_torch_ddp(world):
    x, y = _batch(6 * world)  # 6 samples per rank
    single, _ = _train(_odd_model(seed=0), x, y, steps=3)
    for rank, out in enumerate(launch.spawn(_every_route, world, args=(x, y, 3))):
        assert out["n_buckets"] >= 4  # a 100-byte cap splits the model
        for route in ("per parameter", "buckets", "torch DDP"):
            params, no_grad = out[route]
            where = f"{route}, rank {rank}"
            torch.testing.assert_close(params, single, rtol=1e-10, atol=1e-12,
                                       msg=lambda m, w=where: f"{w}: {m}")  # fmt: skip
            assert no_grad == ["frozen.weight", "frozen.bias"], f"{route}: frozen gets no gradient"


def _construction(d: Dist):
    model = _odd_model(seed=10 + d.rank)
    before = ddp.flat_params(model)
    OverlapDDP(model)
    return before, ddp.flat_params(model)


def test_construction_broadcasts_rank0_parameters_and_buffers():
    out = launch.spawn(_construction, 2)
    assert not torch.equal(out[0][0], out[1][0])  # different before
    torch.testing.assert_close(out[1][1], out[0][0], rtol=0, atol=0)  # rank 0's after

    def with_buffer(d: Dist):
        bn = nn.BatchNorm1d(3)
        bn.running_mean.fill_(float(d.rank + 1))
        ddp.broadcast_state(bn)
        return bn.running_mean.clone()

    for got in launch.spawn(with_buffer, 2):
        assert torch.equal(got, torch.ones(3))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(5, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3)
    )


def _hook_order(d: Dist):
    import time

    net = OverlapDDP(_mlp())
    x = torch.randn(64, 5)
    net.start_step()
    t0 = time.perf_counter()
    net(x).square().mean().backward()
    t_end = time.perf_counter()
    launched_in_backward = [t0 < e.launched < t_end for e in net.log]
    net.finish_gradient_synchronization()
    return [e.label for e in net.log], launched_in_backward, [e.done >= e.launched for e in net.log]


def test_hooks_fire_in_reverse_order_while_backward_runs():
    labels, during, finished = launch.spawn(_hook_order, 2)[0]
    names = [n for n, _ in _mlp().named_parameters()]
    # backward reaches the last layer first; within a layer autograd may order w and b freely
    layers = [label.split(".")[0] for label in labels]
    assert layers == sorted(layers, reverse=True) and sorted(labels) == sorted(names)
    assert all(during), "every all-reduce is launched from a hook, inside backward"
    assert all(finished)


def test_bucket_assignment_against_the_cap():
    params = [torch.zeros(n) for n in (10, 840, 84, 10080, 120, 48000, 16, 2400, 6, 450)]
    cap = 10 * 2**10  # 10 KiB
    buckets = assign_buckets(params, cap)
    order = [i for b in buckets for i in b]
    assert order == list(reversed(range(len(params)))), "reverse order, every parameter once"
    for b in buckets:
        size = sum(4 * params[i].numel() for i in b)
        assert size <= cap or len(b) == 1, f"bucket {b} holds {size} bytes > cap"
    # a bucket closes only when the next parameter would not fit
    for b, nxt in zip(buckets, buckets[1:], strict=False):
        size = sum(4 * params[i].numel() for i in b)
        assert size + 4 * params[nxt[0]].numel() > cap
    assert [len(b) for b in buckets] == [2, 2, 1, 1, 1, 3]
    with pytest.raises(ValueError, match="positive"):
        assign_buckets(params, 0)


def test_flatten_unflatten_round_trip():
    ts = [torch.randn(3, 5), torch.randn(7), torch.randn(2, 1, 4)]
    back = unflatten(flatten(ts), ts)
    assert all(torch.equal(a, b) for a, b in zip(ts, back, strict=True))


def _unused(d: Dist):
    model = nn.ModuleDict({"used": nn.Linear(3, 3), "unused": nn.Linear(3, 3)})
    net = bucketed_ddp.BucketedDDP(model, bucket_cap_mb=1e-5)
    model["used"](torch.randn(4, 3)).sum().backward()
    try:
        net.finish_gradient_synchronization()
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_a_parameter_without_gradient_is_named():
    msg = launch.spawn(_unused, 2)[0]
    assert "unused.weight" in msg and "freeze it" in msg
