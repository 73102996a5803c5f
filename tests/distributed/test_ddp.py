"""Data parallelism on real gloo ranks: averaging by hand == DDP == one process, full batch."""

import pytest
import torch
import torch.distributed as tdist

from helpers import launch, models
from helpers.dist import Dist
from helpers.parallel.data import buckets, ddp
from helpers.programs.train_ddp import DDPConfig, train


def _global_batch(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def _cnn64() -> torch.nn.Module:
    torch.manual_seed(1)
    return models.CifarCNN().double()  # float64: differences are rounding only (~1e-16)


def _both_modes(d: Dist, x, y, steps: int, lr: float):
    return {mode: ddp.sgd_steps(d, _cnn64(), x, y, steps, lr, mode) for mode in ("manual", "ddp")}


@pytest.mark.parametrize("world", [2, 3])
def test_manual_averaging_equals_ddp_equals_full_batch(world):
    x, y = _global_batch(4 * world)
    ref = ddp.sgd_steps(Dist(), _cnn64(), x, y, steps=3, lr=0.1, mode="single")
    per_rank = launch.spawn(_both_modes, world, args=(x, y, 3, 0.1))
    for rank, modes in enumerate(per_rank):
        for mode, out in modes.items():
            where = f"{mode}, rank {rank} of {world}"
            # first step: the average of the rank gradients is the full-batch gradient
            torch.testing.assert_close(out["grads"], ref["grads"], rtol=1e-9, atol=1e-12,
                                       msg=lambda m, w=where: f"gradients, {w}: {m}")  # fmt: skip
            # after 3 steps the parameters still agree with one process on the full batch
            torch.testing.assert_close(out["params"], ref["params"], rtol=1e-9, atol=1e-12,
                                       msg=lambda m, w=where: f"parameters, {w}: {m}")  # fmt: skip


def _sum_without_dividing(d: Dist, x, y):
    """The classic bug: all_reduce(SUM) without / world_size gives N times the gradient."""
    model = _cnn64()
    xs, ys = x.chunk(d.world_size)[d.rank], y.chunk(d.world_size)[d.rank]
    torch.nn.functional.cross_entropy(model(xs), ys).backward()
    for p in model.parameters():
        tdist.all_reduce(p.grad)
    return ddp.flat_grads(model)


def test_summing_instead_of_averaging_is_detected():
    x, y = _global_batch(8)
    ref = ddp.sgd_steps(Dist(), _cnn64(), x, y, steps=1, lr=0.1, mode="single")["grads"]
    summed = launch.spawn(_sum_without_dividing, 2, args=(x, y))[0]
    torch.testing.assert_close(summed, 2 * ref, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(summed, ref)


@pytest.mark.parametrize("sync", ["ddp", "manual"])
def test_replicas_identical_after_training_steps(sync):
    cfg = DDPConfig(epochs=1, max_steps=6, n_train=512, n_test=20, batch_size=16, sync=sync,
                    offline="true", evaluate=False, verbose=False)  # fmt: skip
    per_rank = launch.spawn(train, 3, args=(cfg,), threads=1)
    assert [m["replica_spread"] for m in per_rank] == [0.0, 0.0, 0.0]
    assert all(m["steps"] == 6 for m in per_rank)


def test_replicas_drift_without_averaging():
    # the negative control: the spread check above can fail
    cfg = DDPConfig(epochs=1, max_steps=6, n_train=512, n_test=20, batch_size=16, sync="none",
                    offline="true", evaluate=False, verbose=False)  # fmt: skip
    per_rank = launch.spawn(train, 2, args=(cfg,), threads=1)
    assert per_rank[0]["replica_spread"] > 1e-4


def _two_bucket_sizes(d: Dist, x, y):
    return {cap: buckets.timeline(d, models.CifarCNN(), x, y, cap, 1) for cap in (None, 0.01)}


def test_small_buckets_split_the_model_and_cover_every_parameter():
    x, y = _global_batch(16)
    x = x.float()
    out = launch.spawn(_two_bucket_sizes, 2, args=(x, y))[0]
    n_params = models.count_parameters(models.CifarCNN())
    assert len(out[None]["buckets"]) == 1
    assert len(out[0.01]["buckets"]) >= 3
    for res in out.values():
        assert sum(b["numel"] for b in res["buckets"]) == n_params
        names = [n for b in res["buckets"] for n in b["params"]]
        assert sorted(names) == sorted(n for n, _ in models.CifarCNN().named_parameters())
        # a bucket's all_reduce finishes after it was launched
        assert all(b["done"] >= b["launched"] for b in res["buckets"])
    # the first bucket holds the last layer: its gradients are ready first in backward
    assert "fc3.weight" in out[0.01]["buckets"][0]["params"]


def _checkpoint_round_trip(d: Dist, path: str):
    torch.manual_seed(10 + d.rank)  # different weights on every rank before DDP
    model = models.CifarCNN()
    ddp.save_checkpoint(path, model, d, step=7)  # only rank 0 writes
    fresh = models.CifarCNN()
    state = ddp.load_checkpoint(path, fresh, d)
    return ddp.flat_params(model), ddp.flat_params(fresh), state["step"]


def test_checkpoint_saved_by_rank0_and_loaded_on_all_ranks(tmp_path):
    path = tmp_path / "ckpt.pt"
    per_rank = launch.spawn(_checkpoint_round_trip, 2, args=(str(path),))
    rank0_params = per_rank[0][0]
    for _own, loaded, step in per_rank:
        torch.testing.assert_close(loaded, rank0_params, rtol=0, atol=0)
        assert step == 7
    assert not torch.equal(per_rank[1][0], rank0_params)  # rank 1's own weights were not saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no leftover temp file


def test_set_epoch_reshuffles_and_shards_partition_the_data():
    with_epoch = launch.spawn(ddp.epoch_orders, 2, args=(10, 2, True))
    without = launch.spawn(ddp.epoch_orders, 2, args=(10, 2, False))
    for orders in (with_epoch, without):
        for epoch in range(2):
            # the two ranks' shards are disjoint and cover all 10 samples
            assert sorted(orders[0][epoch] + orders[1][epoch]) == list(range(10))
    assert with_epoch[0][0] != with_epoch[0][1]  # a new order in epoch 1
    assert without[0][0] == without[0][1]  # the same order again: set_epoch forgotten


def test_training_program_under_torchrun_reports_metrics():
    # the exact file the Slurm jobs run, started by torchrun as on a node
    import helpers.programs.train_ddp as program

    res = launch.run(program.__file__, nproc=2, name="test-train-ddp", timeout=300,
                     args=["--epochs", 1, "--max-steps", 4, "--n-train", 256, "--n-test", 40,
                           "--batch-size", 16, "--offline", "true"])  # fmt: skip
    res.raise_for_status()
    m = res.metrics
    assert (m["world_size"], m["global_batch"], m["steps"]) == (2, 32, 4)
    assert m["replica_spread"] == 0.0
    assert 0.0 <= m["test_acc"] <= 1.0 and m["samples_per_s"] > 0


def test_resume_refuses_a_checkpoint_written_by_another_number_of_ranks(tmp_path):
    # The data position is counted in this rank's batches: it means nothing at another size.
    import json

    from helpers.programs import train_ddp

    step = tmp_path / "step-00000004"
    step.mkdir()
    (step / "meta.json").write_text(json.dumps({"step": 4, "world_size": 4}))
    cfg = DDPConfig(ckpt_dir=str(tmp_path))
    with pytest.raises(ValueError, match="written by 4 rank"):
        train_ddp._resume(Dist(), cfg, None, None, None)
