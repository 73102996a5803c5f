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

The order matters: ``fully_shard`` the layers first, then the root, so each layer becomes
its own communication group and the root holds only what is left (embeddings, head).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

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
    kind: str  # "all-gather (forward)", "all-gather (backward)", "reduce-scatter"
    layer: str  # the wrapped module's name ("" for the root)
    start: float  # milliseconds from the first event
    end: float


_KINDS = {
    "FSDP::all_gather": "all-gather",
    "FSDP::post_backward_reduce": "reduce-scatter",
}
_LABEL = re.compile(r"^(FSDP::[a-z_]+) \((.*)\)$")


def comm_timeline(step: Callable[[], object]) -> list[CommEvent]:
    """Run ``step()`` (forward + backward of an FSDP model) under the profiler and return the
    all-gathers and reduce-scatters FSDP2 made, per layer, in time order. FSDP2 labels its
    work with ``record_function("FSDP::all_gather (layer name)")``, on CPU and GPU alike."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    raw = sorted(prof.events(), key=lambda e: e.time_range.start)
    backward_from = min(
        (e.time_range.start for e in raw if e.name.startswith("FSDP::pre_backward")),
        default=float("inf"),
    )
    t0 = raw[0].time_range.start if raw else 0.0
    out = []
    for e in raw:
        m = _LABEL.match(e.name)
        if not m or m.group(1) not in _KINDS:
            continue
        kind = _KINDS[m.group(1)]
        if kind == "all-gather":
            kind += " (backward)" if e.time_range.start >= backward_from else " (forward)"
        out.append(CommEvent(kind, m.group(2), (e.time_range.start - t0) / 1e3,
                             (e.time_range.end - t0) / 1e3))  # fmt: skip
    return out
