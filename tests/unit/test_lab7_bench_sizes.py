"""Lab 7's cluster job picks GPU sizes that fit one 80 GB GPU, with its all-gather reference.

On one H100 the job ran 32,768 tokens (chosen by testing for CUDA itself) and went out of
memory: plain attention's score matrix of one block over 8 heads in float32 is then 32 GiB,
and the learner's block attention holds about three such matrices at once (scores, shifted
scores, their exponentials). The job now picks its tokens **per rank** with
``helpers.devices.gpu_sized`` (the sequence is that times the world size, as context
parallelism is for), and compares the peak memory of the ring with the all-gather's. This test
reads the sizes from the job's cell and bounds the largest score tensors of both on one GPU at
the world sizes the job meets: 1 (``make gpu-check``: the ring's own block is then the whole
sequence), 4 (the cell's node) and 8 (two nodes); and it checks the arithmetic of the lesson
the result cell asserts: with more than one rank the ring's scores are smaller.
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
    match = re.search(r"return (\[[\d, ]+\]) if devices\.gpu_sized\(device\) else", src)
    assert match, "the job should choose its tokens per rank with helpers.devices.gpu_sized"
    assert "seq = per_rank * d.world_size" in src, "the sequence should grow with the ranks"
    heads, head_dim = _constant(src, "HEADS, HEAD_DIM")
    for per_rank in ast.literal_eval(match.group(1)):
        for world in (1, 4, 8):
            seq = per_rank * world
            ring = COPIES * heads * per_rank * per_rank * 4  # one block of keys at a time
            gather = COPIES * heads * per_rank * seq * 4  # this rank's queries, every key
            inputs = 3 * heads * seq * head_dim * 4 * 4  # q, k, v, K/V buffers and outputs
            total = max(ring, gather) + inputs  # one way at a time
            assert total < 0.6 * H100, f"{seq} tokens on {world}: about {total / GIB:.0f} GiB"
            assert world == 1 or ring < gather
