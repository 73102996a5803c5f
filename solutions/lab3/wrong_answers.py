# Plausible wrong submissions for lab 3, used by tests/grading (multi-answer format:
# helpers/course/labs.py). Cells not listed keep the solution, so each submission must
# score strictly between zero and full marks.

# === wrong: no_microbatching
# Pipelines the whole batch as one piece: the gradients are right, but the stages never
# overlap (the naive split of notebook 05). The traffic test sees one message, not m.
# %% cell: gpipe_step
def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    if r == 0:
        h = x
    else:
        h = torch.empty(x.shape[0], WIDTH, dtype=torch.float64)
        tdist.recv(h, src=r - 1)
        h.requires_grad_()
    out = stage(h)
    if r < p - 1:
        tdist.send(out.detach(), dst=r + 1)
        grad = torch.empty_like(out)
        tdist.recv(grad, src=r + 1)
        out.backward(grad)
        loss = None
    else:
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
    if r > 0:
        tdist.send(h.grad, dst=r - 1)
    return loss.detach() if loss is not None else None

# === wrong: whole_model_everywhere
# Every rank rebuilds the whole model and runs it on the whole batch, then keeps the
# gradients of its own layers: right numbers, no pipeline, p times the work and memory.
# %% cell: gpipe_step
def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    full = make_model()
    loss = 0
    for x_i, y_i in zip(x.chunk(m), y.chunk(m)):
        loss = loss + nn.functional.mse_loss(full(x_i), y_i) / m
    loss.backward()
    mine = dict(stage.named_parameters())  # a slice of a Sequential keeps the layer numbers
    for name, p in full.named_parameters():
        if name in mine:
            mine[name].grad = p.grad.clone()
    return loss.detach() if d.rank == d.world_size - 1 else None

# === wrong: loss_not_divided_by_m
# Forgets that the loss of the batch is the MEAN over micro-batches: every gradient is m
# times too large (the messages and stage calls are right).
# %% cell: gpipe_step
def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    first, last = r == 0, r == p - 1
    inputs, outputs, losses = [], [], []
    for x_i, y_i in zip(x.chunk(m), y.chunk(m)):
        if first:
            h = x_i
        else:
            h = torch.empty(x_i.shape[0], WIDTH, dtype=torch.float64)
            tdist.recv(h, src=r - 1)
            h.requires_grad_()
        out = stage(h)
        if last:
            losses.append(nn.functional.mse_loss(out, y_i))
        else:
            tdist.send(out.detach(), dst=r + 1)
        inputs.append(h)
        outputs.append(out)
    for i in range(m):
        if last:
            losses[i].backward()
        else:
            grad = torch.empty_like(outputs[i])
            tdist.recv(grad, src=r + 1)
            outputs[i].backward(grad)
        if not first:
            tdist.send(inputs[i].grad, dst=r - 1)
    return torch.stack(losses).mean().detach() if last else None

# === wrong: bubble_overhead_not_fraction
# Returns seed 000's bubble *overhead* (bubble time / useful time) where the fraction of
# the whole grid was asked, and the speedup of a pipeline without a bubble.
# %% cell: bubble
def bubble_fraction(p: int, m: int) -> float:
    return (p - 1) / m


def speedup(p: int, m: int) -> float:
    return float(p)
