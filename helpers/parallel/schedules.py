"""Pipeline schedules as per-stage operation orders, and an event simulator for them.

A schedule says, for every pipeline rank (a *stage* below), the order in which it runs
its operations. An operation is ``Op(kind, mb, chunk)``:

    kind  "F" forward, "B" backward (input and weight gradients), or, for zero-bubble
          schedules, "B" = input gradient only and "W" = weight gradient
    mb    the micro-batch it works on (0..m-1)
    chunk the virtual stage on this rank (interleaved 1F1B: 0..v-1; else 0)

GPipe, p=3 stages, m=4 micro-batches (seeds 000/004 draw this table):

    stage 0  F0 F1 F2 F3 .  .  .  .  B3 B2 ...
    stage 1  .  F0 F1 F2 F3 .  .  B3 B2 ...
    stage 2  .  .  F0 F1 F2 F3 B3 B2 ...

``simulate(schedule, p, m, tf, tb, latency)`` plays an order on p ranks: each rank runs
its ops one after the other, and an op starts once its inputs exist (the previous
stage's forward output, the next stage's gradient, each arriving ``latency`` after it
was sent). Closed forms for equal stages (seed 000): makespan (m+p-1)(tf+tb), bubble
overhead (p-1)/m, bubble fraction (p-1)/(m+p-1), speedup m*p/(m+p-1); interleaving v
virtual stages per rank divides the bubble by v.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")


class Op(NamedTuple):
    kind: str  # "F", "B" or "W"
    mb: int
    chunk: int = 0


class Event(NamedTuple):
    stage: int
    kind: str
    mb: int
    start: float
    end: float
    chunk: int = 0


@dataclass
class Timeline:
    """What simulate() (or a measurement) returns: events plus the figures they imply."""

    events: list[Event]
    p: int
    m: int
    v: int = 1
    name: str = ""
    serial_time: float = 0.0  # one device running the whole model on all micro-batches
    peak_activations: list[float] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    @property
    def busy(self) -> list[float]:
        out = [0.0] * self.p
        for e in self.events:
            out[e.stage] += e.end - e.start
        return out

    @property
    def bubble(self) -> float:
        """Idle time over p x makespan: the fraction of the rank-time grid left empty."""
        return 1 - sum(self.busy) / (self.p * self.makespan)

    @property
    def speedup(self) -> float:
        return self.serial_time / self.makespan if self.serial_time else float("nan")


# --------------------------------------------------------------------------- orders


def naive(p: int, m: int) -> list[list[Op]]:
    """No micro-batching: the whole batch (m micro-batches' worth) is one op per stage."""
    return [[Op("F", 0), Op("B", 0)] for _ in range(p)]


def gpipe(p: int, m: int) -> list[list[Op]]:
    """All forwards, then all backwards (last in, first out as in seed 004's table)."""
    return [[Op("F", i) for i in range(m)] + [Op("B", i) for i in range(m)] for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Op]]:
    """PipeDream-flush / DAPPLE: p-s-1 warm-up forwards, then alternate F and B, then drain.

    Stage s keeps at most p-s micro-batches in flight instead of GPipe's m.
    """
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [Op("F", i) for i in range(warm)]
        for i in range(m - warm):
            ops += [Op("F", warm + i), Op("B", i)]
        ops += [Op("B", i) for i in range(m - warm, m)]
        orders.append(ops)
    return orders


def interleaved(p: int, m: int, v: int = 2) -> list[list[Op]]:
    """Megatron's interleaved 1F1B: rank s holds model stages s, s+p, ..., s+(v-1)p.

    Micro-batches go through in groups of p: forward k of a rank works on chunk
    (k // p) % v of micro-batch (k // (p v)) p + k % p; backwards visit chunks in reverse.
    """
    if m % p:
        raise ValueError(f"interleaved 1F1B needs m a multiple of p (m={m}, p={p}): change m")
    total = m * v

    def which(k: int, backward: bool) -> Op:
        chunk = (k // p) % v
        mb = (k // (p * v)) * p + k % p
        return Op("B" if backward else "F", mb, v - 1 - chunk if backward else chunk)

    orders = []
    for s in range(p):
        warm = min((p - s - 1) * 2 + (v - 1) * p, total)
        ops = [which(k, False) for k in range(warm)]
        for k in range(total - warm):
            ops += [which(warm + k, False), which(k, True)]
        ops += [which(k, True) for k in range(total - warm, total)]
        orders.append(ops)
    return orders


def zb_h1(p: int, m: int) -> list[list[Op]]:
    """Zero-bubble ZB-H1 (Qi et al. 2023): backward split into B (input grad) and W (weights).

    Only B is on the stage-to-stage critical path, so W can wait and fill bubbles. Stage s
    runs 1F1B on F and B, and delays its first s weight gradients to the end: each stage
    then holds at most p micro-batches, 1F1B's peak, and with F = B = W the bubble drops
    from (p-1)(F+B+W) to (p-1)(F+B-W).
    """
    out = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [Op("F", i) for i in range(warm)]
        w = 0  # weight gradients done so far
        for i in range(m):
            if warm + i < m:
                ops.append(Op("F", warm + i))
            ops.append(Op("B", i))
            if i >= s:
                ops.append(Op("W", w))
                w += 1
        out.append(ops + [Op("W", j) for j in range(w, m)])
    return out


def orders(schedule: str, p: int, m: int, v: int = 1) -> list[list[Op]]:
    """The per-stage op orders of a schedule named in SCHEDULES."""
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need p, m, v >= 1, got p={p}, m={m}, v={v}")
    makers = {"naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}
    if schedule == "interleaved":
        return interleaved(p, m, v)
    if schedule not in makers:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {SCHEDULES}")
    return makers[schedule](p, m)


# --------------------------------------------------------------------------- simulator


def _per_stage(x, p: int, name: str) -> list[float]:
    vals = [float(x)] * p if isinstance(x, int | float) else [float(t) for t in x]
    if len(vals) != p or min(vals) < 0:
        raise ValueError(f"{name} must be a number or {p} non-negative numbers, got {x!r}")
    return vals


def simulate(schedule, p: int, m: int, tf=1.0, tb=2.0, latency: float = 0.0, v: int = 1):
    """Play a schedule (a name from SCHEDULES, or per-stage Op lists) and return a Timeline.

    tf, tb: forward / backward time of one micro-batch on each stage (one number, or a
    list of p). With v chunks a chunk takes tf/v. Zero-bubble W and B take tb/2 each.
    ``naive`` runs the whole batch at once: its ops take m times longer.
    latency: added to every send from one stage to the next (activations or gradients).
    """
    name = schedule if isinstance(schedule, str) else "custom"
    if isinstance(schedule, str):
        v = v if schedule == "interleaved" else 1
        schedule = orders(schedule, p, m, v)
    if len(schedule) != p:
        raise ValueError(f"schedule has {len(schedule)} stages but p={p}")
    tf, tb = _per_stage(tf, p, "tf"), _per_stage(tb, p, "tb")
    split = any(op.kind == "W" for ops in schedule for op in ops)
    scale = m if name == "naive" else 1
    events = _play(schedule, p, v, latency, _durations(tf, tb, v, split, scale))
    tl = Timeline(events, p, m, v, name, serial_time=m * (sum(tf) + sum(tb)))
    tl.peak_activations = _peak_activations(schedule, v, split, scale)
    return tl


def _durations(tf, tb, v, split, scale):
    def dur(stage: int, kind: str) -> float:
        if kind == "F":
            return scale * tf[stage] / v
        return scale * tb[stage] / v / (2 if split else 1)

    return dur


def _play(schedule, p: int, v: int, latency: float, dur) -> list[Event]:
    """Event loop: repeatedly start, on any rank, the next op whose inputs have arrived."""
    last = p * v - 1  # model stage index of the loss
    ready: dict[tuple, float] = {}  # (kind, model_stage, mb) -> end time
    nxt, t_free, events = [0] * p, [0.0] * p, []
    pending = sum(len(ops) for ops in schedule)
    while pending:
        progressed = False
        for s in range(p):
            if nxt[s] == len(schedule[s]):
                continue
            op = schedule[s][nxt[s]]
            ms = op.chunk * p + s  # model stage this op belongs to
            if op.kind == "F":
                deps = [] if ms == 0 else [("F", ms - 1, op.mb, latency)]
            elif op.kind == "B":
                dep = ("F", ms, op.mb, 0.0) if ms == last else ("B", ms + 1, op.mb, latency)
                deps = [("F", ms, op.mb, 0.0), dep]
            else:
                deps = [("B", ms, op.mb, 0.0)]
            if any(d[:3] not in ready for d in deps):
                continue
            arrive = [ready[d[:3]] + (d[3] if (d[1] % p) != s else 0.0) for d in deps]
            start = max([t_free[s], *arrive])
            end = start + dur(s, op.kind)
            ready[(op.kind, ms, op.mb)] = t_free[s] = end
            events.append(Event(s, op.kind, op.mb, start, end, op.chunk))
            nxt[s] += 1
            pending -= 1
            progressed = True
        if not progressed:
            stuck = {s: schedule[s][nxt[s]] for s in range(p) if nxt[s] < len(schedule[s])}
            raise ValueError(f"schedule deadlocks: every rank waits, next ops {stuck}")
    return events


def _peak_activations(schedule, v: int, split: bool, scale: int) -> list[float]:
    """Most micro-batches whose activations a stage holds at once (F done, last grad not).

    Counted in full-stage micro-batches: a chunk of an interleaved stage holds 1/v of
    them; naive holds the whole batch (m micro-batches) at once.
    """
    freeing = "W" if split else "B"
    peaks = []
    for ops in schedule:
        live = peak = 0.0
        for op in ops:
            if op.kind == "F":
                live += scale / v
                peak = max(peak, live)
            elif op.kind == freeing:
                live -= scale / v
        peaks.append(peak)
    return peaks


# --------------------------------------------------------------------------- closed forms


def closed_form(p: int, m: int, tf: float = 1.0, tb: float = 2.0, v: int = 1) -> dict:
    """Seed 000's formulas for equal stages (v > 1: interleaved, bubble divided by v)."""
    bubble_time = (p - 1) * (tf + tb) / v
    makespan = m * (tf + tb) + bubble_time
    return {
        "makespan": makespan,
        "overhead": (p - 1) / (v * m),  # bubble time / useful time
        "bubble": bubble_time / makespan,  # idle / (p x makespan); (p-1)/(m+p-1) for v=1
        "speedup": m * p * (tf + tb) / makespan,  # m p / (m+p-1) for v=1
    }
