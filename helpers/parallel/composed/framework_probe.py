"""The memory rules of ``frameworks`` checked on CPU ranks: what DDP and FSDP2 really hold.

    out = launch.spawn(probe, 2, args=("ddp", ProbeConfig()))   # per rank: held, peak, sizes
    rule = predict("ddp", out[0], world=2)                       # what frameworks.py says

Each rank builds a stack of Linear + GELU blocks (fp32, Adam), wraps it as the framework does
(torch DDP with or without ``gradient_as_bucket_view``; FSDP2 ``fully_shard`` per block), takes
a warm-up step, then measures with the CPU allocator (the profiler's memory events, as
``torch.cuda.max_memory_allocated`` would on a GPU): ``held``, the bytes live between steps
(weights, Adam's moments, DDP's buckets), and ``peak``, the most a step adds on top of them,
with ``micro_batches`` micro-batches accumulated (DDP under ``no_sync``). The activations are
counted by autograd's saved-tensor hooks, so the check tests the framework rules alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["ProbeConfig", "probe", "predict", "KINDS"]

KINDS = ("ddp", "ddp-bucket-view", "fsdp2-fp32")


@dataclass(frozen=True)
class ProbeConfig:
    width: int = 512
    layers: int = 4
    rows: int = 8  # samples per micro-batch and rank
    micro_batches: int = 1


def _live(fn) -> tuple[int, int, object]:
    """(peak above the start, net change at the end, fn's value): the CPU allocator's events."""
    from torch.profiler import ProfilerActivity, profile

    from helpers.parallel.composed.layouts import _quiet_stderr

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        if e.device_type() == torch.autograd.DeviceType.CPU:
            live += e.nbytes()
            peak = max(peak, live)
    return peak, live, out


def _stack(cfg: ProbeConfig) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(cfg.width, cfg.width), nn.GELU())
                           for _ in range(cfg.layers)])  # fmt: skip


def _wrap(d, kind: str, model: nn.Module) -> nn.Module:
    if kind.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, gradient_as_bucket_view=kind == "ddp-bucket-view")
    if kind == "fsdp2-fp32":
        from torch.distributed.fsdp import fully_shard

        for block in model:
            fully_shard(block)
        return fully_shard(model)
    raise ValueError(f"kind={kind!r}: one of {KINDS}")


def _step(model, opt, xs, keep: bool = False) -> None:
    opt.zero_grad(set_to_none=not keep)
    for i, x in enumerate(xs):
        quiet = hasattr(model, "no_sync") and i < len(xs) - 1
        with model.no_sync() if quiet else contextlib.nullcontext():
            (model(x).square().mean() / len(xs)).backward()
    opt.step()


def probe(d, kind: str, cfg: ProbeConfig) -> dict:
    """On one rank: bytes held between steps and the peak a step adds (see the module doc)."""
    from helpers.parallel.sharded.memory import saved_activation_bytes

    torch.set_num_threads(1)
    xs = [torch.randn(cfg.rows, cfg.width) for _ in range(cfg.micro_batches)]

    keep = kind == "ddp-bucket-view"  # its gradients are the buckets: zero them in place

    def build():
        model = _wrap(d, kind, _stack(cfg))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)  # the GPU default
        for _ in range(2):  # warm-up: Adam's moments; DDP rebuilds its buckets in step 2
            _step(model, opt, xs, keep)
        opt.zero_grad(set_to_none=not keep)
        return model, opt

    _, held, (model, opt) = _live(build)
    peak, _, _ = _live(lambda: _step(model, opt, xs, keep))
    plain = _stack(cfg)
    act = saved_activation_bytes(lambda x: plain(x), xs[0], params=plain)
    return {"held": held, "peak": peak, "params": sum(p.numel() for p in plain.parameters()),
            "largest": sum(p.numel() for p in plain[0].parameters()), "activations": act,
            "micro_batches": cfg.micro_batches, "layers": cfg.layers}  # fmt: skip


def predict(kind: str, measured: dict, world: int) -> dict:
    """What frameworks.FRAMEWORKS[kind] says the probe holds and adds (bytes), from its sizes."""
    from helpers.parallel.composed import frameworks

    fw = frameworks.lookup(kind)
    d = world if fw.sharded else 1
    held = fw.states(measured["params"], measured["largest"], d)
    late = fw.late(measured["params"], measured["largest"], d)
    act, m = measured["activations"], measured["micro_batches"]
    forward = act + late["unsharded"] + (late["grads"] if m > 1 else 0.0)
    backward = late["grads"] + late["unsharded"] + max(late["step"], act / measured["layers"])
    gathered = held.pop("gathered")  # FSDP's gathered blocks come and go within the step
    return {
        "held": sum(held.values()),
        "peak": gathered + max(forward, backward),
        "total": sum(held.values()) + gathered + max(forward, backward),
    }
