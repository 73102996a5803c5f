"""What the traffic recorder knows about torch.distributed's operators (helpers.course.grading.recorder.traffic).

Every torch.distributed operation ends up as one operator of the ``c10d`` namespaces in
PyTorch's dispatcher. These tables name them the way a learner knows them, and two
context managers prepare a recording: ``named_p2p`` tells isend from send (the
dispatcher sees only send), and ``refuse_workbook_collectives`` switches off the
workbook's own ready-made all-reduces (notebook 02), however they were imported.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch.distributed as tdist

__all__ = ["C10D_NAMESPACES", "FRIENDLY", "P2P", "named_p2p", "refuse_workbook_collectives"]

# Dispatcher namespaces of distributed operators, and the point-to-point ones in them.
C10D_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
P2P = {"send": "send", "recv_": "recv", "recv_any_source_": "recv"}
# Operator name -> the torch.distributed function a learner knows it by.
FRIENDLY = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce_coalesced",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_coalesced_": "all_gather_coalesced",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single",
    "gather_": "gather",
    "gather_into_tensor_": "gather_into_tensor",
    "scatter_": "scatter",
    "barrier": "barrier",
    "monitored_barrier_": "monitored_barrier",
}
# Python entry points whose name tells isend from send (the dispatcher sees only send).
_P2P_FUNCTIONS = ("send", "recv", "isend", "irecv")
# The workbook's ready-made all-reduces (notebook 02): refused while recording.
_WORKBOOK_COLLECTIVES = ("ring_all_reduce", "ps_all_reduce", "builtin_all_reduce")


@contextlib.contextmanager
def named_p2p(api: threading.local) -> Iterator[None]:
    """Wrap torch.distributed's send/recv/isend/irecv so the log says which one was called."""
    modules = (tdist, tdist.distributed_c10d)
    saved = [(m, n, getattr(m, n)) for m in modules for n in _P2P_FUNCTIONS if hasattr(m, n)]
    wrappers: dict = {}  # one wrapper per function, the same in both modules: P2POp and
    # batch_isend_irecv test ``op is isend`` against distributed_c10d's own name

    def named(name, original):
        def call(*args, **kwargs):
            outer = getattr(api, "name", None)
            api.name = outer or name  # the learner's call, not torch's inner ones
            try:
                return original(*args, **kwargs)
            finally:
                api.name = outer

        call.__wrapped__ = original
        return call

    try:
        for module, name, original in saved:
            if (name, id(original)) not in wrappers:
                wrappers[name, id(original)] = named(name, original)
            setattr(module, name, wrappers[name, id(original)])
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


_RAISING: dict[str, object] = {}  # name -> the code object that replaces it (made once)


def _raising_code(name: str, exercise: str):
    key = f"{exercise}\0{name}"
    if key not in _RAISING:
        message = (
            f"{exercise} must be your own code: helpers.parallel.collectives.collectives.{name} "
            "(notebook 02's ready-made version) is switched off while it is tested."
        )
        # A code object of its own (no closure, builtins only), so it can replace the
        # original's: every reference to the function object now raises.
        scope: dict = {}
        exec(f"def {name}(*args, **kwargs):\n    raise RuntimeError({message!r})\n", scope)
        _RAISING[key] = scope[name].__code__
    return _RAISING[key]


@contextlib.contextmanager
def refuse_workbook_collectives(exercise: str) -> Iterator[None]:
    """Make helpers.parallel.collectives.collectives' all-reduces raise, however they were imported."""
    try:
        from helpers.parallel.collectives import collectives
    except ImportError:  # absent from a lab's sandbox that refuses it: nothing to switch off
        collectives = None
    if collectives is None:
        yield
        return

    saved = []
    for name in _WORKBOOK_COLLECTIVES:
        fn = getattr(collectives, name)
        saved.append((fn, fn.__code__, fn.__defaults__, fn.__kwdefaults__))
        fn.__code__ = _raising_code(name, exercise)
    try:
        yield
    finally:
        for fn, code, defaults, kwdefaults in saved:
            fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
