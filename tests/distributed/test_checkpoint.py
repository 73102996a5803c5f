"""Preemption-safe training: atomic checkpoints, keep-last-K, and resumes that end bit-identical.

The training runs are the real program (helpers/programs/train_ddp.py) on 2 gloo
ranks under torchrun, with deterministic settings on CPU: a run that is killed
and resumed must end with the same parameters, bit for bit (sha256 of the flat
parameter vector), as one that never stopped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import helpers.programs.train_ddp as program
from helpers import launch, runs
from helpers.dist import Dist
from helpers.parallel.sharded import checkpoint

# 256 samples, 16 per rank, 2 ranks: 8 steps per epoch, 16 in all.
ARGS = ["--epochs", 2, "--n-train", 256, "--n-test", 40, "--batch-size", 16,
        "--offline", "true", "--deterministic", "true", "--evaluate", "false"]  # fmt: skip
STEPS = 16


def _tiny():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # momentum buffers exist: the optimizer has state to save
    return model, opt


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


# --------------------------------------------------------------------------- one process


def test_save_keeps_last_k_and_load_restores_model_optimizer_and_rng(tmp_path):
    model, opt = _tiny()
    d = Dist()
    for step in (1, 2, 3, 4):
        checkpoint.save(tmp_path, step, model, opt, d, data={"epoch": 0, "offset": step},
                        rank_state={"losses": [0.5] * step}, keep=2)  # fmt: skip
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    want, momentum = _flat(model).clone(), opt.state[model[0].weight]["momentum_buffer"].clone()
    random_after_save = torch.rand(3)

    with torch.no_grad():  # spoil everything the checkpoint must bring back
        for p in model.parameters():
            p.add_(1.0)
    opt.state[model[0].weight]["momentum_buffer"].zero_()
    ckpt = checkpoint.load(checkpoint.latest(tmp_path), model, opt, d)
    assert torch.equal(_flat(model), want)
    assert torch.equal(opt.state[model[0].weight]["momentum_buffer"], momentum)
    assert (ckpt.step, ckpt.data["offset"], ckpt.rank_state["losses"]) == (4, 4, [0.5] * 4)
    checkpoint.set_rng_state(ckpt.rng)
    assert torch.equal(torch.rand(3), random_after_save)  # the generator is where it was
    with pytest.raises(ValueError, match="keep must be >= 1"):
        checkpoint.save(tmp_path, 5, model, opt, d, keep=0)


# Saves step 1, then dies (SIGKILL) while saving step 2, at the first rename whose
# source name starts with sys.argv[2]: "." dies inside DCP's writing of the shards
# (it renames its own temporary files), ".tmp-step" after every file was written,
# just before the rename that makes the checkpoint exist.
DIES_MID_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import torch
    from helpers.dist import Dist
    from helpers.parallel.sharded import checkpoint

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint.save(sys.argv[1], 1, model, opt, Dist())
    with torch.no_grad():
        model.weight.add_(1.0)
    rename = Path.rename
    def dying_rename(self, target):
        if self.name.startswith(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(self, target)
    Path.rename = dying_rename
    checkpoint.save(sys.argv[1], 2, model, opt, Dist())
    """
)


@pytest.mark.parametrize("dies_at", [".", ".tmp-step"], ids=["writing-shards", "before-rename"])
def test_a_checkpoint_interrupted_mid_write_is_never_loaded(tmp_path, dies_at):
    script = tmp_path / "dies.py"
    script.write_text(DIES_MID_SAVE)
    env = {**os.environ, "PYTHONPATH": launch.workbook_pythonpath(os.environ.get("PYTHONPATH"))}
    ckpt_dir = tmp_path / "ckpt"
    proc = subprocess.run(
        [sys.executable, str(script), str(ckpt_dir), dies_at], env=env, timeout=120
    )
    assert proc.returncode == -9  # it really died mid-save
    half = ckpt_dir / ".tmp-step-00000002"
    assert half.is_dir() and not (ckpt_dir / "step-00000002").exists()
    # Before the rename every file is there, meta.json included: only the name is missing.
    assert (half / "meta.json").is_file() == (dies_at == ".tmp-step")
    # A directory that looks complete by name but lacks meta.json is not trusted either.
    (ckpt_dir / "step-00000003" / "state").mkdir(parents=True)
    assert checkpoint.latest(ckpt_dir).name == "step-00000001"

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    want = _flat(model).clone()
    with torch.no_grad():
        model.weight.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert checkpoint.load(checkpoint.latest(ckpt_dir), model, opt, Dist()).step == 1
    assert torch.equal(_flat(model), want)  # step 1's weights, not the half-saved step 2's
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        checkpoint.load(half, model, opt, Dist())
    checkpoint.save(ckpt_dir, 4, model, opt, Dist())
    assert not half.exists()  # the next save clears what the dead job left


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the same training, never stopped (it checkpoints too)."""
    ckpt = tmp_path_factory.mktemp("ref") / "ckpt"
    res = launch.run(program.__file__, nproc=2, name="test-ckpt-ref", timeout=300,
                     args=[*ARGS, "--ckpt-dir", ckpt], stream=False)  # fmt: skip
    res.raise_for_status()
    assert res.metrics["steps"] == STEPS and res.metrics["resumed_at"] == []
    return res.metrics


def test_killed_rank_ends_the_launch_and_the_rerun_resumes_bit_identical(tmp_path, uninterrupted):
    ckpt = tmp_path / "ckpt"
    args = [*ARGS, "--ckpt-dir", ckpt, "--ckpt-every", 4, "--crash-at-step", 6]
    crashed = launch.run(program.__file__, nproc=2, name="test-ckpt-crash", timeout=300,
                         args=args, stream=False)  # fmt: skip
    # Rank 1 SIGKILLed itself after step 6: the launch ends, names it, within 30 s.
    killed_at = float(re.search(r"killing myself .* at ([\d.]+)", crashed.logs[1]).group(1))
    ended_after = time.time() - killed_at
    assert ended_after < 30, f"the launch took {ended_after:.0f} s to end after the kill"
    assert not crashed.ok and not crashed.timed_out and crashed.failed_rank == 1
    assert "SIGKILL" in crashed.traceback
    assert crashed.metrics is None or "params_sha256" not in crashed.metrics
    assert [p.name for p in checkpoint.checkpoints(ckpt)] == ["step-00000004"]

    resumed = launch.run(program.__file__, nproc=2, name="test-ckpt-crash", timeout=300,
                         args=args, stream=False)  # fmt: skip
    resumed.raise_for_status()
    m = resumed.metrics
    assert m["resumed_at"] == [4]
    assert m["loss"] == uninterrupted["loss"]  # every step's loss, the 4 before the crash too
    assert m["params_sha256"] == uninterrupted["params_sha256"]
    assert [p.name for p in checkpoint.checkpoints(ckpt)] == ["step-00000012", "step-00000016"]


def test_torchrun_elastic_restart_resumes_from_the_last_checkpoint(tmp_path, uninterrupted):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.json"
    cmd = launch.torchrun_command(
        program.__file__, 2, rdzv_endpoint=f"localhost:{launch.free_port()}",
        exe=[sys.executable, "-m", "torch.distributed.run"], options=["--max-restarts=1"],
        args=[*ARGS, "--ckpt-dir", ckpt, "--ckpt-every", 4, "--crash-at-step", 10],
    )  # fmt: skip
    # Without this torchrun's restarted ranks can read the dead ranks' addresses from the
    # store they share with its rendezvous (pytorch/pytorch#135712): gloo then fails to connect.
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "OMP_NUM_THREADS": str(launch.threads_per_rank(2)),
           runs.METRICS_ENV: str(metrics),
           "PYTHONPATH": launch.workbook_pythonpath(os.environ.get("PYTHONPATH"))}  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "killing myself (SIGKILL) after step 10" in out  # the first attempt did die
    m = runs.read_metrics(metrics)
    assert m["resumed_at"] == [8]  # torchrun restarted both ranks; they went on from step 8
    assert m["loss"] == uninterrupted["loss"]
    assert m["params_sha256"] == uninterrupted["params_sha256"]


# --------------------------------------------------------------------------- FSDP


def test_fsdp_sharded_checkpoint_resumes_bit_identical(tmp_path):
    """FSDP2: each rank writes only its own shards (DCP), and reads them back."""
    fsdp_args = [*ARGS, "--sync", "fsdp"]
    ref = launch.run(program.__file__, nproc=2, name="test-ckpt-fsdp", timeout=300,
                     args=fsdp_args, stream=False)  # fmt: skip
    ref.raise_for_status()
    ckpt = tmp_path / "ckpt"
    args = [*fsdp_args, "--ckpt-dir", ckpt, "--ckpt-every", 4, "--crash-at-step", 6]
    crashed = launch.run(program.__file__, nproc=2, name="test-ckpt-fsdp", timeout=300,
                         args=args, stream=False)  # fmt: skip
    assert not crashed.ok and crashed.failed_rank == 1
    shards = sorted(p.name for p in (checkpoint.latest(ckpt) / "state").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # one file per rank: its own shards
    resumed = launch.run(program.__file__, nproc=2, name="test-ckpt-fsdp", timeout=300,
                         args=args, stream=False)  # fmt: skip
    resumed.raise_for_status()
    m = resumed.metrics
    assert m["resumed_at"] == [4] and m["steps"] == STEPS
    assert m["loss"] == ref.metrics["loss"]
    assert m["params_sha256"] == ref.metrics["params_sha256"]


def test_a_deterministic_run_steps_on_a_gpu(tmp_path, monkeypatch):
    """``--deterministic true`` on a GPU: torch refuses cuBLAS under deterministic algorithms
    unless ``$CUBLAS_WORKSPACE_CONFIG`` fixes its workspace, and the program sets it. One rank
    on the stand-in GPU (device-strict: it refuses what CUDA refuses), 2 steps."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv(runs.RUNS_ENV, str(tmp_path / "runs"))
    args = [*ARGS, "--max-steps", 2, "--epochs", 1]
    res = launch.run(program.__file__, nproc=1, name="test-deterministic-gpu", timeout=120,
                     args=args, env={"WORKBOOK_DEVICE_CHECK": "strict"}, stream=False)  # fmt: skip
    assert res.ok, res.traceback
    assert res.metrics["steps"] == 2
