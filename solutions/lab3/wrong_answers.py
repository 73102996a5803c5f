# Plausible wrong submissions for lab 3, used by tests/grading (multi-answer format:
# helpers/course/grading/labs.py). Cells not listed keep the solution, so each submission must
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

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# tamper_ and rewrites_recorder_ reach into the grader and must score zero; imports_ is
# refused before it runs; decoy_ and deciding_ are caught by what the tests check.

# === wrong: tamper_always_equal
# Grader tampering: a number whose subtraction always gives 0, so every check of the form
# abs(got - want) < 1e-9 passes whatever the formula. The guard refuses special methods
# that change what the tests' own arithmetic does: zero.
# %% cell: bubble
%%program lab3_bubble
class Close(float):
    def __sub__(self, other):
        return 0.0


def bubble_fraction(p: int, m: int) -> float:
    return Close(0.5)


def speedup(p: int, m: int) -> float:
    return Close(1.0)

# === wrong: imports_torch_pipelining
# A library shortcut: torch.distributed.pipelining's GPipe schedule does the exercise.
# Refused by lab 3's grading.toml before it runs.
# %% cell: gpipe_step
%%program lab3_gpipe
import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    pipe = PipelineStage(stage, d.rank, d.world_size, x.device)
    last = d.rank == d.world_size - 1
    schedule = ScheduleGPipe(pipe, m, loss_fn=lambda out, target: nn.functional.mse_loss(out, target))
    losses = [] if last else None
    schedule.step(x if d.rank == 0 else None, target=y if last else None, losses=losses)
    return torch.stack(losses).mean().detach() if last else None

# === wrong: imports_the_simulator
# An importable answer: the bubble from notebook 05's simulator, the tests' own oracle.
# Refused by lab 3's grading.toml before it runs.
# %% cell: bubble
%%program lab3_bubble
from helpers.parallel.pipeline.schedules import simulate


def bubble_fraction(p: int, m: int) -> float:
    return simulate("gpipe", p, m).bubble


def speedup(p: int, m: int) -> float:
    return simulate("gpipe", p, m).speedup

# === wrong: decoy_whole_model_zero_messages
# A decoy: every rank runs the whole model on the whole batch and keeps its own layers'
# gradients, while the messages follow the GPipe pattern with zeros of the right shape
# (and the stage is called m times, on zeros). Right gradients, right message sizes; the
# tests see what the messages carry, the memory a rank allocates, and that an activation
# changed in flight changes nothing.
# %% cell: gpipe_step
%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    full = make_model()  # the whole model, on every rank
    loss = sum(nn.functional.mse_loss(full(x_i), y_i) / m for x_i, y_i in zip(x.chunk(m), y.chunk(m)))
    loss.backward()
    mine = dict(stage.named_parameters())  # a slice of a Sequential keeps the layer numbers
    for name, param in full.named_parameters():
        if name in mine:
            mine[name].grad = param.grad.clone()
    for x_i in x.chunk(m):  # the GPipe pattern, carrying nothing
        if r > 0:
            tdist.recv(torch.empty_like(x_i), src=r - 1)
        with torch.no_grad():
            stage(torch.zeros_like(x_i))
        if r < p - 1:
            tdist.send(torch.zeros_like(x_i), dst=r + 1)
    for x_i in x.chunk(m):
        if r < p - 1:
            tdist.recv(torch.empty_like(x_i), src=r + 1)
        if r > 0:
            tdist.send(torch.zeros_like(x_i), dst=r - 1)
    return loss.detach() if r == p - 1 else None

# === wrong: rewrites_recorder_fakes_messages
# Recorder rewriting: the whole model on every rank, then the recorder's log is filled with
# the messages the test expects. The guard refuses the dispatch internals: zero.
# %% cell: gpipe_step
%%program lab3_gpipe
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    full = make_model()
    loss = sum(nn.functional.mse_loss(full(x_i), y_i) / m for x_i, y_i in zip(x.chunk(m), y.chunk(m)))
    loss.backward()
    mine = dict(stage.named_parameters())
    for name, param in full.named_parameters():
        if name in mine:
            mine[name].grad = param.grad.clone()
    log = _get_current_dispatch_mode().traffic.messages
    size = x.shape[0] // m * x.shape[1] * 8
    for peer in [q for q in (r - 1, r + 1) if 0 <= q < p]:
        log += [type(log[0])("send", peer, size // 8, size)] * m if log else []
    return loss.detach() if r == p - 1 else None

# === wrong: deciding_first_or_last
# Only the deciding cases catch it: "a rank is the first stage or the last" (elif). With
# one stage, the first rank is also the last: it never computes the loss. Right on 2 to 4
# stages, as in every visible test; the hidden tests always include a single stage.
# %% cell: gpipe_step
%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    inputs, outputs, losses = [], [], []
    for x_i, y_i in zip(x.chunk(m), y.chunk(m)):
        if r == 0:
            h = x_i
        else:
            h = torch.empty_like(x_i)
            tdist.recv(h, src=r - 1)
            h.requires_grad_()
        out = stage(h)
        if r == 0:
            tdist.send(out.detach(), dst=r + 1)
        elif r == p - 1:
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
    return torch.stack(losses).sum().detach() if r == p - 1 else None

# === wrong: each_microbatch_forward_then_backward
# Takes "the gradients accumulate" to mean one micro-batch at a time: forward, loss, backward,
# then the next micro-batch. The gradients, the loss and every message (their count, sizes
# and contents) are GPipe's, but stage r + 1 can only start micro-batch i + 1 once micro-batch
# i has come all the way back: the stages take turns and never overlap. Only the order of the
# messages shows it (a forward message after a backward one).
# %% cell: gpipe_step
%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    r, p = d.rank, d.world_size
    first, last = r == 0, r == p - 1
    total = None
    for x_i, y_i in zip(x.chunk(m), y.chunk(m)):
        if first:
            h = x_i
        else:
            h = torch.empty_like(x_i)
            tdist.recv(h, src=r - 1)
            h.requires_grad_()
        out = stage(h)
        if last:
            loss = nn.functional.mse_loss(out, y_i) / m
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        else:
            tdist.send(out.detach(), dst=r + 1)
            grad = torch.empty_like(out)
            tdist.recv(grad, src=r + 1)
            out.backward(grad)
        if not first:
            tdist.send(h.grad, dst=r - 1)
    return total

# === wrong: pipeline_plus_whole_model_gradients
# The right pipeline, and on the side every rank runs the whole model (rebuilt from its width)
# on the whole batch and computes all its gradients: the values and messages are right, but a
# rank holds the whole model's gradients, which the operating system counts (issue 38: the
# rank's own count of its allocations, which a submission could switch off, no longer decides).
# %% cell: gpipe_step
%%program lab3_gpipe
import torch
import torch.distributed as tdist
from torch import nn


def gpipe_step(d, stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int):
    full = make_model(x.shape[1])
    nn.functional.mse_loss(full(x), y).backward()
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
            losses.append(nn.functional.mse_loss(out, y_i) / m)
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
    return torch.stack(losses).sum().detach() if last else None
