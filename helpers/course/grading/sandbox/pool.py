"""SandboxPool: the grader's sandboxed ranks and learner process, started once, reused.

    pool = SandboxPool(max_world=4)            # slots start in parallel (torch imported)
    pool.spawn(fn, 2, args, learner_source=src, programs={"lab2_zero1": code})
        -> [value of rank 0, value of rank 1]  # helpers.launch.spawn's contract
    pool.call("shard_range", 146, 1, 4, learner_source=src, programs={...})
        -> the learner function's value       # in the learner process, kept per source
    pool.close()                               # or: with SandboxPool() as pool: ...

Each slot is one bubblewrap sandbox (helpers.course.grading.sandbox.bwrap) holding a
python that imported torch (helpers.course.grading.sandbox.slot); rank r of a job runs in
slot r, direct calls in the last slot. A slot reaches the grader through exactly two
sockets: its control socket, and during a job the rank's relay socket, whose other end is
the grader's RelaySwitch (helpers.course.grading.relay), the ranks' only way to each other.

Everything a slot sends is read as data (wire frames, values with torch.load's
weights_only loader). Each job (and each notebook's learner process) runs in namespaces of
its own inside its slot (helpers.course.grading.sandbox.jail): its own IPC, fresh /tmp,
/dev/shm and /scratch, the modules the lab refuses absent (``refused=``), limits on
processes and memory, no capability. A job ends with every process it started killed; a
slot that dies or garbles its stream is started again.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import os
import pickle
import selectors
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from helpers.course.grading.sandbox import bwrap, wire
from helpers.course.grading.sandbox.absent import module_files, sent_by_value
from helpers.course.grading.sandbox.endpoint import Slot
from helpers.course.grading.sandbox.outcome import (
    SAFE_CLASSES,
    Output,
    SlotOutcome,
    learner_error,
    load_value,
    rank_failure,
    values_of,
)
from helpers.launch.torchrun import threads_per_rank

__all__ = ["SandboxPool"]

KILL_GRACE = 5.0  # seconds a slot has to report "done" after "kill" before it is restarted
PROCESSES = 512  # tasks (threads count) in one sandbox: a fork bomb stops there
FILE_BYTES = 1 << 30  # the largest file a job may write (its tmpfs are 1 GiB each too)


def source_id(learner_source: str, programs: Mapping[str, str], jail: Mapping = {}) -> str:
    text = json.dumps([learner_source, sorted(programs.items()), jail], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def memory_per_process(slots: int) -> int:
    """Bytes of data one sandboxed process may hold: half the machine's memory shared by
    the slots, at least 2 GiB (a rank of the labs holds well under 1 GiB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 << 30
    return max(2 << 30, total // 2 // max(1, slots))


class SandboxPool:
    """Rank slots and a learner slot in sandboxes (see the module docstring).

    ``course_root``: its secrets (solutions/, gradebook.db, ...) are hidden in the
    sandboxes, as are the checkout's; by default the current directory, where nbgrader
    runs. ``hide``: more paths to hide. ``safe_classes``: the classes a returned value
    may hold besides data (the recorder's, by default). ``switch``: makes the relay
    switch of a job from its sockets (``relay.switch.RelaySwitch`` by default).
    ``memory_bytes``: the data one sandboxed process may hold (``memory_per_process``);
    ``processes``: the tasks one sandbox may run at once (threads count).
    """

    def __init__(
        self,
        max_world: int = 4,
        *,
        course_root: Path | None = None,
        hide: Sequence[Path] = (),
        safe_classes: Sequence[type] = SAFE_CLASSES,
        call_timeout: float = 120.0,
        switch: Callable | None = None,
        memory_bytes: int | None = None,
        processes: int = PROCESSES,
    ):
        bwrap.require()
        self.max_world, self.safe, self.call_timeout = max_world, tuple(safe_classes), call_timeout
        self._switch = switch
        self.limits = {
            "nproc": processes,
            "data": memory_bytes or memory_per_process(max_world + 1),
            "fsize": FILE_BYTES,
            "core": 0,
        }
        self.root = Path(tempfile.mkdtemp(prefix="wb-sandbox-"))
        os.chmod(self.root, 0o700)  # the slots' logs: the grader's only
        hidden = bwrap.hidden_paths(Path.cwd() if course_root is None else course_root, hide)
        self.slots = [Slot(i, self.root, hidden) for i in range(max_world + 1)]
        self._lock = threading.RLock()
        self._arrivals = itertools.count()
        atexit.register(self.close)

    # -- lifetime
    def start(self, timeout: float = 180.0) -> None:
        """Start every slot that is not running, all at once, and wait until each is ready."""
        with self._lock:
            todo = [s for s in self.slots if not s.alive()]
            for slot in todo:
                slot.launch()
            deadline = time.monotonic() + timeout
            for slot in todo:
                slot.await_ready(deadline)

    def start_times(self) -> list[float | None]:
        """Seconds each slot took from launch to ready (torch imported), last start."""
        return [s.start_s for s in self.slots]

    def close(self) -> None:
        with self._lock:
            for slot in self.slots:
                slot.hang_up()  # all at once: each slot cleans up in parallel
            for slot in self.slots:
                slot.stop()
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def jail(self, refused: Sequence[str] = ()) -> dict:
        """What a job's process makes of its namespaces (sandbox.jail.enter): the files of the
        modules the lab refuses, to cover, and the limits."""
        return {"hide": module_files(refused), "limits": dict(self.limits)}

    # -- ranks
    def spawn(
        self,
        fn: Callable,
        world_size: int = 4,
        args: Sequence = (),
        *,
        learner_source: str = "",
        programs: Mapping[str, str] | None = None,
        timeout: float = 120,
        group: bool = True,
        refused: Sequence[str] = (),
    ) -> list:
        """Run ``fn(d, *args)`` on ``world_size`` sandboxed ranks; their values, index = rank.

        As helpers.launch.spawn: RankFailure names the failing rank with its traceback,
        printed lines come back prefixed ``[rankN]``, a job over ``timeout`` is stopped.
        ``group=False``: ranks get no process group (a world of separate processes).
        ``refused``: modules the lab refuses, absent from the ranks' sandboxes.
        """
        import cloudpickle

        if not 1 <= world_size <= self.max_world:
            raise ValueError(f"the sandbox pool runs 1 to {self.max_world} ranks, not {world_size}")
        try:
            with sent_by_value(refused):
                payload = cloudpickle.dumps((fn, tuple(args)))
        except Exception as e:
            raise TypeError(
                f"could not send {getattr(fn, '__name__', fn)!r} and its args "
                f"to the sandboxed ranks: {e}"
            ) from e
        request = pickle.dumps(
            {"payload": payload, "learner_source": learner_source, "programs": dict(programs or {})}
        )
        head = {
            "kind": "job",
            "world_size": world_size,
            "group": group,
            "threads": threads_per_rank(world_size),
            # the lab's test asked for the stand-in GPU (helpers.standin, strict): so do the ranks
            "device_check": "strict" if os.environ.get("WORKBOOK_DEVICE_CHECK") == "strict" else "",
            "jail": self.jail(refused),
        }
        with self._lock:
            self.start()
            slots = self.slots[:world_size]
            outcomes, timed_out = self._job(slots, head, request, group, timeout)
        failure = rank_failure(outcomes, timed_out, timeout)
        if failure is not None:
            raise failure
        return values_of(outcomes, self.safe)

    def _job(self, slots, head, request, group, timeout):
        n = len(slots)
        switch, ends = None, [None] * n
        if group:
            pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(n)]
            switch = self._make_switch([a for a, _ in pairs], slots)
            ends = [b for _, b in pairs]
        try:
            for rank, slot in enumerate(slots):
                slot.send(
                    {**head, "rank": rank},
                    request,
                    None if ends[rank] is None else ends[rank].fileno(),
                )
            for end in ends:
                if end is not None:
                    end.close()
            return self._collect(slots, [Output(r) for r in range(n)], timeout)
        finally:
            if switch is not None:
                switch.close()
                for a, _ in pairs:
                    a.close()

    def _make_switch(self, socks, slots=()):
        if self._switch is not None:
            return self._switch(socks)
        from helpers.course.grading.relay.switch import RelaySwitch
        from helpers.course.grading.sandbox.rank_pids import RankPids

        # the ranks' pids, for the memory the switch measures (the ranks cannot name them)
        pids = RankPids([s.proc.pid if s.proc is not None else -1 for s in slots])
        return RelaySwitch(socks, pid_of=pids)

    # -- the learner process
    def end_learner(self) -> None:
        """End the learner process and all it started: call it when a notebook is graded
        (the next call starts a fresh one; the rank slots keep nothing between jobs)."""
        with self._lock:
            slot = self.slots[-1]
            if slot.alive():
                slot.send({"kind": "end"})
                self._collect([slot], [Output(None)], 30.0)

    def pids(self) -> list[int]:
        """Every process of the pool's sandboxes now: bwrap, the slots, each slot's spare
        rank (forked ahead of the next job) and the learner process, if one lives."""
        import psutil

        out = []
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                root = psutil.Process(slot.proc.pid)
                out += [root.pid, *(p.pid for p in root.children(recursive=True))]
            except psutil.NoSuchProcess:
                continue
        return out

    def call(
        self,
        name: str,
        *args,
        learner_source: str = "",
        programs: Mapping[str, str] | None = None,
        refused: Sequence[str] = (),
        **kwargs,
    ):
        """``name(*args, **kwargs)`` in the learner process; its value as data.

        The learner's exception comes back as the same built-in type with its message
        (ValueError stays ValueError), or as LearnerError naming the learner's type.
        """
        import cloudpickle

        programs, jail = dict(programs or {}), self.jail(refused)
        with sent_by_value(refused):
            args_blob = cloudpickle.dumps((args, kwargs))
        blob = pickle.dumps(
            {
                "args": args_blob,
                "learner_source": learner_source,
                "programs": programs,
                "jail": jail,
            }
        )
        head = {
            "kind": "call",
            "name": name,
            "source_id": source_id(learner_source, programs, jail),
            "threads": threads_per_rank(1),
        }
        with self._lock:
            self.start()
            slot = self.slots[-1]
            slot.send(head, blob)
            (outcome,), timed_out = self._collect([slot], [Output(None)], self.call_timeout)
        if timed_out or outcome.lost or outcome.result is None:
            raise RuntimeError(
                f"{name}(...) did not return: "
                + (outcome.lost or f"stopped after {self.call_timeout:g} s")
            )
        header, data = outcome.result
        if not header.get("ok"):
            raise learner_error(header)
        return load_value(data, f"{name}(...)", self.safe)

    # -- the event loop of one job or call
    def _collect(self, slots, outputs, timeout):
        outcomes = [SlotOutcome(rank=i) for i in range(len(slots))]
        sel = selectors.DefaultSelector()
        for i, slot in enumerate(slots):
            sel.register(slot.sock, selectors.EVENT_READ, i)
        deadline, killed_at, timed_out, first_fail = time.monotonic() + timeout, None, False, None
        try:
            while not all(o.done for o in outcomes):
                now = time.monotonic()
                if first_fail is None and any(o.failed for o in outcomes):
                    first_fail = now
                if killed_at is None and (now >= deadline or _give_up(outcomes, first_fail, now)):
                    timed_out = now >= deadline and first_fail is None
                    killed_at = now
                    for o, slot in zip(outcomes, slots, strict=True):
                        o.killed = True
                        if not o.done:
                            _send_kill(slot)
                if killed_at is not None and now >= killed_at + KILL_GRACE:
                    break
                wait = (killed_at + KILL_GRACE if killed_at else deadline) - now
                for key, _ in sel.select(max(0.0, min(wait, 0.25))):
                    self._read(slots[key.data], outcomes[key.data], outputs[key.data], sel)
        finally:
            sel.close()
            for out in outputs:
                out.flush()
        for o, slot in zip(outcomes, slots, strict=True):
            if not o.done:  # it did not stop when asked: start it afresh next time
                o.lost = o.lost or "the sandbox did not stop when asked and was ended"
                slot.stop()
        return outcomes, timed_out

    def _read(self, slot: Slot, o: SlotOutcome, out: Output, sel) -> None:
        try:
            data = slot.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        try:
            frames = slot.reader.feed(data) if data else None
        except wire.FrameError as e:
            frames, o.lost = None, f"its sandbox sent garbage ({e}) and was ended"
        if frames is None:  # the sandbox ended (the learner's code killed it) or garbled
            o.lost = o.lost or "its sandbox ended during the job (a process killed it)"
            o.done = True
            sel.unregister(slot.sock)
            slot.stop()
            return
        for header, blob in frames:
            kind = header["kind"]
            if kind == "out" and header.get("stream") in ("o", "e"):
                out.feed(header["stream"], blob)
            elif kind == "result" and o.result is None:
                o.result, o.late = (header, blob), o.killed
                o.order = next(self._arrivals)
            elif kind == "done":
                o.done = True
                code = header.get("code")
                o.code = code if isinstance(code, int) else None


def _give_up(outcomes: list[SlotOutcome], first_fail: float | None, now: float) -> bool:
    """A rank failed: stop the others once every rank is accounted for or after a grace
    (0.3 s after an error of its own, 3 s when it only saw a peer vanish)."""
    if first_fail is None:
        return False
    if all(o.result is not None or o.done for o in outcomes):
        return True
    own = any(o.own_failure for o in outcomes)
    return now >= first_fail + (0.3 if own else 3.0)


def _send_kill(slot: Slot) -> None:
    try:
        slot.send({"kind": "kill"})
    except OSError:
        pass
