# Plausible wrong submissions for lab 3, used by tests/grading (multi-answer format:
# helpers/course/labs.py). Cells not listed keep the solution, so each submission must
# score strictly between zero and full marks.

# === wrong: no_microbatching
# Pipelines the whole batch as one piece: the gradients are right, but the stages never
# overlap (the naive split of notebook 05). The traffic test sees one message, not m.
# %% cell: gpipe_step
%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    if r == 0:
        h = x
    else:
        h = torch.empty_like(x)
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
%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn


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
%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    first, last = r == 0, r == p - 1
    inputs, outputs, losses = [], [], []
    for x_i, y_i in zip(x.chunk(m), y.chunk(m)):
        if first:
            h = x_i
        else:
            h = torch.empty_like(x_i)
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
%%program lab3_bubble
def bubble_fraction(p: int, m: int) -> float:
    return (p - 1) / m


def speedup(p: int, m: int) -> float:
    return float(p)

# === wrong: one_send_for_all_microbatches
# Runs the stage on each micro-batch, but saves messages by sending all m outputs as one
# tensor (and all m gradients as one): right gradients, yet the next stage cannot start
# before this one has finished every micro-batch, so the stages never overlap. The
# traffic test sees one message of the whole batch's bytes, not m of one micro-batch's.
# %% cell: gpipe_step
%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    first, last = r == 0, r == p - 1
    if first:
        inputs = list(x.chunk(m))
    else:
        h = torch.empty_like(x)  # every micro-batch's activations in one message
        tdist.recv(h, src=r - 1)
        inputs = [h_i.detach().requires_grad_() for h_i in h.chunk(m)]
    outputs = [stage(h_i) for h_i in inputs]
    if last:
        losses = [nn.functional.mse_loss(o, y_i) / m for o, y_i in zip(outputs, y.chunk(m))]
        sum(losses).backward()
    else:
        tdist.send(torch.cat([o.detach() for o in outputs]), dst=r + 1)
        grad = torch.empty_like(x)
        tdist.recv(grad, src=r + 1)
        for o, g in zip(outputs, grad.chunk(m)):
            o.backward(g)
    if not first:
        tdist.send(torch.cat([h_i.grad for h_i in inputs]), dst=r - 1)
    return torch.stack(losses).sum().detach() if last else None
