"""What a real pipeline did, measured on each rank: its timeline, its saved activations, its
messages; and the simulation fed with what was measured.

* ``timed(stage, rank, events)``: the start and end of every forward (F), backward (B; the
  input gradient only in zero-bubble schedules) and weight gradient (W) a stage runs, and
  the CPU seconds its thread spent in it (``cpu_means``: what the work cost, which other
  programs' load does not stretch, where the wall time also counts waiting for a core).
  ``measured_timeline`` turns those timestamps (one clock for all local processes:
  time.perf_counter is CLOCK_MONOTONIC) into the Timeline helpers.parallel.pipeline.schedules.simulate
  returns, so both can be drawn side by side; ``simulate_like`` is that simulation.
* ``SavedBytes``: the bytes of the tensors autograd saved for backward and still holds,
  over time, counted with ``torch.autograd.graph.saved_tensors_hooks`` around each forward.
* ``SentBytes``: the bytes of every activation and gradient a stage sends to its neighbour.
"""

from __future__ import annotations

import time

import torch

from helpers.parallel.pipeline.schedules import Event, Timeline, simulate

__all__ = ["timed", "SavedBytes", "SentBytes", "measured_timeline", "stage_means", "cpu_means",
           "weight_means", "gaps", "peak_in_flight", "simulate_like"]  # fmt: skip


def timed(stage, rank: int, events: list):
    """Record (kind, micro-batch, start, end, CPU seconds) of every F, B and W this stage runs.

    Wrapping the stage's own compute methods keeps sends and receives out of the
    measured boxes: what is left between boxes is waiting (the bubble) or communication.
    """
    chunk = stage.stage_index // stage.group_size

    def wrap(method, kind):
        def run(mb, *args, **kwargs):
            t0, cpu0 = time.perf_counter(), time.thread_time()  # autograd runs CPU work here
            out = method(mb, *args, **kwargs)
            cpu = time.thread_time() - cpu0
            events.append(Event(rank, kind, mb, t0, time.perf_counter(), chunk, cpu))
            return out

        return run

    stage.forward_one_chunk = wrap(stage.forward_one_chunk, "F")
    stage.backward_one_chunk = wrap(stage.backward_one_chunk, "B")
    stage.backward_weight_one_chunk = wrap(stage.backward_weight_one_chunk, "W")
    return stage


class _Held:
    """What autograd keeps instead of a saved tensor: the tensor, and a receipt for it."""

    __slots__ = ("tensor", "key", "owner")

    def __init__(self, tensor, key, owner):
        self.tensor, self.key, self.owner = tensor, key, owner

    def __del__(self):  # autograd let go of it: after the backward that used it
        if self.key is not None:
            self.owner._release(self.key)


class SavedBytes:
    """Bytes of activations autograd holds for backward on this rank, live and at their peak.

    ``track(stage)`` runs each forward of the stage under saved_tensors_hooks: every tensor
    autograd saves is counted once per storage (Tanh's output and the next Linear's input
    are one tensor), and un-counted when autograd frees it (after the backward, or the W of
    a zero-bubble schedule). Parameters and the step's input and target batches are not
    counted (they exist anyway: ``skip``). ``trace`` is [(time, bytes)] at every change.
    """

    def __init__(self, skip=()):
        self.skip = {t.untyped_storage().data_ptr() for t in skip}
        self.live: dict[int, list[int]] = {}  # storage -> [references, bytes]
        self.bytes = self.peak = 0
        self.trace: list[tuple[float, int]] = []

    def _pack(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr()
        # detached: a saved output would otherwise hold its own grad_fn, a cycle through
        # autograd's graph that nothing frees when a backward keeps the graph (zero bubble)
        t = t.detach()
        if key in self.skip or t.device.type == "meta":
            return _Held(t, None, self)
        if key in self.live:
            self.live[key][0] += 1
        else:
            self.live[key] = [1, t.untyped_storage().nbytes()]
            self._change(self.live[key][1])
        return _Held(t, key, self)

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self.live[key]
            self._change(-entry[1])

    def _change(self, delta: int) -> None:
        self.bytes += delta
        self.peak = max(self.peak, self.bytes)
        self.trace.append((time.perf_counter(), self.bytes))

    def reset(self) -> None:
        self.peak = self.bytes
        self.trace = [(time.perf_counter(), self.bytes)]

    def hooks(self):
        """The context under which every tensor autograd saves is counted."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor)

    def track(self, stage):
        forward = stage.forward_one_chunk

        def run(*args, **kwargs):
            with self.hooks():
                return forward(*args, **kwargs)

        stage.forward_one_chunk = run
        return stage


class SentBytes:
    """Bytes a stage sends: activations forward, gradients backward, per micro-batch."""

    def __init__(self):
        self.sent: list[tuple[str, int, int]] = []  # (direction, micro-batch, bytes)

    def track(self, stage):
        for direction, name in (("activations", "get_fwd_send_ops"), ("gradients", "get_bwd_send_ops")):  # fmt: skip
            method = getattr(stage, name)

            def run(mb, *args, _method=method, _direction=direction, **kwargs):
                ops = _method(mb, *args, **kwargs)
                size = sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
                if ops:
                    self.sent.append((_direction, mb, size))
                return ops

            setattr(stage, name, run)
        return stage


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


def _means(events: list[Event], p: int, kinds: str, cpu: bool = False) -> list[float]:
    """Per rank: the mean duration (or CPU seconds) of its ops of each kind in ``kinds``,
    chunks summed."""
    out = [0.0] * p
    for s in range(p):
        durs: dict[tuple, list[float]] = {}
        for e in events:
            if e.stage == s and e.kind in kinds:
                if cpu and e.cpu is None:
                    raise ValueError(f"{e} has no CPU seconds: only ops that timed() ran do")
                durs.setdefault((e.kind, e.chunk), []).append(e.cpu if cpu else e.end - e.start)
        out[s] = sum(sum(ds) / len(ds) for ds in durs.values())
    return out


def stage_means(events: list[Event], p: int) -> tuple[list[float], list[float]]:
    """Mean forward and whole-backward (B + W) time of one micro-batch on each rank."""
    return _means(events, p, "F"), _means(events, p, "BW")


def cpu_means(events: list[Event], p: int) -> tuple[list[float], list[float]]:
    """Mean CPU seconds of a forward and of a whole backward (B + W) on each rank."""
    return _means(events, p, "F", cpu=True), _means(events, p, "BW", cpu=True)


def weight_means(events: list[Event], p: int) -> list[float]:
    """Mean weight-gradient (W) time of one micro-batch on each rank (0 without W ops)."""
    return _means(events, p, "W")


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
        if e not in free:
            continue
        if e.kind == "W":  # needs only this rank's own B: never waits for a message
            over.append(e.start - free[e])
            continue
        ms = e.chunk * p + e.stage
        src = ms - 1 if e.kind == "F" else ms + 1
        key = (src % p, src // p, e.kind, e.mb)
        if key not in end or end[key] <= free[e] - 1e-4:  # input was waiting for the rank
            over.append(e.start - free[e])
        elif e.start >= end[key]:
            lat.append(e.start - end[key])
    return _median(lat), _median(over)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def peak_in_flight(events: list[Event], p: int, v: int = 1) -> list[float]:
    """Measured peak of micro-batches whose forward ran and whose last gradient did not.

    Counted in full-stage micro-batches (a chunk of an interleaved rank counts 1/v), like
    schedules.simulate's peak_activations, from the order the rank really ran its ops; a
    zero-bubble schedule frees a micro-batch at its W.
    """
    peaks = []
    for s in range(p):
        mine = sorted((e for e in events if e.stage == s), key=lambda e: e.start)
        freeing = "W" if any(e.kind == "W" for e in mine) else "B"
        live = peak = 0.0
        for e in mine:
            live += 1 / v if e.kind == "F" else -1 / v if e.kind == freeing else 0
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def simulate_like(meas: Timeline, schedule, v: int = 1) -> Timeline:
    """The simulation of ``schedule`` (a name, or per-stage Op lists) fed with ``meas``.

    Each stage's mean forward/backward (and weight-gradient) time plus the per-op overhead,
    and the send latency (gaps()). The overhead is drawn as a gap before each box, as it
    is in the measurement, so both bubbles count the same things.
    """
    tf, tb = stage_means(meas.events, meas.p)  # per stage, its v chunks summed
    tw = weight_means(meas.events, meas.p)
    latency, overhead = gaps(meas.events, meas.p)
    split = any(e.kind == "W" for e in meas.events)
    # simulate() runs each of the v chunk ops for tf/v: add v overheads so each op gets one
    tf = [t + v * overhead for t in tf]
    tb = [t + v * overhead * (2 if split else 1) for t in tb]  # B and W: one gap each
    tw = [t + v * overhead for t in tw] if split else None
    sim = simulate(schedule, meas.p, meas.m, tf, tb, latency=latency, v=v, tw=tw)
    sim.events = [e._replace(start=e.start + overhead) for e in sim.events]
    sim.name = f"{schedule if isinstance(schedule, str) else meas.name.split()[0]} simulated"
    return sim
