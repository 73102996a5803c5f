# Plausible wrong submissions for lab 0, used by tests/grading (format: helpers/course/grading/roundtrip.py).
# Each replaces one or two solution cells; the cells it does not name keep the solution,
# so every one of them must score strictly between zero and full marks.

# === wrong: mean_of_means
# %% cell: mean_on_ranks
%%program lab0_mean
import torch
import torch.distributed as tdist

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab0_shard.py
    from lab0_shard import shard_range


def mean_on_ranks(d, n: int, read) -> float:
    # The classic mistake: average the per-rank means. Wrong when blocks differ in size.
    block = shard_range(n, d.rank, d.world_size)
    local_mean = read(block.start, block.stop).mean()
    tdist.all_reduce(local_mean, op=tdist.ReduceOp.SUM)
    return (local_mean / d.world_size).item()

# === wrong: hard_coded_mean
# %% cell: mean_on_ranks
%%program lab0_mean
import torch
import torch.distributed as tdist

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab0_shard.py
    from lab0_shard import shard_range


def mean_on_ranks(d, n: int, read) -> float:
    # Passes the visible test (0, 1, 4, ..., 81 has mean 28.5) and nothing else:
    # the hidden tests draw random data and sizes, and count the all-reduce calls.
    return 28.5

# === wrong: two_all_reduces
# %% cell: mean_on_ranks
%%program lab0_mean
import torch
import torch.distributed as tdist

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab0_shard.py
    from lab0_shard import shard_range


def mean_on_ranks(d, n: int, read) -> float:
    # The right mean, but two collectives (two messages, twice the start-up cost).
    block = shard_range(n, d.rank, d.world_size)
    shard = read(block.start, block.stop)
    total = shard.sum()
    count = torch.tensor(float(len(shard)), dtype=shard.dtype)
    tdist.all_reduce(total)
    tdist.all_reduce(count)
    return (total / count).item()

# === wrong: reads_every_item
# %% cell: sum_on_ranks
def sum_on_ranks(d, n: int, read) -> tuple[float, float]:
    # Every rank reads the whole dataset and sums it itself: no communication needed,
    # except that a rank does not hold the other ranks' items (the reader refuses).
    block = shard_range(n, d.rank, d.world_size)
    everything = read(0, n)
    return everything[block.start : block.stop].sum().item(), everything.sum().item()

# === wrong: no_argument_checks
# %% cell: shard_range
%%program lab0_shard
def shard_range(n: int, rank: int, world_size: int) -> range:
    # The split is right, but bad arguments are not rejected: shard_range(10, 4, 4)
    # returns an empty range instead of raising ValueError.
    q, r = divmod(n, world_size)
    start = rank * q + min(rank, r)
    return range(start, start + q + (1 if rank < r else 0))

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# The names say the class: tamper_ and rewrites_recorder_ reach into the grader and must
# score zero; imports_ is refused before it runs; decoy_ and deciding_ are caught by what
# the tests check.

# === wrong: tamper_ast_transformer
# Grader tampering: an IPython AST transformer wraps every later cell in try/except, so no
# test cell reports an error (nbgrader counts a test as failed only on an error). The
# answers stay stubs. The guard refuses get_ipython: the notebook scores zero.
# %% cell: shard_range
%%program lab0_shard
import ast


class SwallowErrors(ast.NodeTransformer):
    def visit_Module(self, node):
        handler = ast.ExceptHandler(type=ast.Name("BaseException", ast.Load()), name=None, body=[ast.Pass()])
        node.body = [ast.Try(body=node.body, handlers=[handler], orelse=[], finalbody=[])]
        return ast.fix_missing_locations(node)


get_ipython().ast_transformers.append(SwallowErrors())


def shard_range(n: int, rank: int, world_size: int) -> range:
    raise NotImplementedError()

# === wrong: imports_chunk_bounds
# An importable answer: notebook 02's helpers.parallel.collectives.collectives.chunk_bounds is exactly
# shard_range. The guard refuses the import (lab 0's grading.toml): the cell does not run,
# so the tests that need mean_on_ranks fail.
# %% cell: mean_on_ranks
%%program lab0_mean
import torch
import torch.distributed as tdist

from helpers.parallel.collectives.collectives import chunk_bounds


def mean_on_ranks(d, n: int, read) -> float:
    start, stop = chunk_bounds(n, d.world_size)[d.rank]
    shard = read(start, stop)
    stats = torch.stack([shard.sum(), torch.tensor(float(len(shard)), dtype=shard.dtype)])
    tdist.all_reduce(stats)
    return (stats[0] / stats[1]).item()

# === wrong: decoy_mean_through_files
# A decoy: every rank saves its (sum, count) to a file and reads everyone's, while the one
# all_reduce the tests count carries zeros (it serves as a barrier). The right mean, one
# all_reduce; but when a test doubles rank 1's message on its way, the mean does not move.
# %% cell: mean_on_ranks
%%program lab0_mean
import torch
import torch.distributed as tdist

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab0_shard.py
    from lab0_shard import shard_range


def mean_on_ranks(d, n: int, read) -> float:
    block = shard_range(n, d.rank, d.world_size)
    shard = read(block.start, block.stop)
    mine = torch.stack([shard.sum(), torch.tensor(float(len(shard)), dtype=shard.dtype)])
    torch.save(mine, f"/tmp/lab0-decoy-{d.rank}.pt")
    tdist.all_reduce(torch.zeros(2, dtype=shard.dtype))  # what the tests see: nothing
    total = sum(torch.load(f"/tmp/lab0-decoy-{r}.pt") for r in range(d.world_size))
    return (total[0] / total[1]).item()

# === wrong: rewrites_recorder_two_all_reduces
# Recorder rewriting: two all-reduces (sum, then count), then the recorder's log is edited
# to show the one all-reduce the test counts. The guard refuses the dispatch internals: the
# notebook scores zero.
# %% cell: mean_on_ranks
%%program lab0_mean
import torch
import torch.distributed as tdist
from torch.utils._python_dispatch import _get_current_dispatch_mode

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab0_shard.py
    from lab0_shard import shard_range


def mean_on_ranks(d, n: int, read) -> float:
    block = shard_range(n, d.rank, d.world_size)
    shard = read(block.start, block.stop)
    total, count = shard.sum(), torch.tensor(float(len(shard)), dtype=shard.dtype)
    tdist.all_reduce(total)
    tdist.all_reduce(count)
    recorder = _get_current_dispatch_mode()
    recorder.traffic.collectives[:] = ["all_reduce"]
    return (total / count).item()

# === wrong: deciding_everyone_gets_one
# Only the deciding cases catch it: "every rank gets at least one item" (q = max(1, n // N)).
# Right whenever n >= N, which every visible test and every drawn size is; wrong with fewer
# items than ranks, a case the hidden tests always include.
# %% cell: shard_range
%%program lab0_shard
def shard_range(n: int, rank: int, world_size: int) -> range:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    q, r = max(1, n // world_size), n % world_size
    start = min(rank * q + min(rank, r), n)
    return range(start, min(start + q + (1 if rank < r else 0), n))

# === wrong: decoy_blocks_by_point_to_point
# A decoy (issue 38): every rank sends its block's sum and count to every other rank with plain
# sends (no collective), adds them up itself, and makes the one all-reduce the tests count, of
# zeros. Right values, one all-reduce on the wire; when the grading process changes rank 1's
# message by a factor it does not tell the ranks, the mean does not follow.
# %% cell: mean_on_ranks
%%program lab0_mean
import torch
import torch.distributed as tdist

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab0_shard.py
    from lab0_shard import shard_range


def mean_on_ranks(d, n: int, read) -> float:
    block = shard_range(n, d.rank, d.world_size)
    shard = read(block.start, block.stop)
    mine = torch.stack([shard.sum(), torch.tensor(float(len(shard)), dtype=shard.dtype)])
    others = [r for r in range(d.world_size) if r != d.rank]
    received = [torch.empty_like(mine) for _ in others]
    ops = [tdist.P2POp(tdist.isend, mine, r) for r in others]  # one batch: safe on NCCL too
    ops += [tdist.P2POp(tdist.irecv, buf, r) for r, buf in zip(others, received)]
    for w in tdist.batch_isend_irecv(ops):
        w.wait()
    total = mine + sum(received)
    tdist.all_reduce(torch.zeros_like(mine))  # for the record
    return (total[0] / total[1]).item()
