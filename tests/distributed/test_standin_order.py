"""The stand-in GPU keeps NCCL's order: what would hang or mix up the data on GPUs fails here.

Each test runs a real program on 2 real CPU ranks, device-strict (``helpers.course.dryrun``),
where gloo alone would let every one of these programs pass: gloo lets an ``isend`` go out
before its receive is posted, and some mismatched collectives complete on it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers.course.dryrun.runner import run_ranks

RING_STEP = """
import sys
import torch
import torch.distributed as tdist
from helpers import dist, runs

d = dist.init()
n, r = d.world_size, d.rank
right, left = (r + 1) % n, (r - 1) % n
out, into = torch.full((4,), float(r), device=d.device), torch.empty(4, device=d.device)
for step in range(2):
    if sys.argv[1] == "two-calls":
        req = tdist.isend(out, right)
        tdist.recv(into, left)
        req.wait()
    elif sys.argv[1] == "batch":
        reqs = tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, out, right),
                                        tdist.P2POp(tdist.irecv, into, left)])
        for req in reqs:
            req.wait()
    elif r % 2 == 0:  # parity: even ranks send first
        tdist.send(out, right)
        tdist.recv(into, left)
    else:
        tdist.recv(into, left)
        tdist.send(out, right)
    out = into.clone()
runs.write_metrics({"got": into.tolist()})
dist.cleanup()
"""

COLLECTIVES = """
import sys
import torch
import torch.distributed as tdist
from helpers import dist

d = dist.init()
x = torch.ones(4 + 4 * d.rank if sys.argv[1] == "shape" else 4, device=d.device)
if sys.argv[1] == "skip" and d.rank == 0:
    tdist.all_reduce(x)  # rank 1 skips it
out = torch.empty(2 * x.numel(), device=d.device)
tdist.all_gather_into_tensor(out, x)
dist.cleanup()
"""


def _program(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_isend_then_recv_fails_fast_naming_both_lines_and_batched_or_parity_rings_pass(tmp_path):
    """2 ranks, each isend to the other then recv from it: a hang on NCCL (NVIDIA/nccl#479),
    refused within seconds on both ranks; the same step as one batch, or ordered by rank
    parity, runs (and the rings pass the values round)."""
    program = _program(tmp_path, RING_STEP)
    results = run_ranks(program, ["two-calls"], "strict", 2, timeout=120)
    for r in results:  # both ranks see the cycle, each at its own recv
        assert not r["ok"] and r["program_line"] == "program.py:14: tdist.recv(into, left)", r
        assert r["seconds"] < 15, f"rank {r['rank']} took {r['seconds']:.1f} s to refuse it"
        error = r["error"]
        assert "WouldHang" in error and "so on GPUs this hangs" in error, error
        for rank in (0, 1):  # each rank's two lines, and the fix
            assert f"rank {rank}'s isend to {1 - rank} (program.py:13: req = tdist.isend(" in error
            assert f"rank {rank}'s recv from {1 - rank} (program.py:14: tdist.recv(" in error
        assert "batch_isend_irecv" in error and "parity" in error, error
    for style in ("batch", "parity"):
        results = run_ranks(program, [style], "strict", 2, timeout=120)
        assert all(r["ok"] for r in results), (style, [r.get("error") for r in results])
        assert results[0]["metrics"]["got"] == [0.0] * 4, style  # two steps: its own back


def test_a_shape_mismatch_and_a_skipped_collective_fail_naming_both_ranks(tmp_path):
    program = _program(tmp_path, COLLECTIVES)
    shape = run_ranks(program, ["shape"], "strict", 2, timeout=120)
    for r in shape:
        assert not r["ok"], r
        error = r["error"]
        assert "collective #1 of this group differs between ranks" in error, error
        assert "all_gather_into_tensor(8 float32 <- 4 float32)" in error, error
        assert "all_gather_into_tensor(16 float32 <- 8 float32)" in error, error
        assert error.count("program.py:12: tdist.all_gather_into_tensor(out, x)") >= 2, error
    skipped = run_ranks(program, ["skip"], "strict", 2, timeout=120)
    for r in skipped:
        assert not r["ok"] and r["seconds"] < 15, r
        error = r["error"]
        assert "rank 0's all_reduce (program.py:10: tdist.all_reduce(x)" in error, error
        assert "rank 1's all_gather_into_tensor (program.py:12:" in error, error
        assert "did one rank skip a call?" in error, error


NCCL_REFUSALS = """
import sys
import torch
import torch.distributed as tdist
from helpers import dist

d = dist.init()
if sys.argv[1] == "view":
    x = torch.ones(3, 4, device=d.device).t()  # a transposed view: not contiguous
    tdist.all_reduce(x)
elif d.rank == 0:
    tdist.recv(torch.empty(2, device=d.device))  # no src: from any rank
else:
    tdist.send(torch.ones(2, device=d.device), 0)
dist.cleanup()
"""


def test_what_processgroupnccl_refuses_and_gloo_takes_fails_naming_the_line(tmp_path):
    """gloo reads a non-contiguous tensor's storage in order (mixing up its elements) and
    receives from any source; ProcessGroupNCCL refuses both."""
    program = _program(tmp_path, NCCL_REFUSALS)
    view = run_ranks(program, ["view"], "strict", 2, timeout=120)
    for r in view:
        assert not r["ok"] and r["program_line"] == "program.py:10: tdist.all_reduce(x)", r
        assert "Tensors must be contiguous" in r["error"] and "t.contiguous()" in r["error"], r
    anysource = run_ranks(program, ["anysource"], "strict", 2, timeout=120)
    bad = next(r for r in anysource if r["rank"] == 0)
    assert not bad["ok"], anysource
    assert bad["program_line"].startswith("program.py:12: tdist.recv(torch.empty(2"), bad
    assert "NCCL has none" in bad["error"] and "src=" in bad["error"], bad["error"]


LATE_RANK = """
import time
import torch
import torch.distributed as tdist
from helpers import dist

d = dist.init()
alone = [tdist.new_group([r]) for r in range(d.world_size)]  # a group of one per rank
model = torch.nn.Linear(4, 1).to(d.device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    model(torch.ones(2, 4, device=d.device)).sum().backward()
    tdist.all_reduce(model.weight.grad)
    if d.rank == 1:  # rank 1 is late for its own group's all-reduce
        until = time.perf_counter() + 0.5
        while time.perf_counter() < until:
            pass
    tdist.all_reduce(model.bias.grad, group=alone[d.rank])
    opt.step()
    opt.zero_grad()
dist.cleanup()
"""


def test_a_rank_stopped_at_its_step_waits_for_the_others_before_its_store_goes(tmp_path):
    """The dry run stops each rank at its own second optimizer step, without dist.cleanup's
    barrier. Rank 0's process hosts the store every group's check uses: had it left first,
    rank 1, still in step 2, failed on that store ('Broken pipe' at its all_reduce; 06's
    tp-decoder job did so in make dryrun). Both ranks now stop at their step."""
    results = run_ranks(_program(tmp_path, LATE_RANK), [], "strict", 2, small=True, timeout=120)
    for r in results:
        assert r["ok"] and r["ended"] == "stopped after 2 optimizer step(s)", r
