# Plausible wrong submissions for lab 8, used by tests/grading (format: helpers/course/grading/roundtrip.py).
# Each replaces one solution cell (or two); the cells it does not name keep the solution, so every
# one of them must score strictly between zero and full marks (tamper_ and rewrites_recorder_:
# zero).

# === wrong: weights_not_renormalised
# The top-k probabilities as they come out of the softmax, for every k: right at k = 1 (Switch),
# but at k >= 2 they sum to less than 1, so every token's output is shrunk. Dispatch and combine do not see it; the router's test and the
# layer against the serial twin do.
# %% cell: router
%%program lab8_router
import torch


def router_topk(logits: torch.Tensor, k: int):
    probs = torch.softmax(logits, dim=-1)
    top, experts = probs.topk(k, dim=-1)
    return top, experts


def switch_aux_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    tokens, k = experts.shape
    n_experts = probs.shape[-1]
    flat = experts.reshape(-1)
    counts = torch.zeros(n_experts, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(0, flat, torch.ones(flat.shape, dtype=probs.dtype, device=probs.device))
    return n_experts * (counts / (tokens * k) * probs.mean(dim=0)).sum()

# === wrong: renormalises_at_k1
# The k gates renormalised for every k, k = 1 too: each token's one gate is p / p = 1, so at
# k = 1 the router gets no gradient from the task (Switch multiplies by p itself). Right at
# k >= 2; the router's test at k = 1 and the layer's top-1 cases (the router's gradient) catch it.
# %% cell: router
%%program lab8_router
import torch


def router_topk(logits: torch.Tensor, k: int):
    probs = torch.softmax(logits, dim=-1)
    top, experts = probs.topk(k, dim=-1)
    return top / top.sum(dim=-1, keepdim=True), experts


def switch_aux_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    tokens, k = experts.shape
    n_experts = probs.shape[-1]
    flat = experts.reshape(-1)
    counts = torch.zeros(n_experts, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(0, flat, torch.ones(flat.shape, dtype=probs.dtype, device=probs.device))
    return n_experts * (counts / (tokens * k) * probs.mean(dim=0)).sum()

# === wrong: aux_loss_counts_tokens_not_assignments
# f_e as a share of the tokens instead of the token-expert assignments: k times too large for
# top-k (2 for an even top-2 routing, where the loss should be 1).
# %% cell: router
%%program lab8_router
import torch


def router_topk(logits: torch.Tensor, k: int):
    probs = torch.softmax(logits, dim=-1)
    top, experts = probs.topk(k, dim=-1)
    if k > 1:
        top = top / top.sum(dim=-1, keepdim=True)
    return top, experts


def switch_aux_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    tokens = experts.shape[0]
    n_experts = probs.shape[-1]
    flat = experts.reshape(-1)
    counts = torch.zeros(n_experts, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(0, flat, torch.ones(flat.shape, dtype=probs.dtype, device=probs.device))
    return n_experts * (counts / tokens * probs.mean(dim=0)).sum()

# === wrong: dispatch_by_token_order
# The rows leave in token order (token 0's assignments, then token 1's, ...) with the right
# split sizes: each rank receives the right NUMBER of rows, but not the tokens that chose its
# experts. The combine puts every output back where it came from, so nothing fails loudly:
# the outputs are another expert's.
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist

from helpers import standin


def host_counts(counts: torch.Tensor, total: int) -> list:
    """counts (row counts that sum to total) as host numbers, in its shape: counts.tolist().
    On the dry run's fake GPU, whose tensors hold no values, an even split of total stands in."""
    if standin.mode() == "fake":
        n = counts.numel()
        return torch.tensor([total // n + (i < total % n) for i in range(n)]).view(counts.shape).tolist()
    return counts.tolist()


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group=None):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        tdist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        tdist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, k = tdist.get_world_size(group), experts.shape[1]
    flat = experts.reshape(-1)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    incoming = torch.empty_like(counts)
    tdist.all_to_all_single(incoming, counts, group=group)
    order = torch.arange(len(flat), device=flat.device)  # token order: not sorted by expert
    send = [sum(part) for part in host_counts(counts.view(n, -1), len(order))]
    recv_counts = host_counts(incoming.view(n, -1), len(order))
    recv = [sum(part) for part in recv_counts]
    received = AllToAll.apply(x[order // k], recv, send, group)
    return received, recv_counts, (order, send, recv, group)

# === wrong: weighted_at_the_expert_and_at_home
# Megatron-Core's way half-done: the gates travel to the experts' ranks and each output is weighted
# there (both messages right), but the weighted outputs are weighted again at home: every output
# counts gate squared. The combine's messages pass; the outputs and the layer do not.
# %% cell: combine
%%program lab8_combine
import torch

if __name__ != "__main__":
    from lab8_dispatch import AllToAll


def combine(y: torch.Tensor, weights: torch.Tensor, plan) -> torch.Tensor:
    order, send, recv, group = plan
    k = weights.shape[1]
    mine = weights.reshape(-1)[order].unsqueeze(-1)
    gates = AllToAll.apply(mine, recv, send, group)  # each sent row's gate, to its expert
    home = AllToAll.apply(y * gates, send, recv, group)
    return home.new_zeros(weights.shape[0], home.shape[1]).index_add(0, order // k, home * mine)

# === wrong: all_gather_every_token
# Every rank gets every rank's tokens and choices (all-gather, padded to the longest share) and
# keeps the rows of its own experts; the outputs come home by another all-gather. It computes
# the layer, at N times the traffic of the all-to-all, and it is not what lab 8 asks for: the
# tests allow all_to_all_single only.
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist

from helpers import standin


def host_counts(counts: torch.Tensor, total: int) -> list:
    """counts (row counts that sum to total) as host numbers, in its shape: counts.tolist().
    On the dry run's fake GPU, whose tensors hold no values, an even split of total stands in."""
    if standin.mode() == "fake":
        n = counts.numel()
        return torch.tensor([total // n + (i < total % n) for i in range(n)]).view(counts.shape).tolist()
    return counts.tolist()


class AllToAll(torch.autograd.Function):
    """Not used here."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group=None):
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError()


def gather_padded(t, sizes):
    longest = max(sizes)
    pieces = [t.new_empty(longest, *t.shape[1:]) for _ in sizes]
    tdist.all_gather(pieces, torch.cat([t, t.new_zeros(longest - len(t), *t.shape[1:])]))
    return [p[:n] for p, n in zip(pieces, sizes)]


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, r = tdist.get_world_size(), tdist.get_rank()
    lengths = [torch.zeros(1, dtype=torch.long) for _ in range(n)]
    tdist.all_gather(lengths, torch.tensor([len(x)]))
    sizes = [int(s) for s in lengths]
    xs, es = gather_padded(x, sizes), gather_padded(experts, sizes)
    per = n_experts // n
    rows, counts = [], []
    for i in range(n):
        counts.append([])
        for e in range(r * per, (r + 1) * per):
            tokens = (es[i] == e).any(-1).nonzero().flatten()
            rows.append(xs[i][tokens])
            counts[-1].append(len(tokens))
    return torch.cat(rows), counts, (es, r, per)
# %% cell: combine
%%program lab8_combine
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab8_dispatch import gather_padded


def combine(y: torch.Tensor, weights: torch.Tensor, plan) -> torch.Tensor:
    es, r, per = plan
    n = len(es)
    lengths = [torch.zeros(1, dtype=torch.long) for _ in range(n)]
    tdist.all_gather(lengths, torch.tensor([len(y)]))
    ys = gather_padded(y, [int(s) for s in lengths])
    out = y.new_zeros(len(es[r]), y.shape[1])
    for j in range(n):  # rank j's outputs: by source rank, then expert, then token
        pos = 0
        for i in range(n):
            for e in range(j * per, (j + 1) * per):
                tokens = (es[i] == e).any(-1).nonzero().flatten()
                if i == r:
                    slot = (es[r][tokens] == e).float().argmax(-1)
                    out = out.index_add(0, tokens, ys[j][pos : pos + len(tokens)] * weights[tokens, slot, None])
                pos += len(tokens)
    return out

# === wrong: backward_without_the_reverse_exchange
# The all-to-all's backward hands the gradient back unchanged instead of sending each row's
# gradient to the rank the row came from. The forward pass is right; the gradients are not
# (or have the wrong number of rows, when the splits are uneven).
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist

from helpers import standin


def host_counts(counts: torch.Tensor, total: int) -> list:
    """counts (row counts that sum to total) as host numbers, in its shape: counts.tolist().
    On the dry run's fake GPU, whose tensors hold no values, an even split of total stands in."""
    if standin.mode() == "fake":
        n = counts.numel()
        return torch.tensor([total // n + (i < total % n) for i in range(n)]).view(counts.shape).tolist()
    return counts.tolist()


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group=None):
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        tdist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, k = tdist.get_world_size(group), experts.shape[1]
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    incoming = torch.empty_like(counts)
    tdist.all_to_all_single(incoming, counts, group=group)
    send = [sum(part) for part in host_counts(counts.view(n, -1), len(order))]
    recv_counts = host_counts(incoming.view(n, -1), len(order))
    recv = [sum(part) for part in recv_counts]
    received = AllToAll.apply(x[order // k], recv, send, group)
    return received, recv_counts, (order, send, recv, group)

# === wrong: ignores_the_ep_group
# The group is accepted and never used: every all-to-all runs over the whole world. Right when the
# EP group is the world; with two EP groups of 2 inside 4 ranks the counts are cut into 4 parts and
# the rows go to the wrong ranks (the layer's EP x DP case).
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist

from helpers import standin


def host_counts(counts: torch.Tensor, total: int) -> list:
    """counts (row counts that sum to total) as host numbers, in its shape: counts.tolist().
    On the dry run's fake GPU, whose tensors hold no values, an even split of total stands in."""
    if standin.mode() == "fake":
        n = counts.numel()
        return torch.tensor([total // n + (i < total % n) for i in range(n)]).view(counts.shape).tolist()
    return counts.tolist()


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits over every rank; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group=None):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        tdist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        tdist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None, None


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, k = tdist.get_world_size(), experts.shape[1]
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    incoming = torch.empty_like(counts)
    tdist.all_to_all_single(incoming, counts)
    send = [sum(part) for part in host_counts(counts.view(n, -1), len(order))]
    recv_counts = host_counts(incoming.view(n, -1), len(order))
    recv = [sum(part) for part in recv_counts]
    received = AllToAll.apply(x[order // k], recv, send)
    return received, recv_counts, (order, send, recv, None)

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# tamper_ and rewrites_recorder_ reach into the grader and must score zero; imports_ is
# refused before it runs (grading.toml); decoy_ and deciding_ are caught by what the tests check.

# === wrong: deciding_counts_by_bincount
# torch.bincount without minlength: its length is the largest expert chosen plus one, so when
# the last experts get no token the count exchange sends fewer than E numbers. Right whenever
# every expert is chosen; only the hidden routings with the last expert empty catch it.
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist

from helpers import standin


def host_counts(counts: torch.Tensor, total: int) -> list:
    """counts (row counts that sum to total) as host numbers, in its shape: counts.tolist().
    On the dry run's fake GPU, whose tensors hold no values, an even split of total stands in."""
    if standin.mode() == "fake":
        n = counts.numel()
        return torch.tensor([total // n + (i < total % n) for i in range(n)]).view(counts.shape).tolist()
    return counts.tolist()


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group=None):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        tdist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        tdist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, k = tdist.get_world_size(group), experts.shape[1]
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat)  # no minlength: short when the last experts are not chosen
    incoming = torch.empty_like(counts)
    tdist.all_to_all_single(incoming, counts, group=group)
    send = [sum(part) for part in host_counts(counts.view(n, -1), len(order))]
    recv_counts = host_counts(incoming.view(n, -1), len(order))
    recv = [sum(part) for part in recv_counts]
    received = AllToAll.apply(x[order // k], recv, send, group)
    return received, recv_counts, (order, send, recv, group)

# === wrong: deciding_softmax_by_hand
# The softmax written out as exp(l) / sum exp(l): right for moderate logits, inf / inf = NaN
# once a logit passes ~709 (float64), which only the hidden test's large logits reach.
# %% cell: router
%%program lab8_router
import torch


def router_topk(logits: torch.Tensor, k: int):
    e = torch.exp(logits)
    probs = e / e.sum(dim=-1, keepdim=True)
    top, experts = probs.topk(k, dim=-1)
    if k > 1:
        top = top / top.sum(dim=-1, keepdim=True)
    return top, experts


def switch_aux_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    tokens, k = experts.shape
    n_experts = probs.shape[-1]
    flat = experts.reshape(-1)
    counts = torch.zeros(n_experts, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(0, flat, torch.ones(flat.shape, dtype=probs.dtype, device=probs.device))
    return n_experts * (counts / (tokens * k) * probs.mean(dim=0)).sum()

# === wrong: decoy_rows_through_files
# A decoy: the counts are exchanged, and the rows' all-to-all has the right split sizes, but
# it carries zeros. The real rows go through files, which the all-to-all only tells the ranks
# are written. What the messages carry, and what changing them changes, gives it away.
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist

from helpers import standin

CALLS = [0]


def host_counts(counts: torch.Tensor, total: int) -> list:
    """counts (row counts that sum to total) as host numbers, in its shape: counts.tolist().
    On the dry run's fake GPU, whose tensors hold no values, an even split of total stands in."""
    if standin.mode() == "fake":
        n = counts.numel()
        return torch.tensor([total // n + (i < total % n) for i in range(n)]).view(counts.shape).tolist()
    return counts.tolist()


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group=None):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        tdist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        tdist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, r, k = tdist.get_world_size(group), tdist.get_rank(group), experts.shape[1]
    CALLS[0] += 1
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    incoming = torch.empty_like(counts)
    tdist.all_to_all_single(incoming, counts, group=group)
    send = [sum(part) for part in host_counts(counts.view(n, -1), len(order))]
    recv_counts = host_counts(incoming.view(n, -1), len(order))
    recv = [sum(part) for part in recv_counts]
    rows = x[order // k].detach()
    folder = f"/tmp/lab8-decoy-{n}-{n_experts}-{x.shape[1]}-{CALLS[0]}"
    torch.save((rows, send), f"{folder}-{r}.pt")
    AllToAll.apply(torch.zeros_like(rows), recv, send, group)  # the watched message: zeros
    received = []
    for i in range(n):
        theirs, their_send = torch.load(f"{folder}-{i}.pt")
        start = sum(their_send[:r])
        received.append(theirs[start : start + their_send[r]])
    return torch.cat(received), recv_counts, (order, send, recv, group)

# === wrong: imports_the_workbook_dispatcher
# Right answer, wrong exercise: notebook 10's dispatcher, imported from the workbook. Refused
# by lab 8's grading.toml before it runs, so the tests that need it fail; Part 1 keeps its points.
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist

from helpers.parallel.expert.dispatch import AllToAll, exchange_counts, permute
from helpers.parallel.expert.moe import host_counts


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, k = tdist.get_world_size(group), experts.shape[1]
    order, counts = permute(experts, n_experts)
    send = [sum(part) for part in host_counts(counts.view(n, -1), len(order))]
    recv_counts = host_counts(exchange_counts(counts, group), len(order))
    recv = [sum(part) for part in recv_counts]
    return AllToAll.apply(x[order // k], recv, send, group), recv_counts, (order, send, recv, group)

# === wrong: imports_torch_autograd_all_to_all
# An importable answer to the all-to-all's backward: torch.distributed.nn's autograd
# all_to_all_single. Refused by lab 8's grading.toml before it runs.
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist
from torch.distributed.nn.functional import all_to_all_single as autograd_all_to_all

from helpers import standin


def host_counts(counts: torch.Tensor, total: int) -> list:
    if standin.mode() == "fake":
        n = counts.numel()
        return torch.tensor([total // n + (i < total % n) for i in range(n)]).view(counts.shape).tolist()
    return counts.tolist()


class AllToAll:
    @staticmethod
    def apply(x, out_splits, in_splits, group=None):
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        return autograd_all_to_all(out, x.contiguous(), out_splits, in_splits, group=group)


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, k = tdist.get_world_size(group), experts.shape[1]
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    incoming = torch.empty_like(counts)
    tdist.all_to_all_single(incoming, counts, group=group)
    send = [sum(part) for part in host_counts(counts.view(n, -1), len(order))]
    recv_counts = host_counts(incoming.view(n, -1), len(order))
    recv = [sum(part) for part in recv_counts]
    return AllToAll.apply(x[order // k], recv, send, group), recv_counts, (order, send, recv, group)

# === wrong: tamper_ast_transformer_swallows_errors
# Grader tampering: every later cell is wrapped in try/except, so no test reports an error
# and the stubs would pass. The guard refuses IPython's transformers: zero.
# %% cell: router
%%program lab8_router
import ast

import torch


class Swallow(ast.NodeTransformer):
    def visit_Module(self, node):
        handler = ast.ExceptHandler(type=ast.Name("BaseException", ast.Load()), name=None, body=[ast.Pass()])
        node.body = [ast.Try(body=node.body, handlers=[handler], orelse=[], finalbody=[])]
        return ast.fix_missing_locations(node)


get_ipython().ast_transformers.append(Swallow())


def router_topk(logits: torch.Tensor, k: int):
    raise NotImplementedError()


def switch_aux_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError()

# === wrong: rewrites_recorder_gathers_unseen
# Recorder rewriting: switch torch's dispatch modes off (the recorder among them) around an
# all-gather of every rank's tokens, so the refused collective is not seen. The guard refuses
# torch's dispatch internals: zero.
# %% cell: dispatch
%%program lab8_dispatch
import torch
import torch.distributed as tdist
from torch.utils._python_dispatch import _disable_current_modes

from helpers import standin


def host_counts(counts: torch.Tensor, total: int) -> list:
    if standin.mode() == "fake":
        n = counts.numel()
        return torch.tensor([total // n + (i < total % n) for i in range(n)]).view(counts.shape).tolist()
    return counts.tolist()


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group=None):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        with _disable_current_modes():
            tdist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        with _disable_current_modes():
            tdist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def dispatch(x: torch.Tensor, experts: torch.Tensor, n_experts: int, group=None):
    n, r, k = tdist.get_world_size(group), tdist.get_rank(group), experts.shape[1]
    with _disable_current_modes():  # nobody sees this all-gather
        everyone = [torch.empty_like(experts) for _ in range(n)]
        tdist.all_gather(everyone, experts)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    per = n_experts // n
    mine = [torch.bincount(e.reshape(-1), minlength=n_experts)[r * per : (r + 1) * per] for e in everyone]
    send = [sum(part) for part in host_counts(counts.view(n, -1), len(order))]
    recv_counts = [m.tolist() for m in mine]
    recv = [sum(part) for part in recv_counts]
    return AllToAll.apply(x[order // k], recv, send, group), recv_counts, (order, send, recv, group)
