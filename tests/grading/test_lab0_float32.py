"""Lab 0 part 3: an honest answer in float32 keeps its marks (issue 33).

The text asks for the (sum, count) tensor in the items' dtype, and says the hidden tests accept
float32's rounding. A learner who writes ``torch.tensor([local_sum, count])`` (float32, torch's
default) passed Validate and then failed the hidden test's ``rel_tol=1e-9`` on float64 data.
Here every hidden case of ``test_mean_on_ranks`` (HIDDEN_DRAWS = 1000 takes them all) runs in
a real kernel on real ranks against such an answer, and against the mean of means, which must
still fail.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from helpers.course.grading.draws import draw_notebook

ROOT = Path(__file__).resolve().parents[2]
LAB0 = ROOT / "solutions" / "lab0" / "lab0.ipynb"
NEEDED = {"imports", "shard_range", "shard_readers", "mean_on_ranks", "test_mean_on_ranks"}

FLOAT32 = """%%program lab0_mean
import torch
import torch.distributed as tdist


def mean_on_ranks(d, n: int, read) -> float:
    block = shard_range(n, d.rank, d.world_size)
    shard = read(block.start, block.stop)
    stats = torch.tensor([shard.sum().item(), len(shard)])  # float32: torch's default dtype
    tdist.all_reduce(stats)
    return (stats[0] / stats[1]).item()"""

MEAN_OF_MEANS = """%%program lab0_mean
import torch
import torch.distributed as tdist


def mean_on_ranks(d, n: int, read) -> float:
    block = shard_range(n, d.rank, d.world_size)
    local_mean = read(block.start, block.stop).mean()
    tdist.all_reduce(local_mean)
    return (local_mean / d.world_size).item()"""


def hidden_test_errors(answers: dict[str, str], lab: Path = LAB0) -> dict[str, str | None]:
    """For each answer (name -> mean_on_ranks cell), test_mean_on_ranks's error, None if it
    passed; all in one kernel, each answer followed by the test cell."""
    from nbclient import NotebookClient

    nb = draw_notebook(lab, 1000)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    keep = [c for c in nb.cells if c.source.startswith(("HIDDEN_DRAWS", "# Parameters"))
            or c.metadata.get("nbgrader", {}).get("grade_id") in NEEDED - {"mean_on_ranks", "test_mean_on_ranks"}]  # fmt: skip
    tests = []
    for source in answers.values():
        answer, test = (
            copy.deepcopy(cells["mean_on_ranks"]),
            copy.deepcopy(cells["test_mean_on_ranks"]),
        )
        answer.source = source
        keep += [answer, test]
        tests.append(test)
    nb.cells = keep
    with tempfile.TemporaryDirectory(prefix="lab0-float32-") as tmp:
        NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": tmp}}).execute()  # fmt: skip
    out = {}
    for name, test in zip(answers, tests, strict=True):
        errors = [o for o in test.outputs if o.get("output_type") == "error"]
        out[name] = f"{errors[0]['ename']}: {errors[0]['evalue']}" if errors else None
    return out


def test_every_hidden_case_accepts_float32_and_refuses_a_wrong_mean():
    errors = hidden_test_errors({"float32": FLOAT32, "mean of means": MEAN_OF_MEANS})
    assert errors["float32"] is None, (
        f"an honest float32 answer failed a hidden case: {errors['float32']}"
    )
    assert errors["mean of means"] is not None, "the mean of means passed every hidden case"
