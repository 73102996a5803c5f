"""Inside a sandbox: the learner's namespace, and values turned into data for the grader.

``build_namespace(source, programs)`` makes each ``%%program`` module importable (from
memory: nothing is written), runs the learner's cells (``source``) as a kernel would, as
``__main__``, and publishes the result where the grader's ``LearnerRef``s look names up
(``grader.proxies.NAMESPACE``), so a payload unpickled afterwards finds the learner's
objects.

``as_data(value, who)`` checks that a value is data (tensors, numbers, strings, lists,
tuples, dicts: what the grader's ``torch.load(weights_only=True)`` accepts) and returns it
as ``torch.save`` bytes; anything else is refused here, with a message that names it.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import io
import linecache
import sys
import traceback
from collections import OrderedDict

import torch

# Where the grader's LearnerRefs resolve (``proxies.lookup`` reads ``proxies.NAMESPACE``).
# Named, not imported: the grader imports this package, and the sandbox must not import
# the grader's (import-linter's no-cycles contract); only this one module of it is used.
PROXIES = "helpers.course.grading.grader.proxies"


def proxies():
    """The grader's proxies module, which a rank's unpickled payload resolves names in."""
    return importlib.import_module(PROXIES)


__all__ = ["as_data", "build_namespace", "error_report"]

_SCALARS = (
    type(None),
    range,  # shard_range's answer in lab 0
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    torch.Size,
)


class _Programs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import NAME`` of a ``%%program NAME`` cell, from its source in memory."""

    def __init__(self, programs: dict[str, str]):
        self.programs = dict(programs)

    def find_spec(self, name, path=None, target=None):
        if name not in self.programs:
            return None
        return importlib.machinery.ModuleSpec(name, self, origin=f"programs/{name}.py")

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        filename = f"programs/{name}.py"
        source = self.programs[name]
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module.__file__ = filename
        exec(compile(source, filename, "exec"), module.__dict__)


def build_namespace(source: str, programs: dict[str, str]) -> dict:
    """The learner's namespace (see the module docstring); errors in it propagate."""
    sys.meta_path.insert(0, _Programs(programs))
    main = type(sys)("__main__")
    ns = main.__dict__
    ns["__builtins__"] = builtins
    sys.modules["__main__"] = main
    linecache.cache["<learner>"] = (len(source), None, source.splitlines(True), "<learner>")
    exec(compile(source, "<learner>", "exec"), ns)
    registry = proxies().NAMESPACE
    registry.clear()
    registry.update(ns)
    return ns


def _check(value, who: str, path: str, depth: int = 0) -> None:
    if depth > 50:
        raise TypeError(f"{who} returned data nested more than 50 deep ({path})")
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(
                f"{who} returned a {type(value).__name__} at {path}: return plain tensors "
                "(a DTensor's .full_tensor() or .to_local())"
            )
        return
    if type(value) in _SCALARS:
        return
    if type(value) in (list, tuple):
        for i, v in enumerate(value):
            _check(v, who, f"{path}[{i}]", depth + 1)
        return
    if type(value) in (dict, OrderedDict):
        for k, v in value.items():
            if type(k) not in (str, int, float, bool, tuple, type(None)):
                raise TypeError(f"{who} returned a dict keyed by {type(k).__name__} at {path}")
            _check(v, who, f"{path}[{k!r}]", depth + 1)
        return
    raise TypeError(
        f"{who} returned a {type(value).__name__} object at {path}: tests return tensors, "
        "numbers, strings, lists, tuples and dicts of them"
    )


def as_data(value, who: str) -> bytes:
    """``value`` as torch.save bytes, or TypeError when it is not data (see above)."""
    _check(value, who, "the value")
    buf = io.BytesIO()
    torch.save(_plain(value), buf)
    return buf.getvalue()


def _plain(value):
    """Parameters as plain tensors, detached: the grader's loader knows no Parameter."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if type(value) in (list, tuple):
        return type(value)(_plain(v) for v in value)
    if type(value) in (dict, OrderedDict):
        return type(value)((k, _plain(v)) for k, v in value.items())
    return value


def error_report(e: BaseException, skip: str) -> dict:
    """A failure as plain text: its type, message and traceback (frames of ``skip`` left out)."""
    te = traceback.TracebackException.from_exception(e)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if f.filename != skip] or te.stack
    )
    return {
        "type": type(e).__name__,
        "message": str(e)[:20000],
        "summary": f"{type(e).__name__}: {e}"[:2000],
        "traceback": "".join(te.format())[-100000:],
    }
