"""Learner names in the grader's namespace: references, never the learner's objects.

The grader runs the lab's setup and test cells in its own process, where no learner
code runs. A name the learner defines (``ShardedOptimizer``, ``shard_range``) is bound
there to a ``LearnerRef``:

* called in the grader (``shard_range(146, 1, 4)``), it asks the sandboxed learner
  process to make the call and gets the value back as data;
* sent to ranks inside a spawn payload (``spawn(train, 2, args=(cases,))`` where
  ``train`` uses ``ShardedOptimizer``), it travels as its name and becomes, in the
  rank, the learner's own object (``lookup``), looked up in the namespace the rank
  built from the learner's cells.

An attribute of a reference is a reference to the dotted name
(``CopyToTP.apply``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["LearnerRef", "NAMESPACE", "lookup"]

# In a sandboxed rank or learner process: the namespace built from the learner's cells.
# Set by the sandbox's rank runner before it unpickles a payload; empty in the grader.
NAMESPACE: dict[str, Any] = {}


def lookup(dotted: str) -> Any:
    """The learner's object named ``dotted`` in this (sandboxed) process."""
    head, *rest = dotted.split(".")
    if head not in NAMESPACE:
        raise NameError(
            f"{head!r} is not defined: the lab's tests use it, so define it in your "
            "solution cell with that exact name"
        )
    obj = NAMESPACE[head]
    for attr in rest:
        obj = getattr(obj, attr)
    return obj


class LearnerRef:
    """A learner's name, as the grader sees it (see the module docstring)."""

    __slots__ = ("_name", "_call")

    def __init__(self, name: str, call: Callable[..., Any] | None = None):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_call", call)

    def __call__(self, *args, **kwargs):
        if self._call is None:
            raise RuntimeError(f"{self._name} can only run inside the lab's ranks here")
        return self._call(self._name, *args, **kwargs)

    def __getattr__(self, attr: str) -> LearnerRef:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return LearnerRef(f"{self._name}.{attr}", self._call)

    def __setattr__(self, attr, value):
        raise AttributeError(f"the grader does not change the learner's {self._name}")

    def __reduce__(self):
        return (lookup, (self._name,))

    def __repr__(self) -> str:
        return f"<learner's {self._name}>"

    @property
    def __name__(self) -> str:  # tests name classes in messages: AdamW, ShardedOptimizer
        return self._name.rsplit(".", 1)[-1]
