"""Real pipelines with torch.distributed.pipelining, timed per stage and per micro-batch.

    rank 0              rank 1                      (p = 2 ranks, v = 1)
    layers 0..L/2-1  -> layers L/2..L-1 -> loss
        F(mb) sends activations [rows/m, width] ->
        <- B(mb) sends their gradient [rows/m, width]

``run_schedule(d, model, x, y, "gpipe" | "1f1b" | "interleaved", m, v)`` runs on every
rank of a launch.spawn: it cuts the model into p*v stages (rank r holds stages r, r+p, ...
as Megatron's interleaving does), builds one ``PipelineStage`` per stage and torch's
schedule, and returns the gradients of the layers this rank owns, the loss and the
start/end of every forward and backward it ran. ``measured_timeline`` turns those
timestamps (one clock for all local processes: time.perf_counter is CLOCK_MONOTONIC)
into the same Timeline as helpers.parallel.schedules.simulate, so both can be drawn
side by side. Loss and gradients equal the model without the pipeline (tests).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from helpers.dist import Dist
from helpers.parallel.schedules import Event, Timeline, simulate

TORCH_SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
}


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


def timed(stage: PipelineStage, rank: int, events: list) -> PipelineStage:
    """Record (kind, micro-batch, start, end) of every forward/backward this stage runs.

    Wrapping the stage's own compute methods keeps sends and receives out of the
    measured boxes: what is left between boxes is waiting (the bubble) or communication.
    """
    chunk = stage.stage_index // stage.group_size

    def wrap(method, kind):
        def run(mb, *args, **kwargs):
            t0 = time.perf_counter()
            out = method(mb, *args, **kwargs)
            events.append(Event(rank, kind, mb, t0, time.perf_counter(), chunk))
            return out

        return run

    stage.forward_one_chunk = wrap(stage.forward_one_chunk, "F")
    stage.backward_one_chunk = wrap(stage.backward_one_chunk, "B")
    return stage


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
    """One rank's part of ``steps`` pipelined training steps (no optimizer: grads only).

    x: [rows, ...] full batch, y its target; the schedule splits both into m micro-batches.
    group: the pipeline's process group (default: all ranks). Returns this rank's
    ``grads`` {name in model: grad}, ``loss`` (mean over micro-batches, last rank only,
    else None) and ``events`` of the last step.
    """
    if schedule not in TORCH_SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: choose one of {sorted(TORCH_SCHEDULES)}")
    if (schedule == "interleaved") != (v > 1):
        raise ValueError("interleaved needs v >= 2 stages per rank; gpipe/1f1b need v=1")
    p = tdist.get_world_size(group)
    me = tdist.get_rank(group)
    pieces = cut(model, p * v)
    owner = stage_of(model, p * v)
    events: list[Event] = []
    stages = [
        timed(PipelineStage(pieces[ms], ms, p * v, d.device, group=group), d.rank, events)
        for ms in range(me, p * v, p)
    ]

    def loss_fn(out, target):  # out, target: [rows/m, width]
        return nn.functional.mse_loss(out, target)

    cls = TORCH_SCHEDULES[schedule]
    sched = cls(stages if v > 1 else stages[0], n_microbatches=m, loss_fn=loss_fn)
    last = me == p - 1
    for _ in range(steps):
        events.clear()
        model.zero_grad(set_to_none=True)
        losses: list = []
        kwargs = {"target": y, "losses": losses} if last else {}
        if me == 0:
            sched.step(x, **kwargs)
        else:
            sched.step(**kwargs)
    mine = {name for name, s in owner.items() if s % p == me}
    grads = {n: q.grad.detach().clone() for n, q in model.named_parameters() if n in mine}
    loss = torch.stack(losses).mean().detach() if last else None
    return {"grads": grads, "loss": loss, "events": sorted(events, key=lambda e: e.start)}


def serial_reference(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The same step without a pipeline: full batch, one process."""
    model.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return {
        "loss": loss.detach(),
        "grads": {n: q.grad.clone() for n, q in model.named_parameters()},
    }


def measured_timeline(per_rank_events: list[list[Event]], m: int, v: int = 1, name: str = ""):
    """A Timeline from each rank's events, time 0 = the first op anywhere (seconds)."""
    p = len(per_rank_events)
    t0 = min(e.start for evs in per_rank_events for e in evs)
    events = [
        e._replace(start=e.start - t0, end=e.end - t0) for evs in per_rank_events for e in evs
    ]
    tf, tb = stage_means(events, p)
    tl = Timeline(events, p, m, v, name or "measured", serial_time=m * (sum(tf) + sum(tb)))
    tl.peak_activations = peak_in_flight(events, p, v)
    return tl


def stage_means(events: list[Event], p: int) -> tuple[list[float], list[float]]:
    """Mean forward and backward time of one micro-batch on each rank (chunks summed)."""
    tf, tb = [0.0] * p, [0.0] * p
    for kind, out in (("F", tf), ("B", tb)):
        for s in range(p):
            durs: dict[int, list[float]] = {}
            for e in events:
                if e.stage == s and e.kind == kind:
                    durs.setdefault(e.chunk, []).append(e.end - e.start)
            out[s] = sum(sum(ds) / len(ds) for ds in durs.values())
    return tf, tb


def run_hybrid(d: Dist, model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, m: int = 4):
    """2-way data parallel x 2-stage pipeline on 4 ranks (seed 000's DeepSpeed layout).

        mesh ("dp", "pp"):   [[0, 1],      pipeline replica 0: ranks 0 -> 1
                              [2, 3]]      pipeline replica 1: ranks 2 -> 3

    Each replica pipelines half of the batch; the two copies of a stage then average
    their gradients over the "dp" dimension, as DDP would.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if d.world_size != 4:
        raise ValueError(f"run_hybrid needs 4 ranks (2 dp x 2 pp), got {d.world_size}")
    mesh = init_device_mesh(d.device.type, (2, 2), mesh_dim_names=("dp", "pp"))
    dp = mesh["dp"].get_local_rank()
    xs, ys = x.chunk(2)[dp], y.chunk(2)[dp]  # [rows/2, width] per replica
    out = run_schedule(d, model, xs, ys, "1f1b", m, group=mesh["pp"].get_group())
    for g in out["grads"].values():
        tdist.all_reduce(g, group=mesh["dp"].get_group())
        g /= 2
    out["coords"] = {"dp": dp, "pp": mesh["pp"].get_local_rank()}
    return out


def gaps(events: list[Event], p: int) -> tuple[float, float]:
    """(latency, overhead): the two kinds of measured gap between boxes, medians in seconds.

    latency: from the end of an op on one rank to the start of its consumer on the next,
    when the consumer's rank sat idle waiting for it (gloo send/recv of the tensor).
    overhead: from the end of one op to the start of the next on the same rank when the
    next op's input was already there (the schedule's book-keeping, issuing sends).
    Neither is inside a box, so both count as bubble in the measured timeline.
    """
    end = {(e.stage, e.chunk, e.kind, e.mb): e.end for e in events}
    free = {}  # op -> when its rank finished the op before it
    for s in range(p):
        mine = sorted((e for e in events if e.stage == s), key=lambda e: e.start)
        free.update({b: a.end for a, b in zip(mine, mine[1:], strict=False)})
    lat, over = [], []
    for e in events:
        ms = e.chunk * p + e.stage
        src = ms - 1 if e.kind == "F" else ms + 1
        key = (src % p, src // p, e.kind, e.mb)
        if e not in free:
            continue
        if key not in end or end[key] <= free[e] - 1e-4:  # input was waiting for the rank
            over.append(e.start - free[e])
        elif e.start >= end[key]:
            lat.append(e.start - end[key])
    return _median(lat), _median(over)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def peak_in_flight(events: list[Event], p: int, v: int = 1) -> list[float]:
    """Measured peak of micro-batches whose forward ran and backward did not, per rank.

    Counted in full-stage micro-batches (a chunk of an interleaved rank counts 1/v), like
    schedules.simulate's peak_activations, from the order the rank really ran its ops.
    """
    peaks = []
    for s in range(p):
        live = peak = 0.0
        for e in sorted((e for e in events if e.stage == s), key=lambda e: e.start):
            live += 1 / v if e.kind == "F" else -1 / v
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def simulate_like(meas: Timeline, schedule: str, v: int = 1) -> Timeline:
    """The simulation of ``schedule`` fed with what ``meas`` measured.

    Each stage's mean forward/backward time plus the per-op overhead, and the send
    latency (gaps()). The overhead is drawn as a gap before each box, as it is in the
    measurement, so both bubbles count the same things.
    """

    tf, tb = stage_means(meas.events, meas.p)  # per stage, its v chunks summed
    latency, overhead = gaps(meas.events, meas.p)
    # simulate() runs each of the v chunk ops for tf/v: add v overheads so each op gets one
    tf = [t + v * overhead for t in tf]
    tb = [t + v * overhead for t in tb]
    sim = simulate(schedule, meas.p, meas.m, tf, tb, latency=latency, v=v)
    sim.events = [e._replace(start=e.start + overhead) for e in sim.events]
    sim.name = f"{schedule} simulated"
    return sim
