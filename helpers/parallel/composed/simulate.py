"""A cluster-sized layout, checked in one process: fake process groups + meta-device models.

    with fake_rank(rank=5, world_size=16):        # torch's FakeProcessGroup: no peers, no data
        report = rank_view(llama2.CONFIGS["13B"], ParallelDims(dp=2, tp=2, pp=4, world_size=16), 5)

``rank_view`` builds what rank r of the job would build (the device mesh, its pipeline stage
of the model, TP then FSDP on it) with every parameter on the meta device (shapes, no memory),
then reports the ranks in each of its process groups and the shapes of its parameter shards.

What this can tell: that the degrees divide the model, that every rank's groups are the ones
the planner drew, the exact shard shapes and bytes of parameters (hence of gradients and
optimizer states) per rank. What it cannot tell: speed, activation memory, NCCL behaviour,
or whether collectives are issued in a matching order on all ranks (a fake group never waits
and returns garbage, so numbers are never checked here; the 4-rank gloo tests do that).

torch.testing._internal.distributed.fake_pg is a private torch API: only this module touches it.
TODO (lead): helpers.dist is meant to own init_process_group; move fake_rank there if wanted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as tdist

from helpers.models import llama2
from helpers.parallel.composed import llama_parallel
from helpers.parallel.composed.mesh import ParallelDims

__all__ = ["fake_rank", "stage_layers", "build_stage", "rank_view", "check_layout"]


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int) -> Iterator[None]:
    """Pretend to be ``rank`` of ``world_size``: collectives return at once and move no data."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    if tdist.is_initialized():
        raise RuntimeError("a process group already exists in this process; fake_rank needs none")
    tdist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        tdist.destroy_process_group()


def stage_layers(n_layers: int, pp: int, stage: int) -> list[int]:
    """The contiguous block of layers pipeline stage ``stage`` holds (n_layers / pp each)."""
    if n_layers % pp:
        raise ValueError(f"pp={pp} does not divide {n_layers} layers")
    per = n_layers // pp
    return list(range(stage * per, (stage + 1) * per))


def build_stage(args: llama2.ModelArgs, pp: int, stage: int, device="meta") -> llama2.Transformer:
    """The part of the model a stage runs: its layers, plus the embedding (first) / head (last)."""
    with torch.device(device):
        model = llama2.Transformer(args)
    keep = {str(i) for i in stage_layers(args.n_layers, pp, stage)}
    model.layers = torch.nn.ModuleDict({k: v for k, v in model.layers.items() if k in keep})
    if stage > 0:
        model.tok_embeddings = None
    if stage < pp - 1:
        model.norm, model.output = None, None
    return model


def rank_view(args: llama2.ModelArgs, dims: ParallelDims, rank: int) -> dict:
    """Inside fake_rank(rank, world): build this rank's mesh and sharded stage; report both."""
    mesh = dims.build_mesh("cpu")
    stage = mesh["pp"].get_local_rank()
    model = build_stage(args, dims.pp, stage)
    if dims.tp > 1:
        llama_parallel.apply_tp(model, mesh["tp"])
    llama_parallel.apply_fsdp(model, mesh["dp"])
    shapes = {name: tuple(p.to_local().shape) for name, p in model.named_parameters()}
    return {
        "rank": rank,
        "coords": {n: mesh[n].get_local_rank() for n in ("pp", "dp", "tp")},
        "groups": {
            n: tdist.get_process_group_ranks(mesh[n].get_group()) for n in ("pp", "dp", "tp")
        },
        "stage": stage,
        "layers": sorted(int(k) for k in model.layers),
        "shapes": shapes,
        "local_params": sum(torch.Size(s).numel() for s in shapes.values()),
    }


def check_layout(args: llama2.ModelArgs, dims: ParallelDims, ranks=None) -> list[dict]:
    """rank_view of each rank in ``ranks`` (default: all), checked against dims.groups()."""
    views = []
    for r in range(dims.world_size) if ranks is None else ranks:
        with fake_rank(r, dims.world_size):
            view = rank_view(args, dims, r)
        for name in ("pp", "dp", "tp"):
            expected = next(g for g in dims.groups(name) if r in g)
            if view["groups"][name] != expected:
                raise AssertionError(
                    f"rank {r}: {name} group {view['groups'][name]} but the plan says {expected}"
                )
        views.append(view)
    return views
