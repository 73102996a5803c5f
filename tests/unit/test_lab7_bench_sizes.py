"""Lab 7's cluster job picks GPU sizes that fit one 80 GB GPU, with its all-gather reference.

On one H100 the job ran 32,768 tokens (chosen by testing for CUDA itself) and went out of
memory: plain attention's score matrix of one block over 8 heads in float32 is then 32 GiB,
and the learner's block attention holds about three such matrices at once (scores, shifted
scores, their exponentials). The job now picks its sizes with ``helpers.devices.gpu_sized``
and computes the all-gather reference a slice of queries at a time; this test reads the sizes
and slices from the job's cell and bounds the largest score tensors on one GPU (world size 1,
as ``make gpu-check`` runs it: the ring's own block is then the whole sequence).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIB, H100 = 2**30, 80e9
COPIES = 3  # [heads, Lq, Lk] float32 tensors alive at once in block_attention


def _bench_cell() -> str:
    cells = json.loads((ROOT / "solutions/lab7/lab7.ipynb").read_text())["cells"]
    (src,) = [
        "".join(c["source"])
        for c in cells
        if "".join(c["source"]).startswith("%%sbatch lab7_bench")
    ]
    return src


def _constant(src: str, name: str) -> int:
    match = re.search(rf"^{name}\s*=\s*(.+?)(?:\s*#.*)?$", src, re.M)
    assert match, f"the lab 7 job has no {name}"
    return ast.literal_eval(match.group(1))


def test_lab7_gpu_sizes_are_chosen_by_helpers_devices_and_fit_one_gpu():
    src = _bench_cell()
    match = re.search(r"for seq in \((\[[\d, ]+\]) if devices\.gpu_sized\(d\.device\) else", src)
    assert match, "the job should choose its GPU sizes with helpers.devices.gpu_sized(d.device)"
    heads, head_dim = _constant(src, "HEADS, HEAD_DIM")
    rows = _constant(src, "QUERY_ROWS")
    for seq in ast.literal_eval(match.group(1)):
        ring = COPIES * heads * seq * seq * 4  # one rank: its block is the whole sequence
        reference = COPIES * heads * min(rows, seq) * seq * 4
        inputs = 3 * heads * seq * head_dim * 4 * 4  # q, k, v, K/V buffers and outputs
        total = ring + reference + inputs
        assert total < 0.6 * H100, f"{seq} tokens: about {total / GIB:.0f} GiB on one GPU"
