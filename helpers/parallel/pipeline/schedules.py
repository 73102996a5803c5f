"""Pipeline schedules as per-stage operation orders, and an event simulator for them.

A schedule says, for every pipeline rank (a *stage* below), the order in which it runs
its operations. An operation is ``Op(kind, mb, chunk)``:

    kind  "F" forward, "B" backward (input and weight gradients), or, for zero-bubble
          schedules, "B" = input gradient only and "W" = weight gradient
    mb    the micro-batch it works on (0..m-1)
    chunk the virtual stage on this rank (interleaved: 0..v-1; else 0)

GPipe, p=3 stages, m=4 micro-batches (first in, first out, as torch's ScheduleGPipe runs it):

    stage 0  F0 F1 F2 F3 .  .  .  .  B0 B1 ...
    stage 1  .  F0 F1 F2 F3 .  .  B0 B1 ...
    stage 2  .  .  F0 F1 F2 F3 B0 B1 ...

``simulate(schedule, p, m, tf, tb, latency)`` plays an order on p ranks: each rank runs
its ops one after the other, and an op starts once its inputs exist (the previous
stage's forward output, the next stage's gradient, each arriving ``latency`` after it
was sent). Two quantities are both called "the bubble"; with equal stages (seed 000):

    bubble overhead  idle / useful time           = (p-1)/m           (Timeline.overhead; Megatron-LM's form)
    bubble fraction  idle / (p x makespan)        = (p-1)/(m+p-1)     (Timeline.bubble; GPipe's form)

(Megatron-LM, Narayanan et al. 2021, calls its (p-1)/m the "bubble time fraction"; GPipe, Huang
et al. 2019, calls its (K-1)/(M+K-1) the "bubble overhead": quote the formula, not the name.)

and makespan (m+p-1)(tf+tb), speedup m*p/(m+p-1); interleaving v virtual stages per rank
divides the idle time by v. The interleaved orders are torch's (ScheduleInterleaved1F1B,
ScheduleInterleavedZeroBubble), including torch's relaxed rule on m (``rounds``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "interleaved-zb")


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
    cpu: float | None = None  # CPU seconds the op's thread spent in it (measured ops only)


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
        """Bubble fraction: idle time over p x makespan, the share of the rank-time grid left
        empty; (p-1)/(m+p-1) for equal stages."""
        return 1 - sum(self.busy) / (self.p * self.makespan)

    @property
    def overhead(self) -> float:
        """Bubble overhead: idle time over busy time, what the pipeline adds to the useful
        work; (p-1)/m for equal stages (GPipe paper's and Megatron's "bubble")."""
        return self.p * self.makespan / sum(self.busy) - 1

    @property
    def speedup(self) -> float:
        return self.serial_time / self.makespan if self.serial_time else float("nan")


# --------------------------------------------------------------------------- orders


def naive(p: int, m: int) -> list[list[Op]]:
    """No micro-batching: the whole batch (m micro-batches' worth) is one op per stage."""
    return [[Op("F", 0), Op("B", 0)] for _ in range(p)]


def gpipe(p: int, m: int) -> list[list[Op]]:
    """All forwards, then all backwards in the same order: first in, first out, as torch's
    ScheduleGPipe runs them (seed 004's table draws them last in, first out: with equal
    stages both orders take the same time)."""
    return [[Op("F", i) for i in range(m)] + [Op("B", i) for i in range(m)] for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Op]]:
    """PipeDream-flush / DAPPLE: p-s-1 warm-up forwards, then alternate F and B, then drain.

    Stage s keeps at most p-s micro-batches in flight instead of GPipe's m: stage 0 holds
    the most (p), which makes it the memory bottleneck.
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


def rounds(p: int, m: int) -> int:
    """Micro-batches per round of torch's interleaved schedules.

    Megatron's rule was m a multiple of p (rounds of p micro-batches). torch relaxes it:
    r = max(1, m // p) rounds of m / r micro-batches each, so m must divide by r only
    (p=4: m = 3, 4, 6, 8, 10, 12 ... work; m = 9 does not).
    """
    r = max(1, m // p)
    if m % r:
        ok = [k for k in range(1, 4 * p + 1) if k % max(1, k // p) == 0]
        raise ValueError(
            f"interleaved schedules need m divisible by its {r} rounds (torch's rule, "
            f"rounds = max(1, m // p)); m={m} with p={p} is not: try m in {ok}"
        )
    return m // r


def _looped(p: int, m: int, v: int, hops: int, zero_bubble: bool) -> list[list[Op]]:
    """torch's interleaved family: rank s holds model stages s, s+p, ..., s+(v-1)p.

    Forwards visit the rank's chunks in turn, a round of ``rounds(p, m)`` micro-batches
    per chunk; backwards visit them in reverse. Stage s warms up with (v-1) rounds plus
    ``hops`` forwards per stage after it, then alternates one forward and one backward.
    With ``zero_bubble`` each backward is the input gradient only; the weight gradients
    follow them in the same order, the first s of them held back to fill the drain.
    """
    per_round = rounds(p, m)
    orders = []
    for s in range(p):
        warm = min((v - 1) * per_round + hops * (p - 1 - s), m * v)
        fwd_chunk = [(k // per_round) % v for k in range(m * v)]
        bwd_chunk = [v - 1 - (j // per_round) % v for j in range(m * v)]
        seen: dict[tuple, int] = {}

        def op(kind: str, chunk: int, seen: dict = seen) -> Op:
            mb = seen.get((kind, chunk), 0)
            seen[(kind, chunk)] = mb + 1
            return Op(kind, mb, chunk)

        ops = [op("F", fwd_chunk[k]) for k in range(warm)]
        w = 0  # weight gradients issued so far
        for j in range(m * v):  # the j-th backward, after the forward it pairs with
            if warm + j < m * v:
                ops.append(op("F", fwd_chunk[warm + j]))
            ops.append(op("B", bwd_chunk[j]))
            if zero_bubble and j >= s:
                ops.append(op("W", bwd_chunk[w]))
                w += 1
        if zero_bubble:
            ops += [op("W", bwd_chunk[k]) for k in range(w, m * v)]
        orders.append(ops)
    return orders


def interleaved(p: int, m: int, v: int = 2) -> list[list[Op]]:
    """Interleaved 1F1B (Megatron-LM; torch's ScheduleInterleaved1F1B, its order exactly).

    Each rank holds v chunks; stage s warms up with (v-1) rounds + 2(p-1-s) forwards.
    """
    return _looped(p, m, v, hops=2, zero_bubble=False)


def zb_h1(p: int, m: int) -> list[list[Op]]:
    """Zero-bubble ZB-H1 (Qi et al. 2023): backward split into B (input grad) and W (weights).

    Only B is on the stage-to-stage critical path, so W can wait and fill bubbles. Stage s
    runs 1F1B on F and B and holds back its first s weight gradients: every stage then
    holds up to p micro-batches (1F1B's stage-0 peak, more than 1F1B on later stages), and
    with F = B = W the bubble drops from (p-1)(F+B+W) to (p-1)(F+B-W). This is torch's
    ScheduleInterleavedZeroBubble with one stage per rank.
    """
    return _looped(p, m, 1, hops=1, zero_bubble=True)


def interleaved_zb(p: int, m: int, v: int = 2) -> list[list[Op]]:
    """ZB-H1 on v chunks per rank: torch's ScheduleInterleavedZeroBubble (the paper's ZB1P)."""
    return _looped(p, m, v, hops=1, zero_bubble=True)


def orders(schedule: str, p: int, m: int, v: int = 1) -> list[list[Op]]:
    """The per-stage op orders of a schedule named in SCHEDULES."""
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need p, m, v >= 1, got p={p}, m={m}, v={v}")
    makers = {"naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}
    if schedule == "interleaved":
        return interleaved(p, m, v)
    if schedule == "interleaved-zb":
        return interleaved_zb(p, m, v)
    if schedule not in makers:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {SCHEDULES}")
    return makers[schedule](p, m)


# --------------------------------------------------------------------------- simulator


def _per_stage(x, p: int, name: str) -> list[float]:
    vals = [float(x)] * p if isinstance(x, int | float) else [float(t) for t in x]
    if len(vals) != p or min(vals) < 0:
        raise ValueError(f"{name} must be a number or {p} non-negative numbers, got {x!r}")
    return vals


def simulate(schedule, p: int, m: int, tf=1.0, tb=2.0, latency: float = 0.0, v: int = 1,
             tw=None):  # fmt: skip
    """Play a schedule (a name from SCHEDULES, or per-stage Op lists) and return a Timeline.

    tf, tb: forward / whole backward time of one micro-batch on each stage (one number, or
    a list of p). With v chunks a chunk takes tf/v. Zero-bubble schedules split the
    backward: W takes tw (default tb/2) and B the rest.
    ``naive`` runs the whole batch at once: its ops take m times longer.
    latency: added to every send from one stage to the next (activations or gradients).
    """
    name = schedule if isinstance(schedule, str) else "custom"
    if isinstance(schedule, str):
        v = v if schedule.startswith("interleaved") else 1
        schedule = orders(schedule, p, m, v)
    if len(schedule) != p:
        raise ValueError(f"schedule has {len(schedule)} stages but p={p}")
    tf, tb = _per_stage(tf, p, "tf"), _per_stage(tb, p, "tb")
    tw = [t / 2 for t in tb] if tw is None else _per_stage(tw, p, "tw")
    if any(w > b for w, b in zip(tw, tb, strict=True)):
        raise ValueError(f"tw={tw} must not exceed the whole backward tb={tb}")
    split = any(op.kind == "W" for ops in schedule for op in ops)
    scale = m if name == "naive" else 1
    dur = {
        "F": [scale * t / v for t in tf],
        "B": [scale * (b - w if split else b) / v for b, w in zip(tb, tw, strict=True)],
        "W": [scale * w / v for w in tw],
    }
    events = _play(schedule, p, v, latency, dur)
    tl = Timeline(events, p, m, v, name, serial_time=m * (sum(tf) + sum(tb)))
    tl.peak_activations = _peak_activations(schedule, v, split, scale)
    return tl


def _play(schedule, p: int, v: int, latency: float, dur: dict) -> list[Event]:
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
            end = start + dur[op.kind][s]
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
    them; naive holds the whole batch (m micro-batches) at once. Zero-bubble schedules
    keep a micro-batch until its W (the weight gradient needs the layer inputs).
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
    """Seed 000's formulas for equal stages (v > 1: interleaved, idle time divided by v)."""
    bubble_time = (p - 1) * (tf + tb) / v
    makespan = m * (tf + tb) + bubble_time
    return {
        "makespan": makespan,
        "overhead": (p - 1) / (v * m),  # bubble overhead: idle / useful time
        "bubble": bubble_time / makespan,  # bubble fraction: idle / (p x makespan)
        "speedup": m * p * (tf + tb) / makespan,  # m p / (m+p-1) for v=1
    }
