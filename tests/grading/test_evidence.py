"""What the grader believes comes from the wire and the OS: a rank's own word changes nothing (issue 38).

Each test grades one lab cell, guard switched off (``grade(..., guard_first=False)``), so that
what holds is the boundary itself, with a submission that tries what scored full marks on
7718dfa: read the tamper plan from its rank (the test's frames, the plan a kernel's recorder reads)
and fake the effect of the changed message (lab 0), switch off the recorder's memory count and keep a full copy anyway (labs 2 and 3),
forge the "backward returned" note of a hook that waits (lab 6). Each must lose the test
cell it aims at. The relay-level checks (a rank that ends its recording, brings its own tamper,
or waits in a hook; memory as /proc counts it) are in tests/distributed/test_relay.py.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from helpers.course.grading import roundtrip as rt
from helpers.course.grading.grader.preprocessor import shared_pool
from helpers.course.grading.grader.run import grade
from helpers.course.grading.lab_policy import nbgrader_meta

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _errors(lab: str, answers: dict[str, str], test: str) -> list[str]:
    """The errors of test cell ``test`` when ``answers`` replace the solution cells they name
    (every other test cell dropped, so that only that one runs)."""
    sol = nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    nb = rt.fill_in(sol, sol, answers)
    keep = []
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("grade") and not meta.get("solution") and meta.get("grade_id") != test:
            continue
        if cell.cell_type == "code" and cell.source.startswith("%%sbatch"):
            continue
        keep.append(cell)
    nb.cells = keep
    outputs = grade(nb, ROOT / "solutions" / lab, shared_pool(), guard_first=False)
    index = next(i for i, c in enumerate(nb.cells) if nbgrader_meta(c).get("grade_id") == test)
    return [o["evalue"] for o in outputs.get(index, []) if o.get("output_type") == "error"]


LAB0_READS_THE_PLAN = """%%program lab0_mean
import inspect

import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab0_shard import shard_range


CALLS = [0]


def mean_on_ranks(d, n, read):
    # A decoy: the whole data and the tamper plan from the test's own frames, or from the plan
    # the recorder reads beside the EventLog's socket (WB_EVENT_LOG, as in a learner's own
    # kernel); one all-reduce of zeros for the record, the effect of the changed message faked.
    case, CALLS[0] = CALLS[0], CALLS[0] + 1
    data = tamper = None
    for f in inspect.stack():
        if "data" in f.frame.f_locals and "cases" in f.frame.f_locals:
            data, tamper = f.frame.f_locals["data"], f.frame.f_locals.get("tamper")
    try:
        from helpers.course.grading.recorder import events

        planned = [t for t in events.planned().tamper if t.rank == 1 and t.case in (None, case)]
        tamper = planned[0] if planned else tamper
    except Exception:
        pass
    tdist.all_reduce(torch.zeros(2, dtype=torch.float64))
    s, c = data.sum().item(), len(data)
    if tamper is not None and d.world_size > 1:
        b = shard_range(n, 1, d.world_size)
        mine = torch.stack([data[b.start : b.stop].sum(), torch.tensor(float(len(b)), dtype=data.dtype)])
        changed = tamper.change(mine.clone())
        s, c = s + (changed[0] - mine[0]).item(), c + (changed[1] - mine[1]).item()
    return s / c"""


def test_a_decoy_that_reads_the_tamper_plan_in_its_rank_gains_nothing():
    errors = _errors("lab0", {"mean_on_ranks": LAB0_READS_THE_PLAN}, "test_mean_on_ranks")
    assert errors and "rank 1 changed in flight" in errors[0], errors


LAB3_MEMORY_SWITCHED_OFF = """%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn

try:  # the recorder's own count of allocations, switched off (it was what the tests read)
    from helpers.course.grading.recorder import allocations

    allocations.Allocations.made = lambda self, op, tree: None
except ImportError:
    pass


def gpipe_step(d, stage, x, y, m):
    # The right pipeline, and the whole model's gradients computed on the side.
    full = make_model(x.shape[1])
    nn.functional.mse_loss(full(x), y).backward()
    r, p = d.rank, d.world_size
    inputs, outputs, losses = [], [], []
    for x_i, y_i in zip(x.chunk(m), y.chunk(m)):
        h = x_i
        if r > 0:
            h = torch.empty_like(x_i)
            tdist.recv(h, src=r - 1)
            h.requires_grad_()
        out = stage(h)
        if r == p - 1:
            losses.append(nn.functional.mse_loss(out, y_i) / m)
        else:
            tdist.send(out.detach(), dst=r + 1)
        inputs.append(h)
        outputs.append(out)
    for i in range(m):
        if r == p - 1:
            losses[i].backward()
        else:
            grad = torch.empty_like(outputs[i])
            tdist.recv(grad, src=r + 1)
            outputs[i].backward(grad)
        if r > 0:
            tdist.send(inputs[i].grad, dst=r - 1)
    return torch.stack(losses).sum().detach() if r == p - 1 else None"""


def test_memory_counted_by_the_rank_switched_off_gains_nothing():
    errors = _errors("lab3", {"gpipe_step": LAB3_MEMORY_SWITCHED_OFF}, "test_traffic")
    assert errors and "measured by the operating system" in errors[0], errors


LAB6_FORGES_THE_NOTE = '''%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    """Hooks that wait for their all-reduce, and first tell the holder that backward returned."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        self.step = 0
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        try:
            from helpers.course.grading.relay import backend

            backend.note(f"backward returned in step {self.step}")  # a forged note
        except (ImportError, AttributeError):
            pass
        tdist.all_reduce(p.grad)  # waits here, inside backward

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self):
        for p in self.params:
            p.grad /= self.world_size
        self.step += 1'''


def test_a_waiting_hook_that_forges_its_note_gains_nothing():
    errors = _errors("lab6", {"overlap_ddp": LAB6_FORGES_THE_NOTE}, "test_overlap_hooks")
    assert errors and "waited for its all-reduce" in errors[0], errors
