# Plausible wrong submissions for lab 2, used by tests/grading (format: helpers/course/grading.py).
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
        tdist.all_gather_single(full, mine)
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
        tdist.all_gather_single(full, mine)
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
        tdist.all_gather_single(full, mine)
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
