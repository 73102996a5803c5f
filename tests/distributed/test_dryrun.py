"""The dry run rejects the jobs a GPU cluster would reject, and passes the ones it would run.

Each test writes a real job directory (``helpers.cluster.job.Job``, as a notebook does) and
checks it with ``helpers.course.dryrun``: the job's program at its full size on fake tensors,
and on 2 CPU ranks on the stand-in GPU.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from helpers.cluster.job import Job
from helpers.course.dryrun import check_jobs, find_jobs, table
from helpers.parallel.sharded import zero
from helpers.programs import train_llama

# 07's job as it was written before max_seq_len followed --seq-len: the tiny config's rotary
# tables stop at 64 positions, and the job trains on sequences of 1024.
OLD_TRAIN_LLAMA = """
import runpy
from helpers.models import llama2
from helpers.programs import train_llama as T

def old_model_args(cfg):
    over = {k: getattr(cfg, k) for k in ("n_layers", "dim") if getattr(cfg, k)}
    return llama2.config(cfg.model, **over)

T._model_args = old_model_args
T.main()
"""
# The arguments 07's site jobs had when that program was current (the tiny config's widths).
OLD_ARGS_07 = ["--tp", "2", "--dim", "1024", "--n-layers", "8", "--seq-len", "1024",
               "--batch-size", "32", "--steps", "50"]  # fmt: skip
NOTEBOOK_07 = Path(__file__).resolve().parents[2] / "notebooks" / "07_fsdp_tp_llama2.ipynb"


def args_07() -> list[str]:
    """The arguments notebook 07's site jobs pass today: its ``ARGS = (...)`` in the cell that
    writes ``site_jobs``, read from the notebook, so this test cannot drift from it."""
    cells = json.loads(NOTEBOOK_07.read_text())["cells"]
    [source] = ["".join(c["source"]) for c in cells
                if c["cell_type"] == "code" and "site_jobs" in "".join(c["source"])
                and "ARGS = (" in "".join(c["source"])]  # fmt: skip
    [value] = [node.value for node in ast.parse(source).body
               if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["ARGS"]]  # fmt: skip
    return [str(a) for a in ast.literal_eval(value)]


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("WORKBOOK_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


def _rows(runs: Path, **kw):
    rows = check_jobs(find_jobs(runs), **kw)
    print(table(rows))
    return rows


def test_07s_old_arguments_fail_at_full_size_naming_the_line(runs, tmp_path):
    program = tmp_path / "train_llama_before.py"
    program.write_text(OLD_TRAIN_LLAMA)
    Job("fsdp-tp-llama2", program, nodes=1, gpus_per_node=4, profile="jean-zay",
        values={"project": "abc"}, args=OLD_ARGS_07).write()  # fmt: skip
    rows = _rows(runs, all_gpus=False)
    assert len(rows) == 1 and not rows[0].ok
    assert "ValueError: sequence of 1024 tokens > max_seq_len=64" in rows[0].reached
    assert "helpers/models/llama2.py" in rows[0].reached  # the workbook line that raised


def test_07s_job_now_builds_on_the_meta_device_and_fits(runs):
    """07's site job as the notebook writes it now, on 2 nodes x 4 A100-40GB (TP 2 x FSDP 4,
    bf16 compute): it builds on the meta device and fits."""
    Job("fsdp-tp-llama2", Path(train_llama.__file__), nodes=2, gpus_per_node=4,
        profile="perlmutter", values={"account": "m0000_g"}, args=args_07()).write()  # fmt: skip
    (row,) = _rows(runs)
    assert row.ok, row
    assert row.reached == "step" and row.strict == "ok"
    assert "of 40 GiB" in row.gpu_mem and row.gpu == "A100-SXM4-40GB"


def test_a_model_that_does_not_fit_its_gpus_is_rejected(runs):
    """Llama 2 70B with plain FSDP (no TP) on 2 nodes x 4 A100-40GB: 1 sequence of 4,096
    tokens per GPU. Its sharded weights and gradients alone take 64 GiB a GPU."""
    Job("llama70b-fsdp", Path(train_llama.__file__), nodes=2, gpus_per_node=4,
        profile="perlmutter", values={"account": "m0000_g"},
        args=["--model", "70B", "--tp", "1", "--seq-len", "4096", "--batch-size", "8"]).write()  # fmt: skip
    (row,) = _rows(runs, timeout=600)
    assert not row.ok and "DOES NOT FIT" in row.gpu_mem, row
    peak = float(row.gpu_mem.split()[0])
    assert peak > 64  # at least the fp32 shards of weights and gradients: 69 B x 8 B / 8
    assert row.reached == "step" and row.strict == "ok"  # it runs; it just does not fit


# train_llama's build() before the meta device: every rank made and initialised the whole
# model on the host, then moved it to its GPU, and only then sharded it.
OLD_BUILD = """
from helpers.models import llama2
from helpers.parallel.composed import llama_parallel
from helpers.parallel.composed.mesh import ParallelDims
from helpers.programs import train_llama as T

def old_build(d, cfg):
    dims = ParallelDims(dp=-1, tp=cfg.tp, world_size=d.world_size)
    mesh = dims.build_mesh(d.device.type, names=("dp", "tp"))
    model = llama2.Transformer(T._model_args(cfg)).init_weights(cfg.seed).to(d.device)
    llama_parallel.apply_tp(model, mesh["tp"], cfg.loss_parallel)
    llama_parallel.apply_fsdp(model, mesh["dp"])
    return dims, mesh, model

T.build = old_build
T.main()
"""
ARGS_7B = ["--model", "7B", "--tp", "2", "--seq-len", "1024", "--batch-size", "8", "--steps", "2"]


def test_7b_is_built_on_the_meta_device_not_in_host_memory(runs, tmp_path):
    """Engaging, 1 node x 4 GPUs, --mem=80GB (20 GB per GPU). Building the whole model on every
    rank's host needs 4 x 27 GB; built on the meta device, each rank holds only the largest full
    parameter at a time while it initialises its shards."""
    old = tmp_path / "train_llama_before.py"
    old.write_text(OLD_BUILD)
    site = dict(
        nodes=1, gpus_per_node=4, profile="engaging", values={"env": "E", "gpu_type": "h200"}
    )
    Job("llama7b-host", old, args=ARGS_7B, **site).write()
    Job("llama7b-meta", Path(train_llama.__file__), args=ARGS_7B, **site).write()
    rows = {r.job: r for r in _rows(runs, all_gpus=False)}
    before, after = rows["llama7b-host"], rows["llama7b-meta"]
    # stopped where the host memory ran out: while initialising the whole model
    assert not before.ok and "MemoryLimit: cpu memory of this rank reached" in before.reached
    assert "init_weights" in before.reached and "--mem=80GB over 4 ranks" in before.reached
    assert after.ok, after
    assert float(after.host_mem.split()[0]) < 4 * 4  # 4 ranks: the process and one parameter


# --------------------------------------------------------------------------- DeepSpeed

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
HOST_TENSOR_IN_DEEPSPEED = """
import deepspeed
import torch
from helpers import dist

d = dist.init()
deepspeed.init_distributed(dist_backend=d.backend)
deepspeed.comm.all_reduce(torch.ones(4))  # a host tensor: NCCL refuses it
"""


def _written_by(notebook: str, target: str) -> str:
    """The program a notebook's ``%%writefile target`` cell writes (as the notebook has it now)."""
    for cell in json.loads((NOTEBOOKS / notebook).read_text())["cells"]:
        source = "".join(cell["source"])
        if source.startswith(f"%%writefile {target}\n"):
            return source.split("\n", 1)[1]
    raise LookupError(f"{notebook} has no %%writefile {target} cell")


def _ds_zero_job(tmp_path: Path, nodes: int, world_size: int | None) -> None:
    """04's DeepSpeed job: ZeRO-3, bf16, Adam offloaded to the host (DeepSpeed's CPU Adam)."""
    program = tmp_path / "ds_zero.py"
    program.write_text(_written_by("04_fsdp_zero.ipynb", "programs/ds_zero.py"))
    config = tmp_path / "ds_config_gpu.json"
    config.write_text(json.dumps(zero.deepspeed_config(3, 8, world_size, 1e-4, gpu=True)))
    Job("ds-zero", program, nodes=nodes, gpus_per_node=4, profile="engaging", launcher="deepspeed",
        values={"env": "x"}, files=[config], args=("--deepspeed_config", config.name)).write()  # fmt: skip


def test_a_deepspeed_batch_stated_for_one_node_fails_on_two(runs, tmp_path):
    """train_batch_size 32 = 8 x 1 x 4 GPUs: DeepSpeed refuses it on 8 GPUs, and so does the check."""
    _ds_zero_job(tmp_path, nodes=2, world_size=4)
    (row,) = _rows(runs, all_gpus=False)
    assert not row.ok and row.ranks == 8
    assert "32 != 8 * 1 * 8" in row.reached and "deepspeed.initialize" in row.reached


def test_deepspeed_zero3_with_offload_is_checked_at_full_size_and_device_strict(runs, tmp_path):
    _ds_zero_job(tmp_path, nodes=2, world_size=None)  # DeepSpeed computes the batch
    (row,) = _rows(runs, all_gpus=False)
    assert row.ok, row
    assert row.reached == "step" and row.strict == "ok" and row.ranks == 8


def test_a_host_tensor_in_a_deepspeed_collective_fails_device_strict(runs, tmp_path):
    program = tmp_path / "host_tensor.py"
    program.write_text(HOST_TENSOR_IN_DEEPSPEED)
    Job(
        "ds-host", program, nodes=1, gpus_per_node=2, profile="engaging", values={"env": "x"}
    ).write()
    (row,) = _rows(runs, all_gpus=False)
    assert not row.ok
    assert "No backend type associated with device type cpu" in row.strict
    assert "deepspeed.comm.all_reduce" in row.strict  # the program's line


def test_a_program_that_makes_its_own_process_group_is_refused_naming_the_line(runs, tmp_path):
    """05's DeepSpeed program once called deepspeed.init_distributed("gloo") itself: its
    tensors never met the stand-in GPU, and the check passed it unchecked."""
    program = tmp_path / "own_group.py"
    program.write_text("import torch.distributed as tdist\ntdist.init_process_group('gloo')\n")
    Job(
        "own-group", program, nodes=1, gpus_per_node=2, profile="engaging", values={"env": "x"}
    ).write()
    (row,) = _rows(runs, all_gpus=False, timeout=60)
    assert not row.ok
    for text in (row.reached, row.strict):
        assert "not through helpers.dist.init()" in text and "program.py:2" in text, text


# --------------------------------------------------------------------------- as CUDA runs it

MIXED_PARAMETERS = """
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from helpers import dist

with dist.session() as d:
    mesh = init_device_mesh(d.device.type, (d.world_size,))
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 4)).to(d.device)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # DTensors and a plain Linear
    for _ in range(2):
        model(torch.randn(2, 8, device=d.device)).sum().backward()
        opt.step()
        opt.zero_grad()
"""


def test_a_foreach_optimizer_over_mixed_dtensor_and_plain_parameters_fails_naming_the_line(
    runs, tmp_path
):
    """06's TP decoder crashed on the H100 at its first AdamW step: CUDA's optimizers default
    to foreach, which refuses a list mixing DTensors and plain tensors; CPU ranks took the
    per-tensor loop, and the dry run passed it."""
    program = tmp_path / "mixed.py"
    program.write_text(MIXED_PARAMETERS)
    Job("tp-mixed", program, nodes=1, gpus_per_node=2, profile="engaging",
        values={"env": "x"}).write()  # fmt: skip
    (row,) = _rows(runs, all_gpus=False, timeout=120)
    assert not row.ok
    for text in (row.reached, row.strict):
        assert "_foreach_mul_.Scalar got mixed torch.Tensor and DTensor" in text, text
        assert "program.py:15: opt.step()" in text, text


GPU_SIZED = """
import torch
from helpers import devices, dist

with dist.session() as d:
    seq = 1 << 18 if devices.gpu_sized(d.device) else 256  # a GPU's sequence, a laptop's
    q = torch.randn(seq, 64, device=d.device)
    scores = q @ q.T  # seq x seq fp32: 256 GiB at the GPU's size
    print(scores.shape)
"""


def test_gpu_sizes_that_do_not_fit_fail_naming_the_line(runs, tmp_path):
    """lab 7's bench chose 32,768 tokens on a GPU and 1,024 elsewhere; the dry run took the
    laptop's and said it fit. The full-size run takes the GPU's sizes (helpers.devices.gpu_sized)
    and names the line where the rank's GPU memory ran out; the strict run takes the laptop's."""
    program = tmp_path / "gpu_sized.py"
    program.write_text(GPU_SIZED)
    Job("gpu-sized", program, nodes=1, gpus_per_node=1, profile="jean-zay",
        values={"project": "abc"}).write()  # fmt: skip
    rows = _rows(runs, timeout=120)
    assert {r.gpu for r in rows} >= {"H100-SXM5-80GB"}, rows
    for row in rows:
        assert not row.ok and row.strict == "ok", row
        assert float(row.gpu_mem.split()[0]) >= 256, row
        assert "DOES NOT FIT: out of memory at program.py:8: scores = q @ q.T" in row.gpu_mem


def test_the_full_size_run_ignores_workbook_small_from_its_parent(monkeypatch):
    """A checking process with $WORKBOOK_SMALL set (a SMOKE run) handed it to its fake ranks."""
    from helpers.course.dryrun import child

    env = dict(os.environ, WORKBOOK_SMALL="1")
    monkeypatch.setattr(os, "environ", env)
    spec = {"mode": "fake", "rank": 0, "world": 8, "result": "/tmp/r.json"}
    child._environment(spec)
    assert "WORKBOOK_SMALL" not in env and env["WORKBOOK_DEVICE_CHECK"] == "fake"
    child._environment(dict(spec, mode="strict", small=True))
    assert env["WORKBOOK_SMALL"] == "1"


# 04's DeepSpeed program as it was (commit 9db29a8), cut to its first forward: with the GPU
# config (bf16) DeepSpeed casts the model to bf16, and the inputs only for fp16.
OLD_DS_ZERO = """
import argparse
import json
import os

import deepspeed
import torch
import torch.nn.functional as F
from torch import nn
from helpers import dist

ap = deepspeed.add_config_arguments(argparse.ArgumentParser())
args = ap.parse_args()
d = dist.init()
deepspeed.init_distributed(dist_backend=d.backend)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 384), nn.ReLU(), nn.Linear(384, 10))
engine, *_ = deepspeed.initialize(model=model.to(d.device), config=json.load(open(args.deepspeed_config)))
xs, ys = torch.randn(8, 64).to(d.device), torch.randint(0, 10, (8,)).to(d.device)
loss = F.cross_entropy(engine(xs), ys)
engine.backward(loss)
engine.step()
"""


def test_04s_deepspeed_gpu_job_as_it_was_fails_on_fp32_inputs_and_bf16_weights(runs, tmp_path):
    """On the GPU: 'mat1 and mat2 must have the same dtype' at the first forward. Fake mode's
    shape functions do not look at dtypes, and on the stand-in DeepSpeed's cast
    (``p.data = p.data.to(bf16)``) never reached the data: both passed it."""
    program = tmp_path / "ds_zero.py"
    program.write_text(OLD_DS_ZERO)
    config = tmp_path / "ds_config_gpu.json"
    config.write_text(json.dumps(zero.deepspeed_config(3, 8, None, 1e-4, gpu=True)))
    Job("ds-zero-old", program, nodes=1, gpus_per_node=2, profile="engaging", launcher="deepspeed",
        values={"env": "x"}, files=[config], args=("--deepspeed_config", config.name)).write()  # fmt: skip
    (row,) = _rows(runs, all_gpus=False, timeout=300)
    assert not row.ok
    for text in (row.reached, row.strict):
        assert "mat1 and mat2 must have the same dtype, but got Float and BFloat16" in text, text
        assert "program.py:20: loss = F.cross_entropy(engine(xs), ys)" in text, text


# --------------------------------------------------------------------------- NCCL's order

RING_JOB = """
import sys
import torch
import torch.distributed as tdist
from helpers import dist

with dist.session() as d:
    n, r = d.world_size, d.rank
    out, into = torch.ones(1024, device=d.device), torch.empty(1024, device=d.device)
    for _ in range(2):
        if sys.argv[1] == "send-first":
            tdist.send(out, (r + 1) % n)
            tdist.recv(into, (r - 1) % n)
        else:
            req = tdist.isend(out, (r + 1) % n)
            tdist.recv(into, (r - 1) % n)
            req.wait()
"""


def test_a_ring_that_hangs_nccl_fails_at_its_full_size(runs, tmp_path):
    """On 4 GPUs a ring whose every rank sends (blocking) before it receives hangs: each
    rank's recv waits for its own send, which waits for its neighbour's recv. The dry run
    sees only ranks 0 and 3 of the job, finds them doing the same, and runs NCCL's model on
    all 4 (tests/distributed/test_standin_order.py refuses isend-then-recv on 2 real ranks)."""
    program = tmp_path / "ring.py"
    program.write_text(RING_JOB)
    Job("ring", program, nodes=1, gpus_per_node=4, profile="engaging", values={"env": "x"},
        args=["send-first"]).write()  # fmt: skip
    (row,) = _rows(runs, all_gpus=False, timeout=120)
    assert not row.ok and "FAILS on 4 ranks under NCCL's order" in row.reached, row
    assert "rank 0's send to 1 (program.py:12: tdist.send(out, (r + 1) % n))" in row.reached
    assert row.strict.startswith("FAILS on 2 ranks: rank ") and "no rank will post" in row.strict
