"""Grader side: what the sandbox sent back, read as data, and turned into values or errors.

Values are ``torch.save`` bytes read with ``torch.load(weights_only=True)`` under
``torch.serialization.safe_globals`` naming only the recorder's result classes: nothing a
sandbox sent is ever unpickled. An error comes back as text (type, message, traceback);
``RankFailure`` tells the test which rank failed, as helpers.launch.spawn does. A failure
whose type is a Python built-in (AssertionError, ValueError...) is rebuilt from its name
and message as ``.original``, so a test can still catch it by type.
"""

from __future__ import annotations

import builtins
import io
import re
import sys
import warnings
from dataclasses import dataclass, field

import torch

from helpers.course.grading.recorder.events import Recording
from helpers.course.grading.recorder.traffic import Call, Message
from helpers.launch.results import PEER_ERROR, RankFailure

__all__ = [
    "LearnerError",
    "Output",
    "SAFE_CLASSES",
    "SlotOutcome",
    "learner_error",
    "load_value",
    "rank_failure",
    "values_of",
]

SAFE_CLASSES = (Recording, Message, Call, range)
# A rank whose error says only that a peer went away is not the story (the relay's words).
PEER = re.compile(f"{PEER_ERROR.pattern}|ended before it (joined|called|sent)|closed its relay")
MAX_OUTPUT = 4 << 20  # bytes of printed output per rank and stream before it is cut


def load_value(blob: bytes, who: str, safe=SAFE_CLASSES, rank: int | None = None):
    """The value a rank (or a direct call) returned (see the module docstring)."""
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(list(safe)):
            warnings.simplefilter("ignore")  # "pickle protocol 4": a forged value says so
            return torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - whatever it was, it is not data
        summary = f"{who} returned something that is not data: {str(e)[:500]}"
        raise RankFailure(rank, summary) from None


@dataclass
class Output:
    """Printed lines of one rank (or the learner process), shown as they complete."""

    rank: int | None  # None: the learner process, whose lines are shown as printed
    partial: dict[str, str] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)

    def feed(self, stream: str, data: bytes) -> None:
        used = self.size.get(stream, 0)
        self.size[stream] = used + len(data)
        if used >= MAX_OUTPUT:
            return
        if used + len(data) >= MAX_OUTPUT:
            data = data[: MAX_OUTPUT - used] + b"\n... (output cut: over 4 MB)\n"
        text = self.partial.pop(stream, "") + data.decode("utf-8", "replace")
        *lines, rest = text.split("\n")
        if rest:
            self.partial[stream] = rest
        for line in lines:
            self._emit(stream, line)

    def flush(self) -> None:
        for stream in list(self.partial):
            self._emit(stream, self.partial.pop(stream))

    def _emit(self, stream: str, line: str) -> None:
        if self.rank is not None:
            tag = f"[rank{self.rank}]: "
            if line.startswith(tag):  # torch already tags its error lines with the rank
                line = line[len(tag) :]
            line = f"[rank{self.rank}] {line}"
        print(line, file=sys.stdout if stream == "o" else sys.stderr, flush=True)


@dataclass
class SlotOutcome:
    """What one slot reported for one job or call."""

    rank: int
    result: tuple[dict, bytes] | None = None
    done: bool = False
    code: int | None = None
    lost: str = ""  # the slot died or sent garbage: why
    killed: bool = False  # the grader asked the slot to stop the job
    late: bool = False  # the result came after that (a consequence, not a cause)
    order: int = 0  # when the result came, among the job's ranks

    @property
    def failed(self) -> bool:
        return bool(self.lost) or (self.result is not None and not self.result[0].get("ok"))

    @property
    def own_failure(self) -> bool:
        """Failed by itself, not only because a peer vanished."""
        if self.lost:
            return True
        return self.failed and not PEER.search(str(self.result[0].get("traceback", "")))


# Built-in exceptions that change control flow where they are raised rather than report a
# failure: a StopIteration out of a learner call inside map() or next() would end a test's
# loop early, as if every case had passed. They come back as LearnerError.
_FLOW = (StopIteration, StopAsyncIteration, GeneratorExit)


def _original(header: dict):
    kind = getattr(builtins, str(header.get("type", "")), None)
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, _FLOW):
        try:
            return kind(header.get("message", ""))
        except Exception:  # noqa: BLE001 - an exception type with another signature
            return None
    return None


def rank_failure(outcomes: list[SlotOutcome], timed_out: bool, timeout: float):
    """The RankFailure that tells what went wrong, or None when every rank returned."""
    n = len(outcomes)
    errors = sorted(
        (o for o in outcomes if o.failed and not o.late and not o.lost), key=lambda o: o.order
    )
    own = [o for o in errors if o.own_failure]
    if own or errors:
        census = {"failed": sorted(o.rank for o in own), "world_size": n}
        o = (own or errors)[0]
        h = o.result[0]
        return RankFailure(
            o.rank,
            str(h.get("summary", "failed")),
            str(h.get("traceback", "")),
            original=_original(h),
            **census,
        )
    lost = [o for o in outcomes if o.lost]
    if lost and not timed_out:
        return RankFailure(lost[0].rank, lost[0].lost, "", world_size=n)
    missing = [o.rank for o in outcomes if o.result is None or o.late]
    if missing:
        return RankFailure(
            missing[0] if len(missing) == 1 else None,
            f"timed out after {timeout:g} s; ranks {missing} had not returned (a collective "
            "that not every rank calls waits until the timeout: check that all ranks make "
            "the same collective calls in the same order)",
            "",
            world_size=n,
        )
    return None


class LearnerError(Exception):
    """The learner's code raised an exception whose type is not a Python built-in."""

    def __init__(self, summary: str, remote_traceback: str = ""):
        self.summary, self.remote_traceback = summary, remote_traceback
        super().__init__(summary + (f"\n\n{remote_traceback.rstrip()}" if remote_traceback else ""))


def learner_error(header: dict) -> Exception:
    """The exception a direct call raised, rebuilt from its type's name and message."""
    exc = _original(header)
    tb = str(header.get("traceback", ""))
    if exc is None:
        return LearnerError(str(header.get("summary", "failed")), tb)
    if tb:
        exc.add_note(f"in the learner process:\n{tb.rstrip()}")
    return exc


def values_of(outcomes: list[SlotOutcome], safe=SAFE_CLASSES) -> list:
    return [load_value(o.result[1], f"rank {o.rank}", safe, o.rank) for o in outcomes]
