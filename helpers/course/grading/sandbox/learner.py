"""Inside a sandbox: the learner's namespace, and values turned into data for the grader.

``build_namespace(source, programs)`` makes each ``%%program`` module importable (from
memory: nothing is written), runs the learner's cells (``source``) as a kernel would, as
``__main__``, and publishes the result where the grader's ``LearnerRef``s look names up
(``grader.proxies.NAMESPACE``), so a payload unpickled afterwards finds the learner's
objects.

``as_data(value, who)`` turns a value into data (tensors, numbers, strings, lists, tuples,
dicts: what the grader's ``torch.load(weights_only=True)`` accepts; a NamedTuple, a numpy
number or array, a dict or list subclass become the plain kind they are) and returns it
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
    """``import NAME`` of a ``%%program NAME`` cell, from its source in memory. Last on the
    import path, and only plain names: a program never stands in for an installed module
    (a ``%%program helpers.course.grading.checks.ddp_watch`` would replace the tests' own
    code in the ranks)."""

    def __init__(self, programs: dict[str, str]):
        self.programs = {k: v for k, v in programs.items() if k.isidentifier()}

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
    sys.meta_path.append(_Programs(programs))
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


def _number(value):
    """A number of another type as Python's own (numpy's float64, an IntEnum), or None."""
    import numbers

    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item) and getattr(value, "ndim", 1) == 0:
        value = item()  # a numpy scalar: its Python number (or bool)
    for kind in (bool, int, float, complex):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def _plain(value, who: str, path: str, depth: int = 0):
    """``value`` as data the grader's loader reads, converted where the learner's type is a
    kind of it: a NamedTuple is a tuple, a numpy scalar a number, a numpy array a tensor, a
    dict or list subclass a dict or list; a Parameter a detached tensor. TypeError, naming
    where, for anything else."""
    if depth > 50:
        raise TypeError(f"{who} returned data nested more than 50 deep ({path})")
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(
                f"{who} returned a {type(value).__name__} at {path}: return plain tensors "
                "(a DTensor's .full_tensor() or .to_local())"
            )
        return value.detach()
    if type(value) in _SCALARS:
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray":
        try:
            return torch.from_numpy(value.copy())
        except TypeError:
            raise TypeError(f"{who} returned a numpy array of {value.dtype} at {path}") from None
    number = _number(value)
    if number is not None:
        return number
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list | tuple):
        items = [_plain(v, who, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        out = OrderedDict() if isinstance(value, OrderedDict) else {}
        for k, v in value.items():
            key = _number(k) if _number(k) is not None else k
            key = str(key) if isinstance(key, str) else key
            if type(key) not in (str, int, float, bool, tuple, type(None)):
                raise TypeError(f"{who} returned a dict keyed by {type(k).__name__} at {path}")
            out[key] = _plain(v, who, f"{path}[{k!r}]", depth + 1)
        return out
    raise TypeError(
        f"{who} returned a {type(value).__name__} object at {path}: tests return tensors, "
        "numbers, strings, lists, tuples and dicts of them"
    )


def as_data(value, who: str) -> bytes:
    """``value`` as torch.save bytes, or TypeError when it is not data (see ``_plain``)."""
    buf = io.BytesIO()
    torch.save(_plain(value, who, "the value"), buf)
    return buf.getvalue()


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
