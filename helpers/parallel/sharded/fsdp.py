"""Fully sharded data parallelism (ZeRO-3) with FSDP2's ``fully_shard``, and what it sends when.

Each rank keeps 1/N of every parameter (a DTensor sharded on dim 0 over the mesh), its
gradient and its optimizer state. Around each wrapped layer:

    forward   all-gather the layer's weights -> compute -> free them (reshard_after_forward)
    backward  all-gather them again -> compute grads -> reduce-scatter the grads (each rank
              keeps the average of its 1/N slice) -> free the gathered weights

``reshard_after_forward=False`` keeps the gathered weights from forward to backward: one
all-gather fewer per layer, at the cost of holding the whole model's weights in between
(ZeRO-2's memory for the weights, without a second all-gather).

    mesh = init_device_mesh("cpu" or "cuda", (world_size,))
    apply_fsdp(model, mesh, layers=model.blocks)       # each block, then the root
    timeline = comm_timeline(lambda: loss_fn(model).backward())   # per-layer events

Prefetching: while layer i computes, FSDP2 can already gather the next layer's weights.
Backward does so by default (the reverse of the forward order); forward does once told:

    layers[i].set_modules_to_forward_prefetch([layers[i + 1]])
    layers[i].set_modules_to_backward_prefetch([layers[i - 1]])

``comm_timeline`` marks a gather that was issued ahead (``CommEvent.prefetched``) and
reports each layer's compute, so the timeline shows what travels while what computes.

The order matters: ``fully_shard`` the layers first, then the root, so each layer becomes
its own communication group and the root holds only what is left (embeddings, head).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

# FSDP2 in torch 2.14 still calls the collectives torch 2.14 renamed (all_gather_single,
# reduce_scatter_single): their FutureWarning is about torch's own code, once per rank.
for _old in ("all_gather_into_tensor", "reduce_scatter_tensor"):
    warnings.filterwarnings("ignore", message=rf"`torch.distributed.{_old}` is deprecated",
                            category=FutureWarning)  # fmt: skip

__all__ = [
    "apply_fsdp",
    "mixed_precision",
    "full_params",
    "local_numels",
    "CommEvent",
    "comm_timeline",
]


def mixed_precision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32):
    """Compute in bf16 (gathered weights are cast), keep fp32 shards and reduce grads in fp32."""
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    layers: Iterable[nn.Module] | None = None,
    reshard_after_forward: bool = True,
    mp_policy: MixedPrecisionPolicy | None = None,
    offload: bool = False,
) -> nn.Module:
    """fully_shard each of ``layers`` (default: the model's children that hold parameters),
    then the root. ``offload``: keep shards, grads and optimizer state in CPU memory."""
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if layers is None:
        layers = [m for m in model.children() if any(True for _ in m.parameters())]
    for layer in layers:
        fully_shard(layer, **kwargs)
    # the root (what no layer holds) is never resharded after forward: backward needs it first
    fully_shard(model, **kwargs)
    return model


def full_params(model: nn.Module) -> torch.Tensor:
    """All parameters, unsharded and flattened (every rank gets the same vector)."""
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return torch.cat([t.detach().reshape(-1) for t in full])


def local_numels(model: nn.Module) -> int:
    """Elements of parameters this rank stores (its shards)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())


@dataclass(frozen=True)
class CommEvent:
    kind: str  # "all-gather (forward)", "all-gather (backward)", "reduce-scatter",
    #            "compute (forward)", "compute (backward)"
    layer: str  # the wrapped module's name ("" for the root)
    start: float  # milliseconds from the first event
    end: float
    prefetched: bool = False  # an all-gather issued while an earlier layer was being set up


_COMM = {"FSDP::all_gather": "all-gather", "FSDP::post_backward_reduce": "reduce-scatter"}
_LABEL = re.compile(r"^(FSDP::[a-z_]+) \((.*)\)$")
_PREFETCH = re.compile(r"^FSDP::(forward|backward)_prefetch")


def _compute(raw) -> list[tuple[str, str, float, float]]:
    """Each layer's compute: after the last FSDP work that its pre-forward (pre-backward) hook
    started (its gather, a prefetch) and until its post-forward (first post-backward) hook,
    from FSDP2's own labels around the layer."""
    fsdp = [(e.name, e.time_range.start, e.time_range.end) for e in raw
            if e.name.startswith("FSDP::")]  # fmt: skip
    out = []
    for name, start, _ in fsdp:
        m = _LABEL.match(name)
        if not m or m.group(1) not in ("FSDP::pre_forward", "FSDP::pre_backward"):
            continue
        layer, forward = m.group(2), m.group(1) == "FSDP::pre_forward"
        post = "FSDP::post_forward" if forward else "FSDP::post_backward"
        ends = [
            a for n, a, _ in fsdp if a > start and n.startswith(post) and n.endswith(f"({layer})")
        ]
        if not ends:
            continue
        busy = [b for _, a, b in fsdp if start <= a < min(ends) and b <= min(ends)]
        kind = "compute (forward)" if forward else "compute (backward)"
        out.append((kind, layer, max(busy), min(ends)))
    return out


def comm_timeline(step: Callable[[], object]) -> list[CommEvent]:
    """Run ``step()`` (forward + backward of an FSDP model) under the profiler and return the
    all-gathers and reduce-scatters FSDP2 made and each layer's compute, per layer, in time
    order. FSDP2 labels its work with ``record_function("FSDP::all_gather (layer name)")``,
    on CPU and GPU alike."""
    from torch.profiler import ProfilerActivity, profile

    # Kineto, the profiler's backend, prints "USDT ... profiler_start/stop" markers (level 5)
    # and, in a CUDA build without a GPU, an ERROR per run: noise here. Read at its first run.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    raw = sorted(prof.events(), key=lambda e: e.time_range.start)
    backward_from = min(
        (e.time_range.start for e in raw if e.name.startswith("FSDP::pre_backward")),
        default=float("inf"),
    )
    ahead = [(e.time_range.start, e.time_range.end) for e in raw if _PREFETCH.match(e.name)]
    t0 = raw[0].time_range.start if raw else 0.0
    found = []
    for e in raw:
        m = _LABEL.match(e.name)
        if not m or m.group(1) not in _COMM:
            continue
        kind, (a, b) = _COMM[m.group(1)], (e.time_range.start, e.time_range.end)
        if kind == "all-gather":
            kind += " (backward)" if a >= backward_from else " (forward)"
        prefetched = any(s <= a and b <= f for s, f in ahead)
        found.append((kind, m.group(2), a, b, prefetched))
    found += [(*c, False) for c in _compute(raw)]
    found.sort(key=lambda c: c[2])
    return [CommEvent(k, lay, (a - t0) / 1e3, (b - t0) / 1e3, pf) for k, lay, a, b, pf in found]
