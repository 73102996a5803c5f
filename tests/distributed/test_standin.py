"""The stand-in GPU: programs that would fail on GPUs with NCCL fail here, on CPU ranks.

Each test runs a real program on 2 real CPU ranks (``helpers.course.dryrun.runner``) with
``d.device`` a stand-in GPU whose process group, like NCCL, takes device tensors only.
A correct program gives the same numbers as on plain gloo ranks.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from helpers.course.dryrun.runner import run_ranks

HOST_TENSOR_IN_COLLECTIVE = """
import torch
import torch.distributed as tdist
from helpers import dist

d = dist.init()
x = torch.tensor([float(d.rank)])   # notebook 00's program before the fix: left on the host
tdist.all_reduce(x)
print(x.item())
dist.cleanup()
"""

HOST_BATCH_INTO_DEVICE_MODEL = """
import torch
from torch import nn
from helpers import dist

with dist.session() as d:
    model = nn.Linear(8, 4).to(d.device)
    batch = torch.randn(16, 8)   # never moved to d.device
    loss = model(batch).sum()
"""


def _program(tmp_path: Path, text: str, name: str = "program.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _only_failure(results):
    bad = [r for r in results if not r["ok"]]
    assert bad, f"expected a failure, every rank passed: {results}"
    return bad[0]


def test_a_host_tensor_in_a_collective_fails_as_nccl_fails(tmp_path):
    results = run_ranks(_program(tmp_path, HOST_TENSOR_IN_COLLECTIVE), [], "strict", 2, timeout=120)
    bad = _only_failure(results)
    assert "No backend type associated with device type cpu" in bad["error"]
    assert bad["program_line"] == "program.py:8: tdist.all_reduce(x)"  # the line, named


def test_a_host_batch_fed_to_a_model_on_the_device_fails(tmp_path):
    results = run_ranks(_program(tmp_path, HOST_BATCH_INTO_DEVICE_MODEL), [], "strict", 2,
                        timeout=120)  # fmt: skip
    bad = _only_failure(results)
    assert "Expected all tensors to be on the same device" in bad["error"]
    assert bad["program_line"] == "program.py:9: loss = model(batch).sum()"


COLLECTIVE_HELPERS = """
import torch
from torch import nn
from helpers import dist, runs
from helpers.parallel.collectives import collectives
from helpers.parallel.data import federated

with dist.session() as d:
    demo = collectives.demo_collectives(d)
    trace = collectives.ring_trace(d)
    sizes = collectives.measure(d, [4096], repeats=2)
    pong = collectives.pingpong(d, [4096], repeats=2, warmup=1)
    torch.manual_seed(0)
    model = nn.Linear(4, 2).to(d.device)
    total = federated.weighted_average(d, model, n_samples=10 + d.rank)
    runs.write_metrics({"all_reduce": demo["all_reduce"][1], "ring_equal": trace["equal"],
                        "rows": len(sizes) + len(pong), "total": total})
"""


def test_the_collective_helpers_keep_their_tensors_on_the_device(tmp_path):
    # collectives.measure / pingpong / demo / ring_trace and federated.weighted_average made
    # their tensors on the host before: NCCL would refuse every one of them.
    results = run_ranks(_program(tmp_path, COLLECTIVE_HELPERS), [], "strict", 2, timeout=180)
    assert all(r["ok"] for r in results), [r.get("error") for r in results]


def test_fsdp_and_tp_train_on_the_stand_in_gpu_with_the_losses_of_plain_gloo():
    """train_llama (meta init, TP x FSDP) runs device-strict, and learns exactly as on gloo."""
    from helpers import launch
    from helpers.programs import train_llama as T

    # fp32: the stand-in claims an H100, where --dtype auto would compute in bf16
    args = ["--tp", "2", "--steps", "3", "--batch-size", "4", "--seq-len", "16", "--dtype", "fp32"]
    strict = run_ranks(Path(T.__file__), args, "strict", 2, timeout=240, max_steps=10)
    assert all(r["ok"] for r in strict), [r.get("error") for r in strict]
    cfg = T.LlamaConfig(tp=2, steps=3, batch_size=4, seq_len=16)
    plain = launch.spawn(T.train, world_size=2, args=(cfg,))[0]
    assert strict[0]["metrics"]["losses"] == pytest.approx(plain["losses"], abs=1e-5)
    assert strict[0]["metrics"]["device"] == "stand-in h100"


# --------------------------------------------------------------------------- CUDA's choices

CUDA_CHOICES = """
import torch
from torch import nn
from torch.optim import adam
from torch.utils.data import DataLoader, TensorDataset
from helpers import dist, runs

taken = []
for kind in ("_single_tensor_adam", "_multi_tensor_adam", "_fused_adam"):
    def spy(*args, _kind=kind, _run=getattr(adam, kind), **kwargs):
        taken.append(_kind.split("_")[1])
        return _run(*args, **kwargs)
    setattr(adam, kind, spy)

with dist.session() as d:
    for options in ({}, {"foreach": False}, {"fused": True}):
        model = nn.Linear(4, 2).to(d.device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, **options)
        model(torch.randn(3, 4, device=d.device)).sum().backward()
        opt.step()
    batches = DataLoader(TensorDataset(torch.randn(6, 4)), batch_size=3, pin_memory=True)
    pinned = [x.is_pinned() for (x,) in batches]
    moved = [x.to(d.device, non_blocking=True).sum().item() for (x,) in batches]
    held = torch.randn(4).pin_memory()  # FSDP2's offload pins once, then asks before each copy
    pinned += [held.is_pinned(), held[1:].is_pinned(), not torch.randn(4).is_pinned()]
    rows = torch.ones(4, 3, device=d.device)[torch.arange(2)]  # host indices: CUDA takes them
    try:
        torch.ones(2, device=d.device).pin_memory()
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    runs.write_metrics({"taken": taken, "pinned": pinned, "pinned_batches": len(moved), "rows": len(rows), "refused": refused,
                        "autocast": str(torch.get_autocast_dtype(d.device.type))})
"""


def test_the_stand_in_takes_cudas_optimizer_and_loader_paths(tmp_path):
    """On CUDA, AdamW's default is its foreach implementation (the CPU's is the per-tensor
    loop); foreach=False and fused=True are obeyed; a loader pins host batches, a pinned copy
    says it is pinned, and a device tensor cannot be pinned; autocast defaults to float16."""
    (result,) = run_ranks(
        _program(tmp_path, CUDA_CHOICES), [], "strict", 1, timeout=120, max_steps=10
    )
    assert result["ok"], result.get("error")
    metrics = result["metrics"]
    assert metrics["taken"] == ["multi", "single", "fused"]  # default, foreach=False, fused=True
    assert metrics["pinned_batches"] == 2 and metrics["rows"] == 2
    assert metrics["pinned"] == [True] * 5  # batches, a pinned copy and its view; not a fresh one
    assert "only dense CPU tensors can be pinned" in metrics["refused"]
    assert metrics["autocast"] == "torch.float16"


DETERMINISTIC = """
import os
import sys
import torch
from helpers import dist

if sys.argv[1:] == ["set"]:
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
torch.use_deterministic_algorithms(True)
with dist.session() as d:
    layer = torch.nn.Linear(4, 2).to(d.device)
    out = layer(torch.randn(3, 4, device=d.device))
"""


def test_deterministic_algorithms_need_cublas_workspace_config_as_on_cuda(tmp_path):
    """torch 2.6's CUDA refuses a Linear under use_deterministic_algorithms(True) unless
    CUBLAS_WORKSPACE_CONFIG is :4096:8 or :16:8 (the CPU never asks)."""
    program = _program(tmp_path, DETERMINISTIC)
    (unset,) = run_ranks(program, [], "strict", 1, timeout=120)
    assert not unset["ok"] and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in unset["error"]
    assert unset["program_line"] == "program.py:12: out = layer(torch.randn(3, 4, device=d.device))"
    (given,) = run_ranks(program, ["set"], "strict", 1, timeout=120)
    assert given["ok"], given.get("error")


CUDA_REFUSALS = """
import sys
import torch
from torch.utils.data import DataLoader, Dataset
from helpers import dist, runs

class OnDevice(Dataset):  # each sample made on the device: in a forked worker
    def __init__(self, device):
        self.device = device
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.full((2,), float(i), device=self.device)

d = dist.init()
model = torch.nn.Linear(2, 2).to(d.device)  # the rank has used its device
if sys.argv[1] == "host-generator":
    x = torch.randn(3, device=d.device, generator=torch.Generator().manual_seed(0))
elif sys.argv[1] == "device-generator":
    g = torch.Generator(device=d.device).manual_seed(0)
    x = torch.randn(3, device=d.device, generator=g)
    runs.write_metrics({"generator": str(g.device), "draw": str(x.device)})
elif sys.argv[1] == "workers":
    batches = list(DataLoader(OnDevice(d.device), batch_size=2, num_workers=2))
dist.cleanup()
"""


def test_cudas_refusals_a_host_generator_and_the_device_in_forked_workers(tmp_path):
    """CUDA refuses a device draw from a host generator ("Expected a 'cuda' device type for
    generator"), and any device use in a DataLoader worker forked from a rank that used its
    GPU ("Cannot re-initialize CUDA in forked subprocess"), where the CPU takes both. A
    generator made on the device draws there."""
    program = _program(tmp_path, CUDA_REFUSALS)
    (host,) = run_ranks(program, ["host-generator"], "strict", 1, timeout=120)
    assert not host["ok"], host
    assert "Expected a 'gpu' device type for generator but found 'cpu'" in host["error"]
    assert "torch.Generator(device=d.device)" in host["error"]  # the fix
    assert host["program_line"].startswith("program.py:18: x = torch.randn(3, device=d.device")
    (device,) = run_ranks(program, ["device-generator"], "strict", 1, timeout=120)
    assert device["ok"], device.get("error")
    assert device["metrics"] == {"generator": "gpu:0", "draw": "gpu:0"}
    (workers,) = run_ranks(program, ["workers"], "strict", 1, timeout=120)
    assert not workers["ok"], workers
    assert "Caught RuntimeError in DataLoader worker process" in workers["error"]
    assert "Cannot re-initialize CUDA in forked subprocess" in workers["error"]
    assert "move the batch to d.device in the training loop" in workers["error"]  # the fix


DEVICE_TYPE_CHECK = """
import torch
from helpers import dist

d = dist.init()
pin = d.device.type == "cuda"  # the stand-in's type is "gpu": the CPU's branch, unchecked
"""


def test_a_program_that_compares_its_device_with_cuda_is_refused_naming_the_line(tmp_path):
    (result,) = run_ranks(_program(tmp_path, DEVICE_TYPE_CHECK), [], "fake", 2, [0], timeout=60)
    assert not result["ok"], result
    assert result["program_line"].startswith('program.py:6: pin = d.device.type == "cuda"')
    assert "ask helpers.devices" in result["error"].lower(), result["error"]
    assert "devices.is_gpu(d.device)" in result["error"]


EVENTS = """
import sys
import torch
from helpers import dist

d = dist.init()
x = torch.randn(64, 64, device=d.device)
start, end = torch.gpu.Event(enable_timing=True), torch.gpu.Event(enable_timing=True)
start.record()
y = x @ x
end.record()
if sys.argv[1] == "synchronize":
    dist.synchronize(d.device)
ms = start.elapsed_time(end)
"""


def test_cuda_events_are_read_only_after_the_host_waited_for_them(tmp_path):
    """CUDA raises "device not ready" when elapsed_time reads an end event still queued
    behind the work it times; after dist.synchronize (or end.synchronize()) it answers."""
    program = _program(tmp_path, EVENTS)
    (early,) = run_ranks(program, ["no"], "strict", 1, timeout=120)
    assert not early["ok"] and "CUDA error: device not ready" in early["error"], early
    assert early["program_line"] == "program.py:14: ms = start.elapsed_time(end)"
    (waited,) = run_ranks(program, ["synchronize"], "strict", 1, timeout=120)
    assert waited["ok"], waited.get("error")
