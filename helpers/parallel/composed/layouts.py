"""The planner's layouts as real runs: one training step of a Llama 2 block stack, any layout.

    run = LayoutRun(d, Trial("dp=2 tp=2", dp=2, tp=2), args, batch=16, seq_len=64, meshes={})
    run.step()                        # this rank's share of one training step
    run.resident_bytes()              # what it holds between steps

A ``Trial`` names what the planner (helpers.parallel.composed.planner) can express: dp, tp, pp,
micro-batches per replica, the pipeline schedule and the ZeRO stage. The model is a stack of
``Layer`` (a Llama 2 block with its rotary table: one input, so a pipeline can cut it), the
data random inputs and targets (mean squared error), the optimizer Adam. Each technique is
the library's where there is one: DDP (``no_sync`` while accumulating), FSDP2 ``fully_shard``
(ZeRO-3), ``torch.distributed.pipelining`` (GPipe, 1F1B); tensor parallelism is Megatron's by
hand (helpers.parallel.tensor.tp's layers), so that no DTensor dispatch cost, which CPU ranks would
pay at every operation and every optimizer step, hides what the planner models.

``Probes`` measures, with every rank busy at once, what the planner is told about the
machine (helpers.parallel.composed.plancheck.machine); ``allocator_peak`` reads peak memory from the
CPU allocator through the profiler, as ``torch.cuda.max_memory_allocated`` does on a GPU.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import nn

from helpers import compat
from helpers.models import llama2

__all__ = ["Trial", "TRIALS", "Layer", "megatron_tp", "LayoutRun", "Probes", "PROBE_ROWS",
           "PROBE_BYTES", "allocator_peak"]  # fmt: skip


@dataclass(frozen=True)
class Trial:
    """One layout on the ranks: degrees, micro-batches per replica, schedule, ZeRO stage."""

    name: str
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    schedule: str = "1f1b"
    zero: int = 0


TRIALS = (
    Trial("dp=4", dp=4),
    Trial("dp=4, 4 micro-batches", dp=4, micro_batches=4),
    Trial("dp=4 ZeRO-3", dp=4, zero=3),
    Trial("pp=4 GPipe, m=8", pp=4, micro_batches=8, schedule="gpipe"),
    Trial("pp=4 1F1B, m=8", pp=4, micro_batches=8),
    Trial("tp=4", tp=4),
    Trial("dp=2 tp=2", dp=2, tp=2),
    Trial("dp=2 pp=2 1F1B, m=4", dp=2, pp=2, micro_batches=4),
    Trial("pp=2 tp=2 1F1B, m=4", pp=2, tp=2, micro_batches=4),
)


class Layer(nn.Module):
    """A Llama 2 block with its rotary table: one input, one output, so a pipeline can cut."""

    def __init__(self, args: llama2.ModelArgs):
        super().__init__()
        self.block = llama2.TransformerBlock(args)
        tables = llama2.rotary_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope", tables, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, dim) or (B, S/tp, dim)
        return self.block(x, self.rope)


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ layer (Kineto) logs to file descriptor 2: silence it for a while."""
    import os
    import sys

    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def allocator_peak(fn) -> tuple[int, object]:
    """(most bytes the CPU allocator held at once while ``fn()`` ran, above its start; fn's value)."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        if e.device_type() == torch.autograd.DeviceType.CPU:
            live += e.nbytes()
            peak = max(peak, live)
    return peak, out


class _F(nn.Module):
    """Megatron's f in front of a module: identity forward, all-reduce of dL/dx backward."""

    def __init__(self, inner: nn.Module, group):
        super().__init__()
        self.inner, self.group = inner, group

    def forward(self, x: torch.Tensor, *rest) -> torch.Tensor:
        from helpers.parallel.tensor.tp_comm import copy_to_tp

        return self.inner(copy_to_tp(x, self.group), *rest)


def megatron_tp(block: nn.Module, group) -> nn.Module:
    """Tensor parallelism by hand on a Llama 2 block (helpers.parallel.tensor.tp's layers): wq, wk, wv,
    w1, w3 column-parallel, wo and w2 row-parallel, one f before each half. Per forward: two
    all-reduces (g after wo and w2); per backward two more (f). The norms stay replicated."""
    from helpers.parallel.tensor.tp import ColumnParallelLinear, RowParallelLinear

    att, ffn = block.attention, block.feed_forward
    for name in ("wq", "wk", "wv"):
        setattr(att, name, ColumnParallelLinear(getattr(att, name), group, sync_input_grad=False))
    att.wo = RowParallelLinear(att.wo, group)
    for name in ("w1", "w3"):
        setattr(ffn, name, ColumnParallelLinear(getattr(ffn, name), group, sync_input_grad=False))
    ffn.w2 = RowParallelLinear(ffn.w2, group)
    block.attention, block.feed_forward = _F(att, group), _F(ffn, group)
    return block


class LayoutRun:
    """One layout built on this rank: its part of the model, optimizer and step function."""

    def __init__(self, d, trial: Trial, args, batch: int, seq_len: int, meshes: dict):
        from torch.distributed.device_mesh import init_device_mesh

        self.t = trial
        shape = (trial.pp, trial.dp, trial.tp)
        if shape not in meshes:  # every rank builds the same meshes in the same order
            meshes[shape] = init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp", "tp"))
        mesh = meshes[shape]
        self.pp_rank = mesh["pp"].get_local_rank()
        self.dp_rank = mesh["dp"].get_local_rank()
        self.tp_rank = mesh["tp"].get_local_rank()
        torch.manual_seed(0)
        model = nn.Sequential(*[Layer(args) for _ in range(args.n_layers)])
        part = model
        if trial.pp > 1:
            from helpers.parallel.pipeline.pipeline import cut

            part = cut(model, trial.pp)[self.pp_rank]
        if trial.tp > 1:
            for layer in part:
                megatron_tp(layer.block, mesh["tp"].get_group())
        if trial.zero == 3:
            from torch.distributed.fsdp import fully_shard

            for layer in part:
                fully_shard(layer, mesh=mesh["dp"])
            fully_shard(part, mesh=mesh["dp"])
        elif trial.dp > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            part = DDP(
                part,
                process_group=mesh["dp"].get_group(),
                gradient_as_bucket_view=True,
                **compat.ddp_buffer_sync(False),
            )  # the rotary tables are the same everywhere
        self.part = part
        self.opt = torch.optim.Adam(part.parameters(), lr=1e-3, foreach=True)  # the GPU default
        self.sched = None
        if trial.pp > 1:
            from torch.distributed.pipelining import PipelineStage

            from helpers.parallel.pipeline.pipeline import TORCH_SCHEDULES

            stage = PipelineStage(part, self.pp_rank, trial.pp, d.device,
                                  group=mesh["pp"].get_group())  # fmt: skip
            self.sched = TORCH_SCHEDULES[trial.schedule](
                stage, n_microbatches=trial.micro_batches, loss_fn=self._loss
            )
        g = torch.Generator().manual_seed(1)
        x = torch.randn(batch, seq_len, args.dim, generator=g)
        y = torch.randn(batch, seq_len, args.dim, generator=g)
        rows = batch // trial.dp  # the TP ranks of a replica read the same rows
        pick = slice(self.dp_rank * rows, (self.dp_rank + 1) * rows)
        self.x, self.y = x[pick].contiguous(), y[pick].contiguous()

    @staticmethod
    def _loss(out, target):
        return nn.functional.mse_loss(out, target)

    def step(self) -> None:
        t, part = self.t, self.part
        # DDP's gradients are views of its buckets: zero them in place (set to None, they
        # would accumulate beside the buckets under no_sync, holding gradients twice)
        self.opt.zero_grad(set_to_none=not hasattr(part, "no_sync"))
        if self.sched is not None:
            if self.pp_rank == 0:
                self.sched.step(self.x)
            elif self.pp_rank == t.pp - 1:
                self.sched.step(target=self.y)
            else:
                self.sched.step()
        else:
            pairs = list(
                zip(self.x.chunk(t.micro_batches), self.y.chunk(t.micro_batches), strict=True)
            )
            for i, (xm, ym) in enumerate(pairs):
                last = i == len(pairs) - 1
                quiet = part.no_sync() if hasattr(part, "no_sync") and not last else None
                with quiet or contextlib.nullcontext():
                    (self._loss(part(xm), ym) / t.micro_batches).backward()
        self.opt.step()

    def resident_bytes(self) -> int:
        """Parameters, optimizer state and DDP's gradient buckets: held between steps."""
        from helpers.parallel.sharded.memory import _nbytes, _optimizer_tensors

        held = list(self.part.parameters()) + _optimizer_tensors(self.opt)
        if hasattr(self.part, "no_sync"):  # DDP: gradients live in its buckets
            held += [p.grad for p in self.part.parameters() if p.grad is not None]
        return _nbytes(held)


PROBE_ROWS = (1, 4)  # sequences per micro-batch in the compute probes
PROBE_BYTES = (64 * 1024, 4 * 2**20)  # all-reduce probe sizes


def _timed(fn) -> float:
    """Seconds of fn() on this rank, started with every other rank (a barrier first)."""
    tdist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Probes:
    """What the planner is told about this machine, measured with all ranks busy at once.

    compute: the block stack's forward + backward on 1 and on 4 sequences (a rate and a fixed
    cost per block); framework: the same on 1 sequence under DDP and, with an Adam step, under
    FSDP2, each on a group of one rank (their bookkeeping per micro-batch and per block, no
    traffic); optimizer: an Adam step over the stack (memory-bound); links: all-reduces of
    64 KiB and 4 MiB over every rank (alpha and beta).
    """

    def __init__(self, d, args, seq_len: int):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP

        def stack():
            torch.manual_seed(0)
            return nn.Sequential(*[Layer(args) for _ in range(args.n_layers)])

        alone = [tdist.new_group([r]) for r in range(d.world_size)][d.rank]
        self.plain, self.sharded = stack(), stack()
        for layer in self.sharded:
            fully_shard(layer, mesh=DeviceMesh.from_group(alone, "cpu"))
        fully_shard(self.sharded, mesh=DeviceMesh.from_group(alone, "cpu"))
        self.ddp = DDP(stack(), process_group=alone, gradient_as_bucket_view=True,
                       **compat.ddp_buffer_sync(False))  # fmt: skip
        self.opts = [torch.optim.Adam(m.parameters(), lr=1e-3, foreach=True)
                     for m in (self.plain, self.sharded)]  # fmt: skip
        self.inputs = [torch.randn(r, seq_len, args.dim) for r in PROBE_ROWS]
        self.bufs = [torch.zeros(n // 4) for n in PROBE_BYTES]

    @staticmethod
    def _train(model, x, opt=None):
        def run():
            model(x).square().mean().backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()

        return run

    def measure(self) -> dict:
        """Seconds of each probe on this rank (the caller takes the slowest rank)."""
        plain, small, large = self.plain, self.inputs[0], self.inputs[-1]
        out = {f"rows {r}": _timed(self._train(plain, x))
               for r, x in zip(PROBE_ROWS, self.inputs, strict=True)}  # fmt: skip
        out["ddp"] = _timed(self._train(self.ddp, small))
        out["adam"] = _timed(self.opts[0].step)
        out["fsdp"] = _timed(self._train(self.sharded, large, self.opts[1]))
        for n, b in zip(PROBE_BYTES, self.bufs, strict=True):
            out[f"all-reduce {n}"] = _timed(lambda b=b: tdist.all_reduce(b))
        plain.zero_grad(set_to_none=True)
        self.ddp.zero_grad(set_to_none=False)
        return out
