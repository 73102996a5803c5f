"""Lab 2's solution, outside nbgrader: its ShardedOptimizer (the solution cell of
solutions/lab2/lab2.ipynb, run as written) equals plain AdamW to 1e-6 after 5 steps on 2 and
4 gloo ranks, keeps Adam state for ceil(P/N) elements per rank, and runs one gradient
all-reduce and one all-gather per step."""

import math
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import launch
from helpers.course.grading.recorder.traffic import record_traffic
from helpers.course.grading.roundtrip import solution_source

LAB = Path(__file__).resolve().parents[2] / "solutions" / "lab2" / "lab2.ipynb"
STEPS = 5


def _solution_cell(grade_id: str) -> str:
    for cell in nbformat.read(LAB, as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            lines = solution_source(cell.source).splitlines()
            return "\n".join(ln for ln in lines if not ln.startswith("%%"))  # drop %%program
    raise AssertionError(f"{LAB} has no cell {grade_id!r}")


def _model() -> nn.Module:
    torch.manual_seed(0)  # tensors of 91, 13, 39 and 3 elements: whole tensors cannot balance
    return nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 3))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 7, generator=g), torch.randn(8, 3, generator=g)


def _train_sharded(d, source: str):
    scope: dict = {}
    exec(source, scope)  # the learner's module, as the Slurm job imports it
    model = _model()
    opt = scope["ShardedOptimizer"](model.parameters(), d, torch.optim.AdamW, lr=1e-2,
                                    weight_decay=0.1)  # fmt: skip
    x, y = _batch()
    xs, ys = x.chunk(d.world_size)[d.rank], y.chunk(d.world_size)[d.rank]
    calls = []
    for _ in range(STEPS):
        opt.zero_grad()
        F.mse_loss(model(xs), ys).backward()
        with record_traffic(allow=("all_reduce", "all_gather_into_tensor")) as traffic:
            opt.step()
        calls.append([(c.name, c.bytes) for c in traffic.calls])
    state = sum(v.numel() for s in opt.optimizer.state.values() for v in s.values() if v.dim() > 0)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), state, calls


@pytest.mark.parametrize("world", [2, 4])
def test_lab2_solution_equals_adamw_with_balanced_state(world):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x, y = _batch()
    for _ in range(STEPS):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    want = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    numel, size = want.numel(), math.ceil(want.numel() / world)
    out = launch.spawn(_train_sharded, world, args=(_solution_cell("zero1"),))
    states = [state for _, state, _ in out]
    assert sum(states) == 2 * numel and max(states) <= 2 * size, states
    for rank, (got, _, calls) in enumerate(out):
        assert (got - want).abs().max().item() <= 1e-6, rank
        assert calls == [[("all_reduce", 4 * numel), ("all_gather_into_tensor", 4 * size)]] * STEPS


def test_lab2_estimate_reproduces_the_zero_paper():
    scope: dict = {}
    exec(_solution_cell("memory_estimate"), scope)
    gb = [sum(scope["model_state_bytes"](7_500_000_000, 64, s, "mixed")) / 1e9 for s in range(4)]
    assert [round(v, 1) for v in gb] == [120.0, 31.4, 16.6, 1.9]
