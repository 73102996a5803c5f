# A plausible wrong submission for lab 1, used by tests/grading (format: helpers/labs.py).
# Cells not listed here keep the solution, so this submission must score strictly
# between zero and full marks.

# %% cell: average_gradients
def average_gradients(d, model: nn.Module) -> None:
    # The classic mistake: sum the gradients and forget to divide by the number of ranks.
    # Replicas still stay identical, but every step is world_size times too large.
    for p in model.parameters():
        if p.grad is None:
            continue
        tdist.all_reduce(p.grad)
