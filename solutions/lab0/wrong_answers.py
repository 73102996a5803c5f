# A plausible wrong submission for lab 0, used by tests/grading (format: helpers/labs.py).
# Cells not listed here keep the solution, so this submission must score strictly
# between zero and full marks.

# %% cell: mean_on_ranks
def mean_on_ranks(d, data: torch.Tensor) -> float:
    # The classic mistake: average the per-rank means. Wrong when shards differ in size.
    block = shard_range(len(data), d.rank, d.world_size)
    local_mean = data[block.start : block.stop].mean()
    tdist.all_reduce(local_mean, op=tdist.ReduceOp.SUM)
    return (local_mean / d.world_size).item()
