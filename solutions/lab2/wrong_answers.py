# Plausible wrong submissions for lab 2, used by tests/grading (format: helpers/course/grading/roundtrip.py).
# Each replaces one or two solution cells; the cells it does not name keep the solution, so
# every one of them must score strictly between zero and full marks.

# === wrong: by_whole_tensors
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    # ZeroRedundancyOptimizer's idea: whole tensors per rank, each to the emptiest rank,
    # each broadcast by its owner after the step. The weights are right; one big tensor
    # makes one rank hold far more optimizer state than its share.
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size, self.rank = d.world_size, d.rank
        load = [0] * d.world_size
        self.owner = {}
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            r = load.index(min(load))
            self.owner[i] = r
            load[r] += self.params[i].numel()
        mine = [p for i, p in enumerate(self.params) if self.owner[i] == d.rank]
        self.optimizer = optimizer_class(mine or [torch.zeros(0, requires_grad=True)], **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        grads /= self.world_size
        offset = 0
        for p in self.params:
            p.grad.copy_(grads[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.optimizer.step()
        for i, p in enumerate(self.params):
            tdist.broadcast(p, src=self.owner[i])

# === wrong: forgets_all_gather
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    # Updates its own piece and writes it back into its own weights, but never sends it:
    # every rank's other weights stay at their initial values.
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.numel = sum(p.numel() for p in self.params)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        grads /= self.world_size
        self.shard.grad = grads[self.start:self.end].clone()
        self.optimizer.step()
        flat = torch.cat([p.reshape(-1) for p in self.params])
        flat[self.start:self.end] = self.shard
        offset = 0
        for p in self.params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

# === wrong: full_adam_state_everywhere
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    # "Every rank has the averaged gradient, so every rank can update everything": right
    # weights and no all-gather needed, but that is DDP: Adam's state is on every rank whole.
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.optimizer = optimizer_class(self.params, **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        grads /= self.world_size
        offset = 0
        for p in self.params:
            p.grad.copy_(grads[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.optimizer.step()

# === wrong: sums_gradients
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist

from helpers import compat


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    # Sums the gradients and forgets to divide by N. Adam hardly notices (it divides m by
    # sqrt(v)); SGD with momentum takes N times too large steps.
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        self.shard.grad = grads[self.start:self.end].clone()
        self.optimizer.step()
        mine = torch.zeros(self.shard_size, dtype=self.shard.dtype)
        mine[: self.end - self.start] = self.shard
        full = torch.empty(self.world_size * self.shard_size, dtype=mine.dtype)
        compat.all_gather_single(full, mine)
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

# === wrong: averages_twice
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist

from helpers import compat


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    # Averages each parameter's gradient (as in lab 1), then averages the flat vector again:
    # twice the bytes, and the gradient is divided by N twice.
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            tdist.all_reduce(p.grad)
            p.grad /= self.world_size
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        grads /= self.world_size
        self.shard.grad = grads[self.start:self.end].clone()
        self.optimizer.step()
        mine = torch.zeros(self.shard_size, dtype=self.shard.dtype)
        mine[: self.end - self.start] = self.shard
        full = torch.empty(self.world_size * self.shard_size, dtype=mine.dtype)
        compat.all_gather_single(full, mine)
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

# === wrong: no_gradient_average
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist

from helpers import compat


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    # "The all-gather makes the ranks agree": each rank updates its piece with its own
    # data's gradient only. The ranks agree, on the wrong weights.
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.shard.grad = grads[self.start:self.end].clone()
        self.optimizer.step()
        mine = torch.zeros(self.shard_size, dtype=self.shard.dtype)
        mine[: self.end - self.start] = self.shard
        full = torch.empty(self.world_size * self.shard_size, dtype=mine.dtype)
        compat.all_gather_single(full, mine)
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

# === wrong: forgets_fp32_master_copy
# %% cell: memory_estimate
def model_state_bytes(num_params: int, dp: int, stage: int, precision: str = "fp32") -> tuple[float, float, float]:
    # Mixed precision as "Adam's m and v in fp32": forgets the fp32 master weights (8, not 12).
    per_param = {"fp32": (4, 4, 8), "mixed": (2, 2, 8)}
    if precision not in per_param:
        raise ValueError(f"precision={precision!r}: use 'fp32' or 'mixed'")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r}: use 0 (DDP), 1, 2 or 3 (FSDP)")
    w, g, o = (num_params * b for b in per_param[precision])
    return (w / dp if stage >= 3 else w, g / dp if stage >= 2 else g, o / dp if stage >= 1 else o)

# === wrong: stage_off_by_one
# %% cell: memory_estimate
def model_state_bytes(num_params: int, dp: int, stage: int, precision: str = "fp32") -> tuple[float, float, float]:
    # Stage 1 shards the gradients too (that is stage 2): one stage ahead everywhere.
    per_param = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}
    if precision not in per_param:
        raise ValueError(f"precision={precision!r}: use 'fp32' or 'mixed'")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r}: use 0 (DDP), 1, 2 or 3 (FSDP)")
    w, g, o = (num_params * b for b in per_param[precision])
    return (w / dp if stage >= 2 else w, g / dp if stage >= 1 else g, o / dp if stage >= 1 else o)

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# tamper_ and rewrites_recorder_ reach into the grader and must score zero; imports_ is
# refused before it runs; decoy_ and deciding_ are caught by what the tests check.

# === wrong: tamper_input_transformer
# Grader tampering: a text transformer wraps every later cell in try/except, so no test
# reports an error and the stub passes. The guard refuses get_ipython: zero.
# %% cell: memory_estimate
get_ipython().input_transformers_post.append(
    lambda lines: ["try:\n"] + ["    " + line for line in lines] + ["\nexcept BaseException:\n", "    pass\n"]
)


def model_state_bytes(num_params: int, dp: int, stage: int, precision: str = "fp32") -> tuple[float, float, float]:
    raise NotImplementedError()

# === wrong: imports_zero_redundancy_optimizer
# A library shortcut: torch's ZeroRedundancyOptimizer inside the wrapper. Refused by lab 2's
# grading.toml before it runs (it also splits by whole tensors, which the lab asks you not to).
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist
from torch.distributed.optim import ZeroRedundancyOptimizer


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.optimizer = ZeroRedundancyOptimizer(self.params, optimizer_class, **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            tdist.all_reduce(p.grad)
            p.grad /= self.world_size
        self.optimizer.step()

# === wrong: imports_copy_of_the_estimate
# An importable answer: keep a reference to the workbook's estimator, made before the test
# switches it off. Refused by lab 2's grading.toml: the cell does not run.
# %% cell: memory_estimate
from helpers.parallel.sharded.memory import estimate


def model_state_bytes(num_params: int, dp: int, stage: int, precision: str = "fp32") -> tuple[float, float, float]:
    states = estimate(num_params, dp, stage, precision)
    return states.params, states.grads, states.optimizer

# === wrong: decoy_through_files
# A decoy: the all-reduce and the all-gather the tests count carry zeros; the gradients and
# the updated shards travel through files. Right weights, right sizes; the content checks
# and the tamper-in-flight check see that the messages carry nothing.
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size, self.rank = d.world_size, d.rank
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.tag = f"{self.numel}-{float(flat[0]):.6f}"  # one run's files, not another's
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        torch.save(grads, f"/tmp/lab2-decoy-grad-{self.tag}-{self.rank}.pt")
        tdist.all_reduce(torch.zeros_like(grads))  # counted by the tests, carries nothing
        mean = sum(torch.load(f"/tmp/lab2-decoy-grad-{self.tag}-{r}.pt") for r in range(self.world_size))
        self.shard.grad = (mean / self.world_size)[self.start:self.end].clone()
        self.optimizer.step()
        torch.save(self.shard.clone(), f"/tmp/lab2-decoy-shard-{self.tag}-{self.rank}.pt")
        out = torch.empty(self.world_size * self.shard_size, dtype=self.shard.dtype)
        tdist.all_gather_into_tensor(out, torch.zeros(self.shard_size, dtype=self.shard.dtype))
        full = torch.cat([torch.load(f"/tmp/lab2-decoy-shard-{self.tag}-{r}.pt") for r in range(self.world_size)])
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

# === wrong: decoy_full_adamw_behind_a_shard
# A decoy: a full AdamW on every rank computes the weights, while self.optimizer, over a
# shard, runs beside it so that the state the tests read looks sharded and the all-gather
# carries the right piece. The memory the rank allocates shows the full state, and a
# piece changed in flight does not reach the weights.
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist

from helpers import compat


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)  # what the tests look at
        self.hidden = optimizer_class(self.params, **defaults)  # what does the work

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        grads /= self.world_size
        self.shard.grad = grads[self.start:self.end].clone()
        self.optimizer.step()
        mine = torch.zeros(self.shard_size, dtype=self.shard.dtype)
        mine[: self.end - self.start] = self.shard
        full = torch.empty(self.world_size * self.shard_size, dtype=mine.dtype)
        compat.all_gather_single(full, mine)  # the right piece, gathered and then ignored
        offset = 0
        for p in self.params:
            p.grad.copy_(grads[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.hidden.step()

# === wrong: rewrites_recorder_allows_broadcast
# Recorder rewriting: widen the recorder's allow list so that a refused collective goes
# through. The guard refuses the dispatch internals: zero.
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist
from torch.utils._python_dispatch import _get_current_dispatch_mode


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class ShardedOptimizer:
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.optimizer = optimizer_class(self.params, **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        recorder = _get_current_dispatch_mode()
        recorder.allow = recorder.allow | {"all_reduce_coalesced"}
        tdist.all_reduce_coalesced([p.grad for p in self.params])
        for p in self.params:
            p.grad /= self.world_size
        self.optimizer.step()

# === wrong: deciding_unclamped_start
# Only the deciding cases catch it: the start of a piece is not clamped to P. Right while
# N (N - 1) <= P, as in every visible test; the hidden tests always include fewer elements.
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist

from helpers import compat


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = rank * size
    return start, min(start + size, numel)


class ShardedOptimizer:
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        grads /= self.world_size
        self.shard.grad = grads[self.start:self.end].clone()
        self.optimizer.step()
        mine = torch.zeros(self.shard_size, dtype=self.shard.dtype, device=self.shard.device)
        mine[: self.end - self.start] = self.shard
        full = torch.empty(self.world_size * self.shard_size, dtype=mine.dtype, device=mine.device)
        compat.all_gather_single(full, mine)
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

# === wrong: zero3_keeps_full_weights
# %% cell: zero3
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from helpers import compat


class ShardedLinear(nn.Module):
    # Saves the gathered weights for backward instead of gathering them again: right numbers,
    # but every layer's full weights stay alive from forward to backward (FSDP without the memory).
    """ZeRO-3 for one nn.Linear: this rank keeps only `self.shard`, its S = ceil(P/N)
    elements of the zero-padded flat vector [weight (row by row), bias]."""

    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world = d.world_size
        self.numel = linear.weight.numel() + linear.bias.numel()  # P
        self.size = math.ceil(self.numel / self.world)  # S: every rank's shard, padding included
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = F.pad(flat, (0, self.size * self.world - self.numel))  # [S N]
        self.shard = nn.Parameter(flat[d.rank * self.size : (d.rank + 1) * self.size].clone())

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One all-gather of every rank's shard: the full (weight [out, in], bias [out])."""
        full = torch.empty(self.size * self.world, dtype=self.shard.dtype, device=self.shard.device)
        compat.all_gather_single(full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        return full[:n_weight].view(self.out_features, self.in_features), full[n_weight : self.numel]

    def forward(self, x):
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """forward: gather, compute, keep no full weights; backward: gather again, reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x, weight)  # keep them: no second all-gather
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        layer = ctx.layer
        grad_x = grad_out @ weight
        g2, x2 = grad_out.reshape(-1, layer.out_features), x.reshape(-1, layer.in_features)
        full = torch.cat([(g2.T @ x2).reshape(-1), g2.sum(0)])  # [P], laid out like the weights
        full = F.pad(full, (0, layer.size * layer.world - layer.numel))  # [S N]
        grad_shard = torch.empty(layer.size, dtype=full.dtype, device=full.device)
        compat.reduce_scatter_single(grad_shard, full)  # the sum of my S elements over the ranks
        return grad_x, grad_shard / layer.world, None

# === wrong: zero3_all_reduce_then_slice
# %% cell: zero3
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from helpers import compat


class ShardedLinear(nn.Module):
    # All-reduces the whole gradient and keeps its own slice: the right gradient, at twice the
    # reduce-scatter's traffic, and a full gradient held on every rank.
    """ZeRO-3 for one nn.Linear: this rank keeps only `self.shard`, its S = ceil(P/N)
    elements of the zero-padded flat vector [weight (row by row), bias]."""

    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world = d.world_size
        self.numel = linear.weight.numel() + linear.bias.numel()  # P
        self.size = math.ceil(self.numel / self.world)  # S: every rank's shard, padding included
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = F.pad(flat, (0, self.size * self.world - self.numel))  # [S N]
        self.shard = nn.Parameter(flat[d.rank * self.size : (d.rank + 1) * self.size].clone())

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One all-gather of every rank's shard: the full (weight [out, in], bias [out])."""
        full = torch.empty(self.size * self.world, dtype=self.shard.dtype, device=self.shard.device)
        compat.all_gather_single(full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        return full[:n_weight].view(self.out_features, self.in_features), full[n_weight : self.numel]

    def forward(self, x):
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """forward: gather, compute, keep no full weights; backward: gather again, reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x)  # not the weights: backward gathers them again
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        weight, _ = layer.gather()  # the second all-gather
        grad_x = grad_out @ weight
        g2, x2 = grad_out.reshape(-1, layer.out_features), x.reshape(-1, layer.in_features)
        full = torch.cat([(g2.T @ x2).reshape(-1), g2.sum(0)])  # [P], laid out like the weights
        full = F.pad(full, (0, layer.size * layer.world - layer.numel))  # [S N]
        tdist.all_reduce(full)
        rank = tdist.get_rank()
        grad_shard = full[rank * layer.size : (rank + 1) * layer.size]
        return grad_x, grad_shard / layer.world, None

# === wrong: zero3_sums_gradients
# %% cell: zero3
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from helpers import compat


class ShardedLinear(nn.Module):
    # Forgets that the reduce-scatter sums: the gradient is N times the mean.
    """ZeRO-3 for one nn.Linear: this rank keeps only `self.shard`, its S = ceil(P/N)
    elements of the zero-padded flat vector [weight (row by row), bias]."""

    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world = d.world_size
        self.numel = linear.weight.numel() + linear.bias.numel()  # P
        self.size = math.ceil(self.numel / self.world)  # S: every rank's shard, padding included
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = F.pad(flat, (0, self.size * self.world - self.numel))  # [S N]
        self.shard = nn.Parameter(flat[d.rank * self.size : (d.rank + 1) * self.size].clone())

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One all-gather of every rank's shard: the full (weight [out, in], bias [out])."""
        full = torch.empty(self.size * self.world, dtype=self.shard.dtype, device=self.shard.device)
        compat.all_gather_single(full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        return full[:n_weight].view(self.out_features, self.in_features), full[n_weight : self.numel]

    def forward(self, x):
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """forward: gather, compute, keep no full weights; backward: gather again, reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x)  # not the weights: backward gathers them again
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        weight, _ = layer.gather()  # the second all-gather
        grad_x = grad_out @ weight
        g2, x2 = grad_out.reshape(-1, layer.out_features), x.reshape(-1, layer.in_features)
        full = torch.cat([(g2.T @ x2).reshape(-1), g2.sum(0)])  # [P], laid out like the weights
        full = F.pad(full, (0, layer.size * layer.world - layer.numel))  # [S N]
        grad_shard = torch.empty(layer.size, dtype=full.dtype, device=full.device)
        compat.reduce_scatter_single(grad_shard, full)  # the sum of my S elements over the ranks
        return grad_x, grad_shard, None

# === wrong: zero3_decoy_private_copy
# %% cell: zero3
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from helpers import compat


class ShardedLinear(nn.Module):
    # A decoy: every rank keeps a private full copy of the layer and computes with it; the
    # all-gathers run, with the right shard in them, and their result is thrown away.
    """ZeRO-3 for one nn.Linear: this rank keeps only `self.shard`, its S = ceil(P/N)
    elements of the zero-padded flat vector [weight (row by row), bias]."""

    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world = d.world_size
        self.numel = linear.weight.numel() + linear.bias.numel()  # P
        self.size = math.ceil(self.numel / self.world)  # S: every rank's shard, padding included
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = F.pad(flat, (0, self.size * self.world - self.numel))  # [S N]
        self.shard = nn.Parameter(flat[d.rank * self.size : (d.rank + 1) * self.size].clone())
        self.private = (linear.weight.detach().clone(), linear.bias.detach().clone())

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One all-gather of every rank's shard: the full (weight [out, in], bias [out])."""
        full = torch.empty(self.size * self.world, dtype=self.shard.dtype, device=self.shard.device)
        compat.all_gather_single(full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        return full[:n_weight].view(self.out_features, self.in_features), full[n_weight : self.numel]

    def forward(self, x):
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """forward: gather, compute, keep no full weights; backward: gather again, reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        layer.gather()  # for show
        weight, bias = layer.private
        ctx.save_for_backward(x)  # not the weights: backward gathers them again
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        layer.gather()  # for show
        weight = layer.private[0]
        grad_x = grad_out @ weight
        g2, x2 = grad_out.reshape(-1, layer.out_features), x.reshape(-1, layer.in_features)
        full = torch.cat([(g2.T @ x2).reshape(-1), g2.sum(0)])  # [P], laid out like the weights
        full = F.pad(full, (0, layer.size * layer.world - layer.numel))  # [S N]
        grad_shard = torch.empty(layer.size, dtype=full.dtype, device=full.device)
        compat.reduce_scatter_single(grad_shard, full)  # the sum of my S elements over the ranks
        return grad_x, grad_shard / layer.world, None

# === wrong: zero3_no_padding
# %% cell: zero3
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from helpers import compat


class ShardedLinear(nn.Module):
    # Shards without padding: the last rank's piece is shorter, and the all-gather needs equal pieces.
    """ZeRO-3 for one nn.Linear: this rank keeps only `self.shard`, its S = ceil(P/N)
    elements of the zero-padded flat vector [weight (row by row), bias]."""

    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world = d.world_size
        self.numel = linear.weight.numel() + linear.bias.numel()  # P
        self.size = math.ceil(self.numel / self.world)  # S: every rank's shard, padding included
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        self.shard = nn.Parameter(flat[d.rank * self.size : (d.rank + 1) * self.size].clone())

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One all-gather of every rank's shard: the full (weight [out, in], bias [out])."""
        full = torch.empty(self.size * self.world, dtype=self.shard.dtype, device=self.shard.device)
        compat.all_gather_single(full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        return full[:n_weight].view(self.out_features, self.in_features), full[n_weight : self.numel]

    def forward(self, x):
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """forward: gather, compute, keep no full weights; backward: gather again, reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x)  # not the weights: backward gathers them again
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        weight, _ = layer.gather()  # the second all-gather
        grad_x = grad_out @ weight
        g2, x2 = grad_out.reshape(-1, layer.out_features), x.reshape(-1, layer.in_features)
        full = torch.cat([(g2.T @ x2).reshape(-1), g2.sum(0)])  # [P], laid out like the weights
        full = F.pad(full, (0, layer.size * layer.world - layer.numel))  # [S N]
        grad_shard = torch.empty(layer.size, dtype=full.dtype, device=full.device)
        compat.reduce_scatter_single(grad_shard, full)  # the sum of my S elements over the ranks
        return grad_x, grad_shard / layer.world, None

# === wrong: imports_fsdp_by_hand_for_zero3
# %% cell: zero3
import torch
from torch import nn

from helpers.parallel.sharded.fsdp_by_hand import ShardedUnit


class ShardedLinear(nn.Module):
    # Borrows notebook 04's FSDP unit (one Linear is a unit of its own) instead of writing it.
    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.unit = ShardedUnit(linear, d.rank, d.world_size)
        self.shard = self.unit.shard

    def gather(self):
        full = self.unit.all_gather()
        return self.unit.weights(full)["weight"], self.unit.weights(full)["bias"]

    def forward(self, x):
        return self.unit(x)


class GatheredLinear(torch.autograd.Function):
    pass

# === wrong: zero3_buffer_made_in_init
# %% cell: zero3
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from helpers import compat


class ShardedLinear(nn.Module):
    # Gathers into a buffer made once in __init__ and reused ("no allocation per call"): the
    # full vector of every layer then stays alive on every rank, between layers and between steps.
    """ZeRO-3 for one nn.Linear: this rank keeps only `self.shard`, its S = ceil(P/N)
    elements of the zero-padded flat vector [weight (row by row), bias]."""

    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world = d.world_size
        self.numel = linear.weight.numel() + linear.bias.numel()  # P
        self.size = math.ceil(self.numel / self.world)  # S: every rank's shard, padding included
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = F.pad(flat, (0, self.size * self.world - self.numel))  # [S N]
        self.shard = nn.Parameter(flat[d.rank * self.size : (d.rank + 1) * self.size].clone())
        self.buffer = torch.empty(self.size * self.world, dtype=flat.dtype)

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One all-gather of every rank's shard: the full (weight [out, in], bias [out])."""
        full = self.buffer
        compat.all_gather_single(full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        return full[:n_weight].view(self.out_features, self.in_features), full[n_weight : self.numel]

    def forward(self, x):
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """forward: gather, compute, keep no full weights; backward: gather again, reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x)  # not the weights: backward gathers them again
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        weight, _ = layer.gather()  # the second all-gather
        grad_x = grad_out @ weight
        g2, x2 = grad_out.reshape(-1, layer.out_features), x.reshape(-1, layer.in_features)
        full = torch.cat([(g2.T @ x2).reshape(-1), g2.sum(0)])  # [P], laid out like the weights
        full = F.pad(full, (0, layer.size * layer.world - layer.numel))  # [S N]
        grad_shard = torch.empty(layer.size, dtype=full.dtype, device=full.device)
        compat.reduce_scatter_single(grad_shard, full)  # the sum of my S elements over the ranks
        return grad_x, grad_shard / layer.world, None

# === wrong: zero3_shard_as_view
# %% cell: zero3
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from helpers import compat


class ShardedLinear(nn.Module):
    # Forgets .clone(): the shard is a view of the whole padded vector, which it keeps alive.
    """ZeRO-3 for one nn.Linear: this rank keeps only `self.shard`, its S = ceil(P/N)
    elements of the zero-padded flat vector [weight (row by row), bias]."""

    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world = d.world_size
        self.numel = linear.weight.numel() + linear.bias.numel()  # P
        self.size = math.ceil(self.numel / self.world)  # S: every rank's shard, padding included
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = F.pad(flat, (0, self.size * self.world - self.numel))  # [S N]
        self.shard = nn.Parameter(flat[d.rank * self.size : (d.rank + 1) * self.size])

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One all-gather of every rank's shard: the full (weight [out, in], bias [out])."""
        full = torch.empty(self.size * self.world, dtype=self.shard.dtype, device=self.shard.device)
        compat.all_gather_single(full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        return full[:n_weight].view(self.out_features, self.in_features), full[n_weight : self.numel]

    def forward(self, x):
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """forward: gather, compute, keep no full weights; backward: gather again, reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x)  # not the weights: backward gathers them again
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        weight, _ = layer.gather()  # the second all-gather
        grad_x = grad_out @ weight
        g2, x2 = grad_out.reshape(-1, layer.out_features), x.reshape(-1, layer.in_features)
        full = torch.cat([(g2.T @ x2).reshape(-1), g2.sum(0)])  # [P], laid out like the weights
        full = F.pad(full, (0, layer.size * layer.world - layer.numel))  # [S N]
        grad_shard = torch.empty(layer.size, dtype=full.dtype, device=full.device)
        compat.reduce_scatter_single(grad_shard, full)  # the sum of my S elements over the ranks
        return grad_x, grad_shard / layer.world, None

# === wrong: zero3_gathers_into_a_module_cache
# Wants forward to allocate nothing, so it keeps one gather buffer per size in a dictionary of
# the module, made when a layer is built and reused by every gather. Outputs, gradients and
# messages are right, the layer's own attributes hold only the shard, and forward allocates
# nothing new: yet every rank holds full-size weights between layers and between steps, outside
# the layer. Counting every tensor the rank can reach at the end of forward shows it.
# %% cell: zero3
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from helpers import compat

_GATHER_BUFFERS = {}  # (elements, dtype, device) -> a buffer shared by the layers of that size


def gather_buffer(numel, dtype, device):
    key = (numel, dtype, str(device))
    if key not in _GATHER_BUFFERS:
        _GATHER_BUFFERS[key] = torch.empty(numel, dtype=dtype, device=device)
    return _GATHER_BUFFERS[key]


class ShardedLinear(nn.Module):
    """ZeRO-3 for one nn.Linear: this rank keeps only `self.shard`, its S = ceil(P/N)
    elements of the zero-padded flat vector [weight (row by row), bias]."""

    def __init__(self, linear: nn.Linear, d):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.world = d.world_size
        self.numel = linear.weight.numel() + linear.bias.numel()
        self.size = math.ceil(self.numel / self.world)
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = F.pad(flat, (0, self.size * self.world - self.numel))
        self.shard = nn.Parameter(flat[d.rank * self.size : (d.rank + 1) * self.size].clone())
        gather_buffer(self.size * self.world, flat.dtype, flat.device)  # ready before the first call

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        full = gather_buffer(self.size * self.world, self.shard.dtype, self.shard.device)
        compat.all_gather_single(full, self.shard.detach())
        n_weight = self.out_features * self.in_features
        return full[:n_weight].view(self.out_features, self.in_features), full[n_weight : self.numel]

    def forward(self, x):
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, layer):
        weight, bias = layer.gather()
        ctx.save_for_backward(x)
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        weight, _ = layer.gather()
        grad_x = grad_out @ weight
        g2, x2 = grad_out.reshape(-1, layer.out_features), x.reshape(-1, layer.in_features)
        full = torch.cat([(g2.T @ x2).reshape(-1), g2.sum(0)])
        full = F.pad(full, (0, layer.size * layer.world - layer.numel))
        grad_shard = torch.empty(layer.size, dtype=full.dtype, device=full.device)
        compat.reduce_scatter_single(grad_shard, full)
        return grad_x, grad_shard / layer.world, None

# === wrong: ddp_adamw_in_a_helper_process_posing_as_zero1
# Issue 38's red team (13/13 at 91eb736): a full AdamW (whole parameters and state) in a
# process the rank forks, the rank showing ZeRO-1's memory; the sandbox now refuses the fork.
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist

from helpers import compat

_im = torch.importlib.import_module
_os = _im("os")
_bio = _im("io")


def _pack(obj):
    buf = _bio.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    return len(data).to_bytes(8, "little") + data


def _readn(fd, n):
    parts = []
    while n:
        chunk = _os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _unpack(fd):
    n = int.from_bytes(_readn(fd, 8), "little")
    return torch.load(_bio.BytesIO(_readn(fd, n)), weights_only=False)


def _writeall(fd, data):
    view = memoryview(data)
    while len(view):
        view = view[_os.write(fd, view):]


class _Vault:
    """A helper process: keeps tensors (and runs functions on them) outside the rank's memory."""

    def __init__(self, funcs=None):
        a_r, a_w = _os.pipe()
        b_r, b_w = _os.pipe()
        pid = _os.fork()
        if pid == 0:
            store, funcs = {}, funcs or {}
            while True:
                try:
                    cmd, key, val = _unpack(a_r)
                except EOFError:
                    _os.kill(_os.getpid(), 9)
                if cmd == "put":
                    store[key] = val
                elif cmd == "get":
                    _writeall(b_w, _pack(store.pop(key)))
                elif cmd == "add":
                    store.setdefault(key, []).append(val)
                elif cmd == "call":
                    _writeall(b_w, _pack(funcs[val](store)))

        self.w, self.r = a_w, b_r

    def put(self, key, val):
        _writeall(self.w, _pack(("put", key, val)))

    def add(self, key, val):
        _writeall(self.w, _pack(("add", key, val)))

    def get(self, key):
        _writeall(self.w, _pack(("get", key, None)))
        return _unpack(self.r)

    def call(self, name):
        _writeall(self.w, _pack(("call", None, name)))
        return _unpack(self.r)


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


def _init(store):
    flat, cls, defaults = store.pop("init")
    p = torch.nn.Parameter(flat.clone())
    store["p"], store["opt"] = p, cls([p], **defaults)
    return 0


def _step(store):
    grad, flat, start, end = store.pop("step")
    p, opt = store["p"], store["opt"]
    with torch.no_grad():
        p.copy_(flat)
    p.grad = grad
    opt.step()
    st = opt.state[p]
    return (p.detach()[start:end].clone(),
            {k: v[start:end].clone() for k, v in st.items() if torch.is_tensor(v) and v.dim() > 0},
            {k: v for k, v in st.items() if not (torch.is_tensor(v) and v.dim() > 0)})


class ShardedOptimizer:
    # DDP: every rank updates everything with a full AdamW, but that AdamW lives in a helper
    # process the rank forked, so the rank itself holds only a shard's worth of state.
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)
        self.vault = _Vault({"init": _init, "step": _step})
        self.vault.put("init", (flat, optimizer_class, defaults))
        self.vault.call("init")
        del flat

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        grads /= self.world_size
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.vault.put("step", (grads, flat, self.start, self.end))
        del grads, flat
        piece, state, scalars = self.vault.call("step")
        self.shard.copy_(piece)
        self.optimizer.state[self.shard] = {**scalars, **state}
        mine = torch.zeros(self.shard_size, dtype=self.shard.dtype)
        mine[: self.end - self.start] = self.shard
        full = torch.empty(self.world_size * self.shard_size, dtype=mine.dtype)
        compat.all_gather_single(full, mine)
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

# === wrong: ddp_adamw_state_parked_in_a_memfd_posing_as_zero1
# Issue 38's red team (13/13 at 91eb736): the whole AdamW state parked between steps in a
# memfd (written, never mapped: in no process's RSS nor any tmpfs); the sandbox refuses memfd.
# %% cell: zero1
%%program lab2_zero1
import math

import torch
import torch.distributed as tdist

from helpers import compat

_im = torch.importlib.import_module
_os = _im("os")
_bio = _im("io")


def _pack(obj):
    buf = _bio.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    return len(data).to_bytes(8, "little") + data


def _readn(fd, n):
    parts = []
    while n:
        chunk = _os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _unpack(fd):
    n = int.from_bytes(_readn(fd, 8), "little")
    return torch.load(_bio.BytesIO(_readn(fd, n)), weights_only=False)


def _writeall(fd, data):
    view = memoryview(data)
    while len(view):
        view = view[_os.write(fd, view):]


_im = torch.importlib.import_module
_os = _im("os")
_bio = _im("io")


def _pack(obj):
    buf = _bio.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    return len(data).to_bytes(8, "little") + data


def _readn(fd, n):
    parts = []
    while n:
        chunk = _os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _unpack(fd):
    n = int.from_bytes(_readn(fd, 8), "little")
    return torch.load(_bio.BytesIO(_readn(fd, n)), weights_only=False)


def _writeall(fd, data):
    view = memoryview(data)
    while len(view):
        view = view[_os.write(fd, view):]



class _Vault:
    """The same store in the rank's own process, but between calls its contents wait in a
    memfd (written, never mapped): kernel shmem that is neither the rank's RSS nor a tmpfs."""

    def __init__(self, funcs=None):
        self.funcs, self.fd = funcs or {}, None
        self.store = {}

    def _park(self):
        data = _pack(self.store)
        self.store = {}
        if self.fd is not None:
            _os.close(self.fd)
        self.fd = _os.memfd_create("state")
        _writeall(self.fd, data)
        del data

    def _unpark(self):
        if self.fd is None:
            return
        _os.lseek(self.fd, 0, 0)
        self.store = _unpack(self.fd)

    def put(self, key, val):
        self._unpark()
        self.store[key] = val
        self._park()

    def call(self, name):
        self._unpark()
        out = self.funcs[name](self.store)
        self._park()
        return out


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


def _init(store):
    flat, cls, defaults = store.pop("init")
    p = torch.nn.Parameter(flat.clone())
    store["p"], store["opt"] = p, cls([p], **defaults)
    return 0


def _step(store):
    grad, flat, start, end = store.pop("step")
    p, opt = store["p"], store["opt"]
    with torch.no_grad():
        p.copy_(flat)
    p.grad = grad
    opt.step()
    st = opt.state[p]
    return (p.detach()[start:end].clone(),
            {k: v[start:end].clone() for k, v in st.items() if torch.is_tensor(v) and v.dim() > 0},
            {k: v for k, v in st.items() if not (torch.is_tensor(v) and v.dim() > 0)})


class ShardedOptimizer:
    # DDP: every rank updates everything with a full AdamW, but that AdamW lives in a helper
    # process the rank forked, so the rank itself holds only a shard's worth of state.
    def __init__(self, params, d, optimizer_class=torch.optim.AdamW, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = d.world_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start, self.end = shard_range(self.numel, d.rank, self.world_size)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone()
        self.optimizer = optimizer_class([self.shard], **defaults)
        self.vault = _Vault({"init": _init, "step": _step})
        self.vault.put("init", (flat, optimizer_class, defaults))
        self.vault.call("init")
        del flat

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        tdist.all_reduce(grads)
        grads /= self.world_size
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.vault.put("step", (grads, flat, self.start, self.end))
        del grads, flat
        piece, state, scalars = self.vault.call("step")
        self.shard.copy_(piece)
        self.optimizer.state[self.shard] = {**scalars, **state}
        mine = torch.zeros(self.shard_size, dtype=self.shard.dtype)
        mine[: self.end - self.start] = self.shard
        full = torch.empty(self.world_size * self.shard_size, dtype=mine.dtype)
        compat.all_gather_single(full, mine)
        offset = 0
        for p in self.params:
            p.copy_(full[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
