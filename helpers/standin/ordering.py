"""The stand-in's process groups keep NCCL's order (helpers.standin.nccl_order says what it is).

``OpLog`` notes each operation a rank posts: what it is, where the program posted it (the
line), whether it belongs to a ``batch_isend_irecv``, and which operations the rank waited
for before it. A dry-run rank alone keeps its log (``helpers.course.dryrun`` reads it).

``GroupCheck`` is the device-strict group's: every rank publishes its operations to the
group's store as it posts them, and before a rank waits for one, it reads the others' and
runs NCCL's model on them all:

* an operation NCCL would never complete (a cycle of waits: both ranks of a pair sending
  first) fails at once, naming each rank's line and the fix;
* a collective that another rank called with other shapes, another dtype or another kind
  (or not at all, and called the next one instead) fails naming both ranks' lines;
* when every rank is waiting for something no rank will post (a rank skipped a collective,
  or never posted the receive its peer waits for), every rank fails with what each waits for,
  in a fraction of a second rather than at the group's timeout.

The check costs a few store round trips an operation (a TCPStore on the local machine).
"""

from __future__ import annotations

import json
import linecache
import sys
import sysconfig
import threading
import time
from pathlib import Path

import torch
import torch.distributed as tdist

from helpers.standin.nccl_explain import why
from helpers.standin.nccl_order import FIX, RULE, Model, Op, describe

__all__ = ["OpLog", "GroupCheck", "WouldHang", "call_site", "end_all"]

_TORCH = str(Path(torch.__file__).resolve().parent)
_HERE = str(Path(__file__).resolve().parent)
_TOP = Path(__file__).resolve().parents[2]  # the checkout holding helpers/
# the workbook's own plumbing between a program and its process group (and the dry run's)
_PLUMBING = (*(str(_TOP / "helpers" / "course" / "grading" / p) for p in ("recorder", "relay")),
             str(_TOP / "helpers" / "course" / "dryrun"))  # fmt: skip
_LIBRARIES = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
_BATCH = tdist.distributed_c10d.batch_isend_irecv.__code__
_LIVE: list = []  # the GroupChecks of this process, told when the program ends


class WouldHang(RuntimeError):
    """What NCCL would do with these operations: hang (or mix up the data)."""


def _short(filename: str) -> str:
    """helpers/x.py for the workbook's files, program.py for others, cell for a notebook's."""
    path = Path(filename)
    if path.parent.name.startswith("ipykernel_"):
        return "cell"
    try:
        return str(path.resolve().relative_to(_TOP))
    except ValueError:
        return path.name


def call_site() -> str:
    """'program.py:8: req = tdist.isend(x, 1)' for the program's call into torch.distributed
    (the innermost frame outside torch and the stand-in; with the program's own line after it
    when a workbook helper made the call)."""
    frame, inner, main = sys._getframe(1), None, None
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith((_TORCH, _HERE, *_PLUMBING, *_LIBRARIES)):
            inner = inner or frame
            if frame.f_globals.get("__name__") == "__main__":
                main = frame
                break
        frame = frame.f_back

    def text(f) -> str:
        code = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
        return f"{_short(f.f_code.co_filename)}:{f.f_lineno}: {code}"

    if inner is None:
        return ""
    return text(inner) + (f" (from {text(main)})" if main is not None and main is not inner else "")


def _in_batch():
    """The running batch_isend_irecv's frame, if this call comes from one."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _BATCH:
            return frame
        frame = frame.f_back
    return None


class OpLog:
    """One rank's operations in one group, as NCCL's model needs them."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.ops: list[Op] = []
        self._waited: list[int] = []  # operations waited for since the last one posted
        self._batch_frame = None
        self._batches = 0
        self.lock = threading.RLock()

    def post(self, kind: str, peer: int = -1, tensors=(), name: str = "", sig: str = "") -> int:
        """Note an operation; its index (what ``waited`` takes)."""
        with self.lock:
            frame = _in_batch() if kind != "coll" else None
            if frame is None or frame is not self._batch_frame:
                self._close_batch()
                if frame is not None:
                    self._batch_frame, self._batches = frame, self._batches + 1
            numel = sum(t.numel() for t in tensors)
            dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else ""
            op = Op(self.rank, len(self.ops), kind, peer, self._batches if frame else None,
                    numel, dtype, name, call_site(), tuple(self._waited), sig)  # fmt: skip
            self._waited = []
            self.ops.append(op)
            self._posted(op)
            return op.index

    def waited(self, index: int) -> None:
        with self.lock:
            self._close_batch()
            if index not in self._waited:
                self._waited.append(index)

    def _close_batch(self) -> None:
        self._batch_frame = None

    def _posted(self, op: Op) -> None:
        pass


class GroupCheck(OpLog):
    """A device-strict rank's check of its group against NCCL's model (module docstring)."""

    def __init__(self, store, rank: int, size: int, timeout_s: float):
        super().__init__(rank, size)
        self.store, self.timeout_s = store, timeout_s
        self.model = Model(size)
        self.seen = [0] * size
        self.unsent: list[Op] = []  # this rank's batch, published when it closes
        self.reported = 0  # model.problems already raised
        _LIVE.append(self)

    # -- publishing --------------------------------------------------------------
    def _posted(self, op: Op) -> None:
        self.model.add(op)
        self.seen[self.rank] += 1
        self.unsent.append(op)
        if op.batch is None:
            self._publish()
        if op.kind == "coll":  # another rank may have called it already: compare now
            self._pull()
            self._raise_problems()

    def _close_batch(self) -> None:
        super()._close_batch()
        if self.unsent:
            self._publish()

    def _publish(self) -> None:
        for op in self.unsent:
            self.store.set(f"nccl/op/{self.rank}/{op.index}", json.dumps(op.__dict__))
        if self.unsent:
            self.store.add(f"nccl/n/{self.rank}", len(self.unsent))
        self.unsent = []

    def _pull(self) -> None:
        for q in range(self.size):
            if q == self.rank:
                continue
            n = self.store.add(f"nccl/n/{q}", 0)
            if n > self.seen[q]:
                keys = [f"nccl/op/{q}/{i}" for i in range(self.seen[q], n)]
                for raw in self.store.multi_get(keys):
                    fields = json.loads(bytes(raw).decode())
                    fields["after"] = tuple(fields["after"])
                    self.model.add(Op(**fields))
                self.seen[q] = n

    def _raise_problems(self) -> None:
        if len(self.model.problems) > self.reported:
            self.reported = len(self.model.problems)
            raise WouldHang(f"stand-in GPU (NCCL's rules): {self.model.problems[-1]}")

    # -- waiting ------------------------------------------------------------------------
    def wait(self, index: int) -> WouldHang | None:
        """Return when NCCL would complete this rank's operation ``index``; raise if never.

        While it waits, the rank's marker in the store says so ('ops posted:index'); it is
        not cleared after (a rank past its wait has posted more, or its wait is done in every
        rank's model: either way no rank reads it as stuck), so that nothing is written to a
        store whose host, rank 0, may have ended its program as soon as this wait was done.

        If that store is gone (its host ended) the model cannot be asked any more: the wait
        returns the error to raise should gloo's own operation fail too (``standin.work``), as
        it does when the peer never posted its match; an operation the peer did match (rank 0
        passed the last barrier and left before this rank read its marker) completes."""
        with self.lock:
            self.waited(index)
        deadline, pause, marked = time.monotonic() + self.timeout_s, 0.0005, False
        while True:
            with self.lock:
                try:
                    if self._ask(index, marked):
                        return None
                except tdist.DistError as e:  # the store's host ended while this rank waits
                    return self._gone(index, e)
                marked = True
            if time.monotonic() > deadline:
                raise WouldHang(f"stand-in GPU: waited {self.timeout_s:g} s for "
                                f"{describe(self._first(index))}")  # fmt: skip
            time.sleep(pause)
            pause = min(2 * pause, 0.02)

    def _ask(self, index: int, marked: bool) -> bool:
        """One look at every rank's operations: True when ``index`` is done; raise if never."""
        self._pull()
        self.model.update()
        self._raise_problems()
        if self.model.is_done(self.rank, index):
            return True
        self._refuse_cycle(index)
        if not marked:
            self.store.set(f"nccl/blocked/{self.rank}", f"{len(self.ops)}:{index}")
        self._refuse_if_all_stuck(index)
        return False

    def _first(self, index: int) -> Op:
        return self.model.items[self.model.item_of[self.rank, index]].ops[0]

    def _gone(self, index: int, error: Exception) -> WouldHang:
        held = why(self.model, self.model.item_of[self.rank, index], final=True)
        return WouldHang(f"stand-in GPU: the group's store is gone ({str(error).split('.')[0][:80]}): the rank "
                         "that hosts it ended while this one waited, and the operation failed; "
                         f"as far as this rank saw: {held}")  # fmt: skip

    def _refuse_cycle(self, index: int) -> None:
        stuck = self.model.stuck()
        if not stuck:
            return
        mine = self.model.item_of[self.rank, index]
        first = mine if mine in stuck else stuck[0]
        raise WouldHang(f"stand-in GPU: {RULE}; so on GPUs this hangs:\n  "
                        f"{why(self.model, first)}.\nFix: {FIX}")  # fmt: skip

    def _markers(self) -> dict[int, str] | None:
        """Every other rank's 'count:what it waits for' (or 'count:end'), or None if one runs."""
        keys = [f"nccl/blocked/{q}" for q in range(self.size) if q != self.rank]
        if keys and not self.store.check(keys):
            return None
        values = [bytes(v).decode() for v in self.store.multi_get(keys)] if keys else []
        if not all(values):
            return None
        return dict(zip([q for q in range(self.size) if q != self.rank], values, strict=True))

    def _refuse_if_all_stuck(self, index: int) -> None:
        """Every rank waits (or ended) and nothing posted so far completes any of the waits:
        nothing will ever be posted again. Fail with what each rank waits for."""
        first = self._markers()
        if first is None:
            return
        self._pull()
        self.model.update()
        if self._markers() != first:
            return
        counts = {q: int(v.split(":")[0]) for q, v in first.items()}
        if any(self.seen[q] != counts[q] for q in counts):
            return
        waits = {q: v.split(":")[1] for q, v in first.items()}
        waits[self.rank] = str(index)
        lines = []
        for q in sorted(waits):
            if waits[q] == "end":
                lines.append(f"rank {q} ended its program after {counts[q]} operations")
                continue
            if self.model.is_done(q, int(waits[q])):
                return  # that rank can go on: it will see so itself
            lines.append(why(self.model, self.model.item_of[q, int(waits[q])], final=True))
        raise WouldHang("stand-in GPU: every rank waits for something no rank will post "
                        "(on NCCL: a hang until the watchdog's timeout):\n  "
                        + ";\n  ".join(lines) + ".")  # fmt: skip

    def end(self) -> None:
        """The program ended: tell the ranks still waiting not to wait for this one."""
        with self.lock:
            self._close_batch()
            self.store.set(f"nccl/blocked/{self.rank}", f"{len(self.ops)}:end")

    def await_ends(self) -> None:
        """Return when every other rank of the group has ended its program (at most the
        group's timeout): rank 0's process hosts the store, and a rank still running would
        find it gone (a dry run stops each rank at its own second optimizer step, without the
        barrier of ``dist.cleanup``)."""
        keys = [f"nccl/blocked/{q}" for q in range(self.size) if q != self.rank]
        deadline, pause = time.monotonic() + self.timeout_s, 0.001
        while keys and time.monotonic() < deadline:
            if self.store.check(keys):
                if all(bytes(v).decode().endswith(":end") for v in self.store.multi_get(keys)):
                    return
            time.sleep(pause)
            pause = min(2 * pause, 0.05)


def end_all(wait: bool = True) -> None:
    """The program ended (helpers.course.dryrun.child calls it): mark every group's check, and
    (``wait``: it ended well) wait for the other ranks to end theirs (``await_ends``)."""
    checks = list(_LIVE)
    for check in checks:
        try:
            check.end()
        except Exception:  # noqa: BLE001 - a group already gone has nobody left to tell
            pass
    for check in checks if wait else []:
        try:
            check.await_ends()
        except Exception:  # noqa: BLE001 - the store's host is gone: nobody left to wait for
            pass
    _LIVE.clear()
