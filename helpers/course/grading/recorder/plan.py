"""What the grading process decides about a job's traffic: the plan the ranks are held to.

A test states it when it opens its ``EventLog`` (helpers.course.grading.recorder.events)::

    with EventLog(allow=["all_reduce"], content=True, tamper=[Tamper(1, "all_reduce", f, case=2)]):
        spawn(...)

``allow``: the collectives any rank may run anywhere in the job (None: every one; a
barrier always may);
``content``: record what every message and collective carried; ``tamper``: the messages
to change on their way (helpers.course.grading.recorder.tamper); ``memory``: measure each
rank's memory from the operating system at the edges of its recordings and at its marks
(helpers.course.grading.recorder.os_memory); ``gates``: lab 6's gates in backward and the
all-reduce replies held there (helpers.course.grading.checks.ddp_watch).

Under the grader's relay the switch applies the plan itself and no rank ever sees it
(helpers.course.grading.relay.switch). Without the relay (a learner's own kernel on gloo,
the instructors' runs of the solutions) the ranks' own recorders apply it: the EventLog
writes it next to its socket, where they read it (``planned``). ``Counter`` is the one
bookkeeping of both: which of a rank's operations a tamper changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from helpers.course.grading.recorder.tamper import Tamper

__all__ = ["PLAN_FILE", "Counter", "Plan", "planned", "write"]

PLAN_FILE = "plan.pkl"


@dataclass(frozen=True)
class Plan:
    """A job's plan (see the module docstring)."""

    allow: frozenset[str] | None = None
    content: bool = False
    tamper: tuple[Tamper, ...] = ()
    memory: bool = False
    gates: bool = False

    @classmethod
    def make(cls, allow=None, content=False, tamper=(), memory=False, gates=False) -> Plan:
        if isinstance(tamper, Tamper):
            tamper = (tamper,)
        tampers = tuple(tamper or ())
        bad = [t for t in tampers if not isinstance(t, Tamper)]
        if bad:
            raise TypeError(f"tamper= takes Tamper objects, not {type(bad[0]).__name__}")
        allowed = None if allow is None else frozenset(_names(allow))
        return cls(allowed, bool(content), tampers, bool(memory), bool(gates))

    def refuses(self, op: str) -> bool:
        """Does the plan refuse ``op``? A barrier carries no data: the ranks' own clean-up
        calls one (helpers.dist.cleanup), and the plan never refuses it."""
        return self.allow is not None and op not in self.allow and op != "barrier"


def _names(allow) -> list[str]:
    if isinstance(allow, str):
        return [allow]
    names = list(allow)
    if not all(isinstance(a, str) for a in names):
        raise TypeError("allow= lists collective names, such as 'all_reduce'")
    return names


@dataclass
class Counter:
    """Which operations of one rank the plan's tampers change, counted per tamper."""

    rank: int
    tampers: tuple[Tamper, ...]
    seen: dict[tuple[int, int | None], int] = field(default_factory=dict)

    def due(self, op: str, case: int | None) -> list[tuple[Tamper, int]]:
        """The tampers that change this operation (``case``: the index of the rank's
        recording it runs in, None outside every recording), with the operation's index."""
        out = []
        for i, t in enumerate(self.tampers):
            if not t.matches(self.rank, op) or (t.case is not None and t.case != case):
                continue
            key = (i, t.case)
            index = self.seen.get(key, 0)
            self.seen[key] = index + 1
            if t.nth is None or t.nth == index:
                out.append((t, index))
        return out


def write(plan: Plan, folder: str) -> None:
    """Leave the plan where the ranks of a kernel (no relay) read it: next to the log's socket."""
    import cloudpickle

    path = os.path.join(folder, PLAN_FILE)
    with open(path + ".tmp", "wb") as f:
        cloudpickle.dump(plan, f)
    os.replace(path + ".tmp", path)


_READ: dict[str, Plan] = {}


def planned(address: str | None) -> Plan:
    """The plan of the EventLog at ``address`` (a kernel's rank), or an empty one."""
    if not address:
        return Plan()
    if address not in _READ:
        import pickle

        path = os.path.join(os.path.dirname(address), PLAN_FILE)
        try:
            with open(path, "rb") as f:
                _READ[address] = pickle.load(f)  # written by this user's own kernel
        except OSError:
            _READ[address] = Plan()
    return _READ[address]


def allowed_by(plan: Plan, own: Iterable[str] | None) -> frozenset[str] | None:
    """What a recording may run: the plan's collectives, narrowed by the recording's own."""
    mine = None if own is None else frozenset(own)
    if plan.allow is None:
        return mine
    return plan.allow if mine is None else plan.allow & mine
