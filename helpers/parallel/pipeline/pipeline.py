"""Real pipelines with torch.distributed.pipelining, timed per stage and per micro-batch.

    rank 0              rank 1                      (p = 2 ranks, v = 1)
    layers 0..L/2-1  -> layers L/2..L-1 -> loss
        F(mb) sends activations [rows/m, width] ->
        <- B(mb) sends their gradient [rows/m, width]

``run_schedule(d, model, x, y, schedule, m, v)`` runs on every rank of a launch.spawn: it
cuts the model into p*v stages (rank r holds stages r, r+p, ... as Megatron's interleaving
does), builds one ``PipelineStage`` per stage and torch's schedule, and returns the
gradients of the layers this rank owns, the loss, the start/end of every forward and
backward it ran (helpers.parallel.pipeline.pipeline_measure), the bytes of activations autograd
held for backward and the bytes it sent. Loss and gradients equal the model without the
pipeline (tests).

Schedules (torch's classes): gpipe ScheduleGPipe, 1f1b Schedule1F1B, interleaved
ScheduleInterleaved1F1B (v >= 2 chunks per rank), zb-h1 ScheduleInterleavedZeroBubble on one
stage per rank, interleaved-zb the same on v >= 2 chunks.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from helpers.dist import Dist
from helpers.parallel.pipeline.pipeline_measure import (  # re-exported: 08 reads them from here
    SavedBytes,
    SentBytes,
    gaps,
    measured_timeline,
    peak_in_flight,
    simulate_like,
    stage_means,
    timed,
)
from helpers.parallel.pipeline.schedules import Op

__all__ = ["TORCH_SCHEDULES", "mlp", "cut", "stage_of", "timed", "run_schedule",
           "run_stages", "serial_reference", "run_hybrid", "torch_order", "chunks",
           "measured_timeline", "stage_means", "simulate_like", "gaps", "peak_in_flight"]  # fmt: skip

TORCH_SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
    "zb-h1": ScheduleInterleavedZeroBubble,
    "interleaved-zb": ScheduleInterleavedZeroBubble,
}
_MULTI = ("interleaved", "zb-h1", "interleaved-zb")  # schedules that take a list of stages


def chunks(schedule: str, v: int = 2) -> int:
    """Model chunks per rank a schedule runs with: v for the interleaved ones, else 1."""
    return v if schedule.startswith("interleaved") else 1


def mlp(width: int = 1024, depth: int = 6, seed: int = 0, dtype=torch.float32) -> nn.Sequential:
    """depth x (Linear(width, width), Tanh): equal layers, so equal stages when cut evenly."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers).to(dtype)


def cut(model: nn.Sequential, n: int) -> list[nn.Sequential]:
    """n consecutive pieces of a Sequential with as equal a number of Linear layers as possible.

    The pieces share the original parameters' names through ``owned_names``.
    """
    blocks = _blocks(model)
    if len(blocks) < n:
        raise ValueError(f"cannot cut {len(blocks)} layers into {n} stages: use fewer stages")
    bounds = [round(i * len(blocks) / n) for i in range(n + 1)]
    return [nn.Sequential(*sum(blocks[a:b], [])) for a, b in zip(bounds, bounds[1:], strict=False)]


def _blocks(model: nn.Sequential) -> list[list[nn.Module]]:
    # a block = one layer with parameters plus the parameter-free layers after it
    blocks: list[list[nn.Module]] = []
    for mod in model:
        if any(True for _ in mod.parameters()) or not blocks:
            blocks.append([mod])
        else:
            blocks[-1].append(mod)
    return blocks


def stage_of(model: nn.Sequential, n: int) -> dict[str, int]:
    """Which of the n pieces of cut(model, n) owns each parameter name of model."""
    index = {id(mod): i for i, mod in enumerate(model)}
    return {
        f"{index[id(mod)]}.{pname}": s
        for s, piece in enumerate(cut(model, n))
        for mod in piece
        for pname, _ in mod.named_parameters()
    }


def _check(schedule: str, v: int) -> None:
    if schedule not in TORCH_SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: choose one of {sorted(TORCH_SCHEDULES)}")
    if schedule.startswith("interleaved") != (v > 1):
        raise ValueError(
            f"{schedule} with v={v}: interleaved and interleaved-zb need v >= 2 stages per "
            "rank; gpipe, 1f1b and zb-h1 need v=1"
        )


def run_schedule(
    d: Dist,
    model: nn.Sequential,
    x: torch.Tensor,
    y: torch.Tensor,
    schedule: str = "gpipe",
    m: int = 8,
    v: int = 1,
    steps: int = 1,
    group=None,
) -> dict:
    """One rank's part of ``steps`` pipelined training steps of an MLP (grads, no optimizer).

    x: [rows, ...] full batch, y its target; the schedule splits both into m micro-batches.
    The model is cut into p*v stages of equal numbers of layers. Returns run_stages'
    figures and this rank's ``grads`` {name in model: grad}.
    """
    _check(schedule, v)
    p = tdist.get_world_size(group)
    me = tdist.get_rank(group)
    pieces = cut(model, p * v)
    mine = {ms: pieces[ms] for ms in range(me, p * v, p)}  # rank r holds stages r, r+p, ...

    def loss_fn(out, target):  # out, target: [rows/m, width]
        return nn.functional.mse_loss(out, target)

    out = run_stages(d, mine, p * v, x, y, schedule, m, loss_fn, steps, group,
                     skip=[*model.parameters(), x, y], zero_grad=model.zero_grad)  # fmt: skip
    owned = {name for name, s in stage_of(model, p * v).items() if s % p == me}
    out["grads"] = {n: q.grad.detach().clone() for n, q in model.named_parameters() if n in owned}
    return out


def run_stages(d: Dist, modules: dict, n_stages: int, x, y, schedule: str, m: int, loss_fn,
               steps: int = 1, group=None, skip=(), zero_grad=None) -> dict:  # fmt: skip
    """Run torch's ``schedule`` over this rank's stage ``modules`` {model stage index: module}.

    Returns ``loss`` (mean over micro-batches, last rank only, else None), and of the last
    step: ``events``, ``saved`` (peak bytes of activations held for backward, the loss's
    included), ``saved_trace`` [(seconds, bytes)], ``sent`` [(direction, mb, bytes)] and
    ``order`` (the op order torch's schedule object holds, for the interleaved and
    zero-bubble ones; None for gpipe and 1f1b, which keep theirs in code).
    """
    p, me = tdist.get_world_size(group), tdist.get_rank(group)
    events: list = []
    saved, sent = SavedBytes(skip=skip), SentBytes()
    stages = []
    for ms, module in sorted(modules.items()):
        stage = PipelineStage(module, ms, n_stages, d.device, group=group)
        stages.append(sent.track(saved.track(timed(stage, d.rank, events))))

    def counted_loss(out, target):  # what the loss saves for backward counts too
        with saved.hooks():
            return loss_fn(out, target)

    cls = TORCH_SCHEDULES[schedule]
    multi = schedule in _MULTI
    sched = cls(stages if multi else stages[0], n_microbatches=m, loss_fn=counted_loss)
    last = me == p - 1
    for _ in range(steps):
        events.clear()
        sent.sent.clear()
        saved.reset()
        for module in modules.values():
            module.zero_grad(set_to_none=True)
        if zero_grad is not None:
            zero_grad(set_to_none=True)
        losses: list = []
        kwargs = {"target": y, "losses": losses} if last else {}
        if me == 0:
            sched.step(x, **kwargs)
        else:
            sched.step(**kwargs)
    return {
        "loss": torch.stack(losses).mean().detach() if last else None,
        "events": sorted(events, key=lambda e: e.start),
        "saved": saved.peak,
        "saved_trace": saved.trace,
        "sent": list(sent.sent),
        "order": torch_order(sched, p) if multi else None,
    }


def torch_order(sched, p: int) -> list[list[Op]]:
    """The compute order a torch schedule object holds (``pipeline_order``), as Op lists.

    Its F, B (full backward), I (input gradient: our "B") and W actions; the rest
    (communication, gradient reduction, None for an idle slot) is left out.
    """
    kinds = {"F": "F", "B": "B", "I": "B", "W": "W"}
    return [
        [
            Op(kinds[a.computation_type.value], a.microbatch_index, a.stage_index // p)
            for a in sched.pipeline_order[rank]
            if a is not None and a.computation_type.value in kinds
        ]
        for rank in range(p)
    ]


def serial_reference(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The same step without a pipeline: full batch, one process."""
    model.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return {
        "loss": loss.detach(),
        "grads": {n: q.grad.clone() for n, q in model.named_parameters()},
    }


def run_hybrid(d: Dist, model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, m: int = 4):
    """2-stage pipeline x 2-way data parallel on 4 ranks (seed 000's DeepSpeed layout).

        mesh ("pp", "dp"):   [[0, 1],      stage 0: ranks 0, 1 (one per replica)
                              [2, 3]]      stage 1: ranks 2, 3
        pipeline replica 0: rank 0 -> rank 2;  replica 1: rank 1 -> rank 3
        all-reduce of each stage's gradients: 0 <-> 1, 2 <-> 3

    pp outermost, as DeepSpeed's PipeDataParallelTopology and torchtitan's mesh put it:
    consecutive ranks share a node, so the data-parallel all-reduce of a whole stage's
    gradients stays on the fast links inside it, and the smaller point-to-point messages
    of the pipeline cross between nodes (Llama 3 lays data parallelism outermost instead,
    for FSDP's prefetched traffic tolerates the network: notebook 05, section 9). Each
    replica pipelines its share of the batch;
    the two copies of a stage then average their gradients over "dp", as DDP would.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if d.world_size != 4:
        raise ValueError(f"run_hybrid needs 4 ranks (2 pp x 2 dp), got {d.world_size}")
    mesh = init_device_mesh(d.device.type, (2, 2), mesh_dim_names=("pp", "dp"))
    dp = mesh["dp"].get_local_rank()
    xs, ys = x.chunk(2)[dp], y.chunk(2)[dp]  # [rows/2, width] per replica
    out = run_schedule(d, model, xs, ys, "1f1b", m, group=mesh["pp"].get_group())
    for g in out["grads"].values():
        tdist.all_reduce(g, group=mesh["dp"].get_group())
        g /= 2
    out["coords"] = {"pp": mesh["pp"].get_local_rank(), "dp": dp}
    out["groups"] = {n: tdist.get_process_group_ranks(mesh[n].get_group()) for n in ("pp", "dp")}
    out["rows"] = {"replica": xs.shape[0], "micro-batch": xs.shape[0] // m}
    return out
