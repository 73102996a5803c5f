"""FedAvg on real gloo ranks: the weighted average equals one computed by hand."""

import pytest
import torch
from torch import nn

from helpers import launch
from helpers.parallel.data import federated


def _model_with(value: float) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Linear(3, 2)  # 8 parameters: weight (2, 3) and bias (2,)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    return m


def _average(d, counts):
    # Client k holds weights all equal to k + 1 and counts[k] samples.
    m = _model_with(float(d.rank + 1))
    total = federated.weighted_average(d, m, counts[d.rank])
    return total, torch.cat([p.detach().flatten() for p in m.parameters()])


@pytest.mark.parametrize("counts", [[10, 30, 60], [1, 1, 1, 97]])
def test_weighted_average_matches_hand_computed(counts):
    world = len(counts)
    out = launch.spawn(_average, world_size=world, args=(counts,))
    # By hand: sum_k n_k * (k + 1) / sum_k n_k, e.g. (10*1 + 30*2 + 60*3) / 100 = 2.5
    hand = sum(n * (k + 1) for k, n in enumerate(counts)) / sum(counts)
    unweighted = sum(k + 1 for k in range(world)) / world
    assert hand != pytest.approx(unweighted)  # the weighting matters in these cases
    for total, flat in out:
        assert total == sum(counts)
        assert torch.allclose(flat, torch.full_like(flat, hand), atol=1e-6)


def _one_round(d, x, y, parts):
    rows = federated.fedavg(
        d, lambda: nn.Linear(4, 3), x, y, parts, x, y, rounds=2, local_epochs=1, lr=0.1, batch=8
    )
    return rows, rows[-1]["acc"]


def test_fedavg_rounds_leave_identical_models_and_count_rounds():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=gen)
    y = x[:, :3].argmax(1)  # 3 learnable classes
    parts = federated.split_clients(y, 3, "label_skew")
    out = launch.spawn(_one_round, world_size=3, args=(x, y, parts))
    rows = [r for r, _ in out]
    assert [r["round"] for r in rows[0]] == [1, 2]
    assert len({acc for _, acc in out}) == 1  # every client ends with the same averaged model


def test_split_clients_schemes():
    y = torch.arange(100) % 10
    skew = federated.split_clients(y, 4, "label_skew")
    iid = federated.split_clients(y, 4, "iid", seed=1)
    assert [sorted(set(y[p].tolist())) for p in skew][0] == [0, 4, 8]
    assert [len(p) for p in iid] == [len(p) for p in skew]  # same counts, different labels
    assert sorted(torch.cat(iid).tolist()) == list(range(100))  # a partition
    assert len(set(y[iid[0]].tolist())) > 3  # an IID client sees more classes
    with pytest.raises(ValueError, match="scheme"):
        federated.split_clients(y, 4, "dirichlet")
    with pytest.raises(ValueError, match="n_clients"):
        federated.split_clients(y, 11, "iid")


def _average_with_buffers(d, counts):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    with torch.no_grad():
        model[1].running_mean.fill_(float(d.rank + 1))  # client k's statistics are all k + 1
    federated.weighted_average(d, model, counts[d.rank])
    return model[1].running_mean.clone(), model[1].num_batches_tracked.clone()


def test_weighted_average_averages_batchnorm_statistics_too():
    counts = [10, 30]
    out = launch.spawn(_average_with_buffers, world_size=2, args=(counts,))
    want = (10 * 1.0 + 30 * 2.0) / 40
    for running_mean, tracked in out:
        torch.testing.assert_close(running_mean, torch.full((3,), want))
        assert tracked.item() == 0  # integer buffers are left alone


def _local_sgd(d, x, y, parts):
    def make():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))

    return federated.ddp_curve(d, make, x, y, parts, x, y, steps=11, lr=0.1, batch=4,
                               eval_at=[3, 4, 8, 11], seed=0, period=4, warmup=3)  # fmt: skip


def test_post_local_sgd_sends_gradients_during_warmup_then_averages_models_every_period():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 2, 2, generator=g), torch.randint(0, 3, (40,), generator=g)
    parts = [torch.arange(0, 20), torch.arange(20, 40)]
    out = launch.spawn(_local_sgd, world_size=2, args=(x, y, parts))
    # 3 warm-up steps with a gradient all-reduce each; models averaged after steps 4 and 8
    assert [r["allreduces"] for r in out[0]] == [3, 4, 5, 5]
    acc = [[r["acc"] for r in rank] for rank in out]
    assert acc[0][:3] == acc[1][:3], "replicas are equal right after DDP steps and averaging"
