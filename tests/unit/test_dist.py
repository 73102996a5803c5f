"""helpers.dist without a process group: Slurm variables, host lists, trivial answers."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import dist


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("node[03-05,09]", "node03"),
        ("gpu1,gpu2", "gpu1"),
        ("n7", "n7"),
        ("a[1-2],b[3]", "a1"),
        ("rack2-node[10,12]", "rack2-node10"),
        ("c[007]", "c007"),
    ],
)
def test_first_host(nodelist, host):
    assert dist.first_host(nodelist) == host


def test_env_from_slurm_maps_slurm_variables():
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_ID": "1234",
    }
    out = dist.env_from_slurm(env)
    assert out["RANK"] == "3" and out["WORLD_SIZE"] == "8" and out["LOCAL_RANK"] == "1"
    assert out["MASTER_ADDR"] == "localhost"
    assert out["MASTER_PORT"] == str(dist.DEFAULT_PORT + 1234)
    # Two jobs on one node get different ports.
    other = dist.env_from_slurm({**env, "SLURM_JOB_ID": "1235"})
    assert other["MASTER_PORT"] != out["MASTER_PORT"]


def test_env_from_slurm_leaves_torchrun_and_single_tasks_alone():
    base = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
    assert dist.env_from_slurm({**base, "RANK": "0"}) == {}  # torchrun already set it
    assert dist.env_from_slurm({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == {}
    assert dist.env_from_slurm({}) == {}
    kept = dist.env_from_slurm({**base, "MASTER_ADDR": "h1", "MASTER_PORT": "4000"})
    assert "MASTER_ADDR" not in kept and "MASTER_PORT" not in kept


def test_single_process_gets_trivial_answers(monkeypatch):
    for var in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
    ):
        monkeypatch.delenv(var, raising=False)
    d = dist.init()
    assert (d.rank, d.world_size, d.local_rank, d.backend) == (0, 1, 0, "none")
    assert d.is_main and not d.distributed
    assert not dist.is_initialized()
    assert (dist.rank(), dist.world_size(), dist.local_rank(), dist.is_main()) == (0, 1, 0, True)
    dist.barrier()  # no group: a no-op, not an error
    dist.cleanup()


def test_print0_and_dist_str(capsys):
    dist.print0("only once")
    assert capsys.readouterr().out == "only once\n"
    d = dist.Dist(rank=2, local_rank=0, world_size=4, backend="gloo")
    assert str(d) == "rank 2/4 (local 0) on cpu via gloo"
    assert not d.is_main and d.distributed


def test_seed_all_is_reproducible_and_rank_offset_differs():
    dist.seed_all(7)
    a = (random.random(), torch.rand(3))
    dist.seed_all(7)
    b = (random.random(), torch.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1])
    dist.seed_all(7, rank_offset=1)
    assert not torch.equal(torch.rand(3), a[1])


def test_local_rank_reads_slurm_when_torchrun_is_absent(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "3")
    assert dist.local_rank() == 3
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dist.local_rank() == 1  # torchrun's variable wins over Slurm's
