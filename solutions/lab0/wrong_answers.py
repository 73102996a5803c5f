# Plausible wrong submissions for lab 0, used by tests/grading (format: helpers/course/grading.py).
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
