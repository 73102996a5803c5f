# Plausible wrong submissions for lab 6, used by tests/grading (format: helpers/course/grading/roundtrip.py).
# Each replaces one solution cell; the cells it does not name keep the solution, so every
# one of them must score strictly between zero and full marks (tamper_ and rewrites_recorder_:
# zero).

# === wrong: no_broadcast
# Trusts equal seeds: no broadcast at construction. Right when every rank seeds alike;
# the tests seed each rank differently, so the replicas never agree.
# %% cell: overlap_ddp
%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    """Data parallelism that overlaps: one asynchronous all-reduce per parameter, from its hook."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        self.pending = []  # (work, parameter) of the all-reduces in flight
        for p in module.parameters():  # each Parameter once, tied ones included
            if p.requires_grad:  # frozen: no gradient, nothing to send
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        # Send it now, wait later.
        self.pending.append((tdist.all_reduce(p.grad, async_op=True), p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every all-reduce started in this backward; leave each .grad the mean."""
        for work, p in self.pending:
            work.wait()
            p.grad /= self.world_size  # the all-reduce summed
        self.pending.clear()
        ### END SOLUTION

# === wrong: sums_without_averaging
# The all-reduce sums; finish() forgets to divide by the number of ranks: a step N times
# too large.
# %% cell: overlap_ddp
%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    """Data parallelism that overlaps: one asynchronous all-reduce per parameter, from its hook."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:  # replicas start from rank 0's state
            tdist.broadcast(t.data, src=0)
        self.pending = []  # (work, parameter) of the all-reduces in flight
        for p in module.parameters():  # each Parameter once, tied ones included
            if p.requires_grad:  # frozen: no gradient, nothing to send
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        # Send it now, wait later.
        self.pending.append((tdist.all_reduce(p.grad, async_op=True), p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every all-reduce started in this backward; leave each .grad the mean."""
        for work, p in self.pending:
            work.wait()
        self.pending.clear()
        ### END SOLUTION

# === wrong: waits_inside_the_hook
# Synchronous: each hook waits for its all-reduce. The result is right, but backward stops
# in every hook until all ranks have caught up, so nothing overlaps.
# %% cell: overlap_ddp
%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    """Data parallelism that overlaps: one asynchronous all-reduce per parameter, from its hook."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:  # replicas start from rank 0's state
            tdist.broadcast(t.data, src=0)
        self.pending = []  # (work, parameter) of the all-reduces in flight
        for p in module.parameters():  # each Parameter once, tied ones included
            if p.requires_grad:  # frozen: no gradient, nothing to send
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        # Send it now, wait later.
        tdist.all_reduce(p.grad)  # blocks until every rank has sent its part
        p.grad /= self.world_size

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every all-reduce started in this backward; leave each .grad the mean."""
        pass  # already averaged in the hooks
        ### END SOLUTION

# === wrong: reduces_after_backward_in_one_flat_call
# No hooks: finish() flattens every gradient after backward and sends one all-reduce.
# Right, and cheap in messages, but nothing travels while backward runs.
# %% cell: overlap_ddp
%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    """Data parallelism that overlaps: one asynchronous all-reduce per parameter, from its hook."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:  # replicas start from rank 0's state
            tdist.broadcast(t.data, src=0)
        self.pending = []  # (work, parameter) of the all-reduces in flight

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        # Send it now, wait later.
        self.pending.append((tdist.all_reduce(p.grad, async_op=True), p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every all-reduce started in this backward; leave each .grad the mean."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.flatten() for p in params])
        tdist.all_reduce(flat)
        flat /= self.world_size
        for p, piece in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(piece.view_as(p))
        ### END SOLUTION

# === wrong: tied_hooked_twice
# Registers its hooks module by module (parameters(recurse=False) of each module): the
# tied embedding, which belongs to two modules, gets two hooks, so its gradient is all-reduced
# twice and divided twice.
# %% cell: overlap_ddp
%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    """Data parallelism that overlaps: one asynchronous all-reduce per parameter, from its hook."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:  # replicas start from rank 0's state
            tdist.broadcast(t.data, src=0)
        self.pending = []  # (work, parameter) of the all-reduces in flight
        for m in module.modules():
            for p in m.parameters(recurse=False):
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        # Send it now, wait later.
        self.pending.append((tdist.all_reduce(p.grad, async_op=True), p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every all-reduce started in this backward; leave each .grad the mean."""
        for work, p in self.pending:
            work.wait()
            p.grad /= self.world_size  # the all-reduce summed
        self.pending.clear()
        ### END SOLUTION

# === wrong: decoy_zeros_on_the_wire
# A decoy: the all-reduces have the right sizes and start from the right hooks, but carry
# zeros; the gradients themselves go through files, which finish() reads and averages.
# %% cell: overlap_ddp
%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        self.rank = tdist.get_rank()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.pending = []
        self.step = 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _path(self, rank, i):
        return f"/tmp/lab6-decoy-{self.world_size}-{rank}-{i}-{self.step}.pt"

    def _hook(self, p):
        i = next(k for k, q in enumerate(self.params) if q is p)
        torch.save(p.grad, self._path(self.rank, i))
        self.pending.append(tdist.all_reduce(torch.zeros_like(p.grad), async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        for work in self.pending:
            work.wait()  # every rank has written its files
        self.pending.clear()
        for i, p in enumerate(self.params):
            total = sum(torch.load(self._path(r, i)) for r in range(self.world_size))
            p.grad.copy_(total / self.world_size)
        self.step += 1

# === wrong: imports_torch_ddp
# An importable answer: torch's DistributedDataParallel inside the class. Refused by lab 6's
# grading.toml before it runs, so Part 1's tests fail; Part 2 keeps its points.
# %% cell: overlap_ddp
%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class OverlapDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.ddp = DistributedDataParallel(module)

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def finish(self) -> None:
        pass  # DDP has averaged by the end of backward

# === wrong: buckets_in_forward_order
# Fills the buckets in registration order: the first bucket is complete only at the end of
# backward, so nothing overlaps (and the buckets are not the ones the cap gives).
# %% cell: bucketed_ddp
%%program lab6_buckets
import torch
import torch.distributed as tdist
from torch import nn


def assign_buckets(params: list, cap_bytes: int) -> list:
    """Indices of params per bucket: reverse order, each bucket at most cap_bytes (or one param)."""
    buckets, size = [], 0
    for i in range(len(params)):
        nbytes = params[i].numel() * params[i].element_size()
        if buckets and size + nbytes <= cap_bytes:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


class BucketedDDP(nn.Module):
    """Data parallelism with buckets: one asynchronous all-reduce per bucket, when it is complete."""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = assign_buckets(self.params, bucket_cap_bytes)
        self.bucket_of = {id(self.params[i]): b for b, members in enumerate(self.buckets) for i in members}
        self.ready = [0] * len(self.buckets)  # gradients ready per bucket in this backward
        self.pending = []  # (work, bucket, flat tensor) in flight
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket's last gradient: send it now
            flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
            self.pending.append((tdist.all_reduce(flat, async_op=True), b, flat))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every bucket; copy the averages back into each .grad."""
        for work, b, flat in self.pending:
            work.wait()
            flat /= self.world_size
            members = [self.params[i] for i in self.buckets[b]]
            for p, piece in zip(members, flat.split([m.numel() for m in members])):
                p.grad.copy_(piece.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
        ### END SOLUTION

# === wrong: bucket_over_the_cap
# Torch's rule read as the lab's: a parameter joins while the bucket is still under the cap,
# so a bucket overshoots it by its last parameter.
# %% cell: bucketed_ddp
%%program lab6_buckets
import torch
import torch.distributed as tdist
from torch import nn


def assign_buckets(params: list, cap_bytes: int) -> list:
    """Indices of params per bucket: reverse order, each bucket at most cap_bytes (or one param)."""
    buckets, size = [], 0
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        if buckets and size < cap_bytes:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


class BucketedDDP(nn.Module):
    """Data parallelism with buckets: one asynchronous all-reduce per bucket, when it is complete."""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = assign_buckets(self.params, bucket_cap_bytes)
        self.bucket_of = {id(self.params[i]): b for b, members in enumerate(self.buckets) for i in members}
        self.ready = [0] * len(self.buckets)  # gradients ready per bucket in this backward
        self.pending = []  # (work, bucket, flat tensor) in flight
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket's last gradient: send it now
            flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
            self.pending.append((tdist.all_reduce(flat, async_op=True), b, flat))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every bucket; copy the averages back into each .grad."""
        for work, b, flat in self.pending:
            work.wait()
            flat /= self.world_size
            members = [self.params[i] for i in self.buckets[b]]
            for p, piece in zip(members, flat.split([m.numel() for m in members])):
                p.grad.copy_(piece.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
        ### END SOLUTION

# === wrong: deciding_cap_is_strict
# 'Below the cap' instead of 'at most the cap': wrong only when a bucket fills the cap
# exactly, which the visible tests never do and the hidden caps always do.
# %% cell: bucketed_ddp
%%program lab6_buckets
import torch
import torch.distributed as tdist
from torch import nn


def assign_buckets(params: list, cap_bytes: int) -> list:
    """Indices of params per bucket: reverse order, each bucket at most cap_bytes (or one param)."""
    buckets, size = [], 0
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        if buckets and size + nbytes < cap_bytes:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


class BucketedDDP(nn.Module):
    """Data parallelism with buckets: one asynchronous all-reduce per bucket, when it is complete."""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = assign_buckets(self.params, bucket_cap_bytes)
        self.bucket_of = {id(self.params[i]): b for b, members in enumerate(self.buckets) for i in members}
        self.ready = [0] * len(self.buckets)  # gradients ready per bucket in this backward
        self.pending = []  # (work, bucket, flat tensor) in flight
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket's last gradient: send it now
            flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
            self.pending.append((tdist.all_reduce(flat, async_op=True), b, flat))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every bucket; copy the averages back into each .grad."""
        for work, b, flat in self.pending:
            work.wait()
            flat /= self.world_size
            members = [self.params[i] for i in self.buckets[b]]
            for p, piece in zip(members, flat.split([m.numel() for m in members])):
                p.grad.copy_(piece.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
        ### END SOLUTION

# === wrong: bucketed_forgets_frozen
# Buckets every parameter, frozen ones included (hooks only where there is a gradient): a
# bucket holding the frozen layer never completes, and its gradients are never averaged.
# %% cell: bucketed_ddp
%%program lab6_buckets
import torch
import torch.distributed as tdist
from torch import nn


def assign_buckets(params: list, cap_bytes: int) -> list:
    """Indices of params per bucket: reverse order, each bucket at most cap_bytes (or one param)."""
    buckets, size = [], 0
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        if buckets and size + nbytes <= cap_bytes:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


class BucketedDDP(nn.Module):
    """Data parallelism with buckets: one asynchronous all-reduce per bucket, when it is complete."""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = list(module.parameters())
        self.buckets = assign_buckets(self.params, bucket_cap_bytes)
        self.bucket_of = {id(self.params[i]): b for b, members in enumerate(self.buckets) for i in members}
        self.ready = [0] * len(self.buckets)  # gradients ready per bucket in this backward
        self.pending = []  # (work, bucket, flat tensor) in flight
        for p in self.params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket's last gradient: send it now
            flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
            self.pending.append((tdist.all_reduce(flat, async_op=True), b, flat))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every bucket; copy the averages back into each .grad."""
        for work, b, flat in self.pending:
            work.wait()
            flat /= self.world_size
            members = [self.params[i] for i in self.buckets[b]]
            for p, piece in zip(members, flat.split([m.numel() for m in members])):
                p.grad.copy_(piece.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
        ### END SOLUTION

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# tamper_ and rewrites_recorder_ reach into the grader and must score zero; imports_ is
# refused before it runs (grading.toml); decoy_ and deciding_ are caught by what the tests check.

# === wrong: tamper_ast_transformer_swallows_errors
# Grader tampering: every later cell is wrapped in try/except, so no test reports an error.
# The guard refuses IPython's transformers: zero.
# %% cell: bucketed_ddp
%%program lab6_buckets
import ast

import torch
import torch.distributed as tdist
from torch import nn


class Swallow(ast.NodeTransformer):
    def visit_Module(self, node):
        handler = ast.ExceptHandler(type=ast.Name("BaseException", ast.Load()), name=None, body=[ast.Pass()])
        node.body = [ast.Try(body=node.body, handlers=[handler], orelse=[], finalbody=[])]
        return ast.fix_missing_locations(node)


get_ipython().ast_transformers.append(Swallow())


def assign_buckets(params: list, cap_bytes: int) -> list:
    raise NotImplementedError()


class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        raise NotImplementedError()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        raise NotImplementedError()

# === wrong: rewrites_recorder_unseen_flat_reduce
# Recorder rewriting: switch torch's dispatch modes off (the recorder among them) around one
# flat all-reduce after backward, so the tests would see no late all-reduce. The guard refuses
# torch's dispatch internals: zero.
# %% cell: bucketed_ddp
%%program lab6_buckets
import torch
import torch.distributed as tdist
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes


def assign_buckets(params: list, cap_bytes: int) -> list:
    """Indices of params per bucket: reverse order, each bucket at most cap_bytes (or one param)."""
    buckets, size = [], 0
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        if buckets and size + nbytes <= cap_bytes:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


class BucketedDDP(nn.Module):
    """Data parallelism with buckets: one asynchronous all-reduce per bucket, when it is complete."""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = assign_buckets(self.params, bucket_cap_bytes)
        self.bucket_of = {id(self.params[i]): b for b, members in enumerate(self.buckets) for i in members}
        self.ready = [0] * len(self.buckets)  # gradients ready per bucket in this backward
        self.pending = []  # (work, bucket, flat tensor) in flight
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket's last gradient: send it now
            flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
            with _disable_current_modes():
                self.pending.append((tdist.all_reduce(flat, async_op=True), b, flat))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every bucket; copy the averages back into each .grad."""
        for work, b, flat in self.pending:
            work.wait()
            flat /= self.world_size
            members = [self.params[i] for i in self.buckets[b]]
            for p, piece in zip(members, flat.split([m.numel() for m in members])):
                p.grad.copy_(piece.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
        ### END SOLUTION

# === wrong: hooks_wait_except_on_rank_0
# Waits for each all-reduce inside its hook "so that a gradient is never read half-reduced",
# except on rank 0, which is left free because it broadcast the start. Every gradient, message
# and order is right, and rank 0's backward returns without waiting; but on every other rank
# backward stops in each hook until all ranks have caught up, so nothing overlaps there. Only
# a hold on rank 0, waiting for another rank's backward to return, shows it.
# %% cell: overlap_ddp
%%program lab6_overlap
import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        self.rank = tdist.get_rank()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.pending = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        work = tdist.all_reduce(p.grad, async_op=True)
        if self.rank != 0:
            work.wait()  # the reduced gradient is ready before backward goes on
        self.pending.append((work, p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        for work, p in self.pending:
            work.wait()
            p.grad /= self.world_size
        self.pending.clear()

# === wrong: calls_the_tests_reference_buckets
# The tests' reference (reverse_buckets, which the lab's imports cell takes from its checks)
# called from the learner's own cell: on 7718dfa it was in the sandbox and this scored 18/18.
# It is absent from the sandbox now: the bucket tests fail, the overlap tests pass.
# %% cell: bucketed_ddp
%%program lab6_buckets
import torch
import torch.distributed as tdist
from torch import nn


def assign_buckets(params: list, cap_bytes: int) -> list:
    """Indices of params per bucket: reverse order, each bucket at most cap_bytes (or one param)."""
    # The notebook already has the tests' own answer: use it.
    return reverse_buckets([p.numel() for p in params], params[0].element_size(), cap_bytes)


class BucketedDDP(nn.Module):
    """Data parallelism with buckets: one asynchronous all-reduce per bucket, when it is complete."""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = assign_buckets(self.params, bucket_cap_bytes)
        self.bucket_of = {id(self.params[i]): b for b, members in enumerate(self.buckets) for i in members}
        self.ready = [0] * len(self.buckets)  # gradients ready per bucket in this backward
        self.pending = []  # (work, bucket, flat tensor) in flight
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket's last gradient: send it now
            flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
            self.pending.append((tdist.all_reduce(flat, async_op=True), b, flat))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every bucket; copy the averages back into each .grad."""
        for work, b, flat in self.pending:
            work.wait()
            flat /= self.world_size
            members = [self.params[i] for i in self.buckets[b]]
            for p, piece in zip(members, flat.split([m.numel() for m in members])):
                p.grad.copy_(piece.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
        ### END SOLUTION

# === wrong: hooks_wait_in_a_polling_loop_with_sleep_timeout
# A blocking hook polling with short sleeps and a 0.25 s give-up (under the 1 s
# of sleep the relay once needed to see a wait): the relay sees it asleep with nothing sent.
# %% cell: overlap_ddp
%%program lab6_overlap
import time

import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.pending = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        work = tdist.all_reduce(p.grad, async_op=True)
        for _ in range(25):
            if work.is_completed():
                break
            time.sleep(0.01)
        self.pending.append((work, p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        for work, p in self.pending:
            work.wait()
            p.grad /= self.world_size
        self.pending.clear()

# === wrong: both_ddps_spin_in_their_hooks
# A blocking DDP written as a busy poll (never asleep) that gives up after 0.3 s, in both
# DDPs: each hook waits for its all-reduce before backward goes on. On a real cluster the
# all-reduce completes in microseconds and every hook blocks: no overlap at all. Here the
# reply never comes while the hook polls; the relay sees the CPU it burns with nothing sent.
# Both hook tests fail; the bucket assignment and the values still earn their marks. (The
# same spin in OverlapDDP alone scored 15/18; its relay-level case is test_relay.py's
# test_a_hook_that_waits_with_a_time_limit_fails.)
# %% cell: bucketed_ddp
%%program lab6_buckets
import time

import torch
import torch.distributed as tdist
from torch import nn


def assign_buckets(params: list, cap_bytes: int) -> list:
    """Indices of params per bucket: reverse order, each bucket at most cap_bytes (or one param)."""
    buckets, size = [], 0
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        if buckets and size + nbytes <= cap_bytes:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


class BucketedDDP(nn.Module):
    """Data parallelism with buckets: one asynchronous all-reduce per bucket, when it is complete."""

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = assign_buckets(self.params, bucket_cap_bytes)
        self.bucket_of = {id(self.params[i]): b for b, members in enumerate(self.buckets) for i in members}
        self.ready = [0] * len(self.buckets)  # gradients ready per bucket in this backward
        self.pending = []  # (work, bucket, flat tensor) in flight
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        """Registered on each trainable p; autograd calls it once p.grad is complete."""
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket's last gradient: send it now
            flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
            work = tdist.all_reduce(flat, async_op=True)
            end = time.perf_counter() + 0.3
            while not work.is_completed() and time.perf_counter() < end:
                pass  # block until this bucket's all-reduce is done
            self.pending.append((work, b, flat))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        """Wait for every bucket; copy the averages back into each .grad."""
        for work, b, flat in self.pending:
            work.wait()
            flat /= self.world_size
            members = [self.params[i] for i in self.buckets[b]]
            for p, piece in zip(members, flat.split([m.numel() for m in members])):
                p.grad.copy_(piece.view_as(p))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)

# %% cell: overlap_ddp
%%program lab6_overlap
import time

import torch
import torch.distributed as tdist
from torch import nn


class OverlapDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = tdist.get_world_size()
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)
        self.pending = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.Tensor) -> None:
        work = tdist.all_reduce(p.grad, async_op=True)
        end = time.perf_counter() + 0.3
        while not work.is_completed() and time.perf_counter() < end:
            pass  # block until the all-reduce is done
        self.pending.append((work, p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        for work, p in self.pending:
            work.wait()
            p.grad /= self.world_size
        self.pending.clear()
