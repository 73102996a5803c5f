"""helpers.data + helpers.training.loop on real gloo ranks: sharded evaluation equals one process."""

import pytest
import torch

from helpers import data, launch, models, training
from helpers.dist import Dist


def _dataset(n: int = 60):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 3, 32, 32, generator=g), torch.arange(n) % 10
    )


def _model():
    torch.manual_seed(1)  # the same weights on every rank and in the reference
    return models.CifarCNN()


def _sharded_eval(d: Dist, drop_last: bool, n: int = 60):
    ds = _dataset(n)
    loader = data.make_loader(ds, 7, d, shuffle=False, drop_last=drop_last)
    indices = list(loader.sampler)  # this rank's slice of the dataset
    return training.evaluate(_model(), loader, d.device), indices


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_evaluation_equals_one_process(world):
    torch.set_num_threads(1)
    ref = training.evaluate(
        _model(), data.make_loader(_dataset(), 7, shuffle=False), torch.device("cpu")
    )
    out = launch.spawn(_sharded_eval, world, args=(False,))
    shards = [indices for _, indices in out]
    # 60 samples split over 2 or 3 ranks: disjoint slices that cover the dataset
    assert sorted(sum(shards, [])) == list(range(60))
    for rank, (res, _) in enumerate(out):
        # evaluate() all-reduces its counts: every rank reports the whole test set
        assert res["samples"] == 60, rank
        assert res["accuracy"] == pytest.approx(ref["accuracy"], abs=1e-12)
        assert res["loss"] == pytest.approx(ref["loss"], rel=1e-5)


def test_padding_counts_repeated_samples_and_drop_last_does_not():
    # 62 samples over 4 ranks. Padding: ceil(62/4) = 16 per rank, 64 in all (two repeated).
    padded = launch.spawn(_sharded_eval, 4, args=(False, 62))
    assert {res["samples"] for res, _ in padded} == {64}
    assert len(set(sum((ix for _, ix in padded), []))) == 62
    # drop_last: floor(62/4) = 15 per rank, and the DataLoader also drops each rank's
    # last incomplete batch of 7: 2 batches x 7 = 14 per rank, 56 in all.
    dropped = launch.spawn(_sharded_eval, 4, args=(True, 62))
    assert {res["samples"] for res, _ in dropped} == {56}
