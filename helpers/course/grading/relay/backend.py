"""The relay process group, rank side: every collective and message goes to the grading process.

A rank started by the grader's sandbox has one socket to the grading process and no
other way to reach its peers. ``connect(fd, rank, world_size)`` makes that socket the
rank's ``torch.distributed`` backend, "relay"::

    connect(fd, rank=1, world_size=4)   # init_process_group("relay", ...) on the socket
    tdist.all_reduce(t)                 # the switch (relay/switch.py) sums it and answers

``RelayBackend`` implements the ``Backend`` methods torch 2.14 calls (``all_gather_single``,
``reduce_scatter_single``, ``all_to_all_single``, ...) and those of the 2.6 floor
(``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``, ...). Each operation
is one frame out (a JSON header and the raw bytes of its inputs) and, except a send, one
frame back (the bytes of this rank's outputs); a ``RelayWork`` completes when the answer
arrives, so isend/irecv/batch_isend_irecv in any order never deadlock: a send is
deposited at the switch at once, a receive completes when the matching send has arrived.
Registered with ``extended_api=True`` so that new_group and DeviceMesh subgroups get their
global ranks. What the switch refuses (a collective the test's plan does not allow) or
cannot do raises here, in the rank, with the switch's message.

Besides the operations, a rank can only ask: ``mark(name)`` (the grading process samples
its memory, helpers.course.grading.recorder.os_memory) and ``gate(name, n, dtype)`` (lab 6's
factor); ``RelayWork.wait`` tells the switch which reply it waits for, so that a reply the
switch holds back (lab 6) fails at once with why instead of hanging.
"""

from __future__ import annotations

import socket
import sys
import threading

import torch
import torch.distributed as tdist
from torch._C._distributed_c10d import Backend, Work

from helpers.course.grading.recorder import events, os_memory
from helpers.course.grading.relay.channel import Channel, RelayError
from helpers.course.grading.relay.frames import DTYPES, as_bytes
from helpers.course.grading.relay.markers import RelayMarkers

__all__ = [
    "NAME", "RelayBackend", "RelayError", "active", "channel", "connect", "flush", "gate", "mark",
]  # fmt: skip

NAME = "relay"
_REDUCE = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
_CHANNEL: list[Channel] = []  # the process's one connection to the switch
NOTICE_S = 0.05  # a wait longer than this tells the switch which reply it waits for


class RelayWork(Work):
    """Completes when the switch answers; ``wait`` raises the switch's error, if any."""

    def __init__(self, outputs: list[torch.Tensor]):
        super().__init__()
        self._outputs = outputs
        self._done = threading.Event()
        self._error: str | None = None
        self._future = torch.futures.Future()
        self.source: int = -1  # a receive's sender (global rank)
        self.ident: int | None = None  # the request's id at the switch
        self.chan: Channel | None = None

    def finish(self, error: str | None = None) -> None:
        self._error = error
        self._done.set()
        if error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(RelayError(error))

    def wait(self, timeout=None) -> bool:
        if not self._done.wait(NOTICE_S) and self.chan is not None and self.ident is not None:
            try:  # the switch may hold this reply back (lab 6): it then fails it with why
                self.chan.post({"t": "waiting", "id": self.ident})
            except RelayError:
                pass
        self._done.wait()
        if self._error is not None:
            raise RelayError(self._error)
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future


def _dtype(op: str, tensors: list[torch.Tensor]) -> str:
    kinds = {t.dtype for t in tensors}
    if len(kinds) > 1:
        raise TypeError(f"relay {op}: all tensors of one call must share a dtype, not {kinds}")
    name = str(kinds.pop()).removeprefix("torch.") if kinds else "uint8"
    if name not in DTYPES:
        raise TypeError(f"relay {op}: tensors of {name} are not carried (only {', '.join(DTYPES)})")
    for t in tensors:
        if t.device.type != "cpu":
            raise TypeError(f"relay {op}: the relay carries CPU tensors, not {t.device}")
    return name


def _reduce_op(op: str, opts) -> str:
    name = opts.reduceOp.op.name
    if name not in _REDUCE:
        raise ValueError(
            f"relay {op}: the reduce op {name} is not supported ({', '.join(_REDUCE)})"
        )
    return name


def _place(outputs: list[torch.Tensor], dtype: str, payload: bytearray | None) -> None:
    """Copy an answer's bytes into the output tensors, in order (None: read into them)."""
    if not outputs or payload is None:
        return
    flat = torch.frombuffer(payload, dtype=DTYPES[dtype]) if payload else torch.empty(0)
    start = 0
    with torch.no_grad():
        for out in outputs:
            n = out.numel()
            out.copy_(flat[start : start + n].view(out.shape))
            start += n


def _flat(lists) -> list[torch.Tensor]:
    return [t for sub in lists for t in sub]


class RelayBackend(Backend):
    """A process group whose every operation is answered by the grading process's switch."""

    def __init__(self, chan: Channel, rank: int, size: int, name: str, ranks: list[int]):
        super().__init__(rank, size)
        self.chan, self.ranks = chan, ranks
        self.g = chan.group(name, ranks)

    def getBackendName(self) -> str:
        return NAME

    # What this backend cannot do. Torch's own properties would ask the Python subclass,
    # which asks torch again: without these, reading one recurses until Python gives up.
    _no = property(lambda self: False)
    supports_splitting = supports_coalescing = supports_time_estimate = _no
    supports_shrinking = supports_reconfigure = supports_window = _no

    # -- the one path every collective takes
    def _collective(self, op: str, inputs, outputs, **extra) -> RelayWork:
        dtype = _dtype(op, [*inputs, *outputs])
        header = {"t": "coll", "g": self.g, "op": op, "dtype": dtype,
                  "s": [list(t.shape) for t in inputs], "o": [t.numel() for t in outputs],
                  **extra}  # fmt: skip
        work = RelayWork(list(outputs))

        def on_reply(head: dict, payload: bytearray) -> None:
            try:
                if "err" not in head:
                    _place(outputs, dtype, payload)
                work.finish(head.get("err"))
            except Exception as e:  # noqa: BLE001 - the rank sees it in wait()
                work.finish(f"relay {op}: the answer did not fit ({e})")

        work.chan = self.chan
        work.ident = self.chan.request(header, [as_bytes(t) for t in inputs], on_reply, outputs)
        return work

    # -- reductions
    def allreduce(self, tensors, opts):
        return self._collective("all_reduce", tensors, tensors, red=_reduce_op("all_reduce", opts))

    def allreduce_coalesced(self, tensors, opts):
        red = _reduce_op("all_reduce_coalesced", opts)
        return self._collective("all_reduce_coalesced", tensors, tensors, red=red)

    def reduce(self, tensors, opts):
        outputs = tensors if self.rank() == opts.rootRank else []
        red = _reduce_op("reduce", opts)
        return self._collective("reduce", tensors, outputs, red=red, root=opts.rootRank)

    def broadcast(self, tensors, opts):
        return self._collective("broadcast", tensors, tensors, root=opts.rootRank)

    # -- gathers
    def allgather(self, output_lists, inputs, opts):
        return self._collective("all_gather", inputs, _flat(output_lists))

    def _allgather_base(self, output, input, opts):
        return self._collective("all_gather_into_tensor", [input], [output])

    all_gather_single = _allgather_base

    def allgather_coalesced(self, output_lists, inputs, opts):
        return self._collective("all_gather_coalesced", inputs, _flat(output_lists))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        return self._collective("all_gather_into_tensor_coalesced", inputs, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_lists, inputs, opts):
        outputs = _flat(output_lists) if self.rank() == opts.rootRank else []
        return self._collective("gather", inputs, outputs, root=opts.rootRank)

    def gather_into_tensor(self, output, input, opts):
        outputs = [output] if self.rank() == opts.rootRank else []
        return self._collective("gather_into_tensor", [input], outputs, root=opts.rootRank)

    # -- scatters
    def reduce_scatter(self, outputs, input_lists, opts):
        red = _reduce_op("reduce_scatter", opts)
        return self._collective("reduce_scatter", _flat(input_lists), outputs, red=red)

    def _reduce_scatter_base(self, output, input, opts):
        red = _reduce_op("reduce_scatter_tensor", opts)
        return self._collective("reduce_scatter_tensor", [input], [output], red=red)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        red = _reduce_op("reduce_scatter_tensor_coalesced", opts)
        return self._collective("reduce_scatter_tensor_coalesced", inputs, outputs, red=red)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def scatter(self, outputs, input_lists, opts):
        inputs = _flat(input_lists) if self.rank() == opts.rootRank else []
        return self._collective("scatter", inputs, outputs, root=opts.rootRank)

    # -- all-to-all
    def alltoall_base(self, output, input, output_splits, input_splits, opts):
        n = self.size()
        rows_in, rows_out = (
            input.shape[0] if input.dim() else 1,
            output.shape[0] if output.dim() else 1,
        )
        per_in = input.numel() // max(rows_in, 1)
        per_out = output.numel() // max(rows_out, 1)
        si = [s * per_in for s in input_splits] if input_splits else [input.numel() // n] * n
        so = [s * per_out for s in output_splits] if output_splits else [output.numel() // n] * n
        return self._collective("all_to_all_single", [input], [output], si=si, so=so)

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts):
        si, so = [t.numel() for t in inputs], [t.numel() for t in outputs]
        return self._collective("all_to_all", inputs, outputs, si=si, so=so)

    def barrier(self, opts):
        return self._collective("barrier", [], [])

    # -- point to point
    def _api(self, base: str) -> str:
        name = getattr(self.chan.api, "name", None)
        return name if name in (base, "i" + base) else base

    def send(self, tensors, dst, tag):
        dtype = _dtype("send", tensors)
        header = {"t": "send", "g": self.g, "peer": dst, "tag": tag, "dtype": dtype,
                  "s": [list(t.shape) for t in tensors], "api": self._api("send")}  # fmt: skip
        self.chan.post(header, [as_bytes(t) for t in tensors])
        work = RelayWork(list(tensors))
        work.finish()
        return work

    def recv(self, tensors, src, tag):
        dtype = _dtype("recv", tensors)
        header = {"t": "recv", "g": self.g, "peer": src, "tag": tag, "dtype": dtype,
                  "s": [list(t.shape) for t in tensors], "api": self._api("recv")}  # fmt: skip
        work = RelayWork(list(tensors))

        def on_reply(head: dict, payload: bytearray) -> None:
            try:
                if "err" not in head:
                    _place(tensors, dtype, payload)
                    work.source = int(head.get("src", -1))
                work.finish(head.get("err"))
            except Exception as e:  # noqa: BLE001
                work.finish(f"relay recv: the message did not fit ({e})")

        work.chan = self.chan
        work.ident = self.chan.request(header, [], on_reply, list(tensors))
        return work

    def recvAnysource(self, tensors, tag):  # noqa: N802 - torch's name
        return self.recv(tensors, -1, tag)

    recv_anysource = recvAnysource


def _create(opts, _backend_options) -> RelayBackend:
    chan = channel()
    if chan is None:
        raise RelayError("the relay backend needs helpers.course.grading.relay.backend.connect()")
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    return RelayBackend(chan, opts.group_rank, opts.group_size, str(opts.group_id), ranks)


def channel() -> Channel | None:
    """This process's connection to the switch, once ``connect`` made it."""
    return _CHANNEL[0] if _CHANNEL else None


def active() -> bool:
    """Is this rank's default process group the relay?"""
    return bool(_CHANNEL) and tdist.is_initialized() and tdist.get_backend() == NAME


def _create_strict(opts, backend_options):
    """The relay under the stand-in GPU's rule: device tensors only, as NCCL (helpers.standin)."""
    from torch._C._distributed_c10d import Backend

    from helpers.standin.groups import standin_backend_class

    class StandinOnRelay(standin_backend_class()):
        def __init__(self, inner: RelayBackend):
            Backend.__init__(self, inner.rank(), inner.size())
            self.gloo = inner  # what StandinBackend forwards to, host tensors unwrapped

        def getBackendName(self):
            return NAME

    return StandinOnRelay(_create(opts, backend_options))


def standin_device_type() -> str:
    from helpers.standin import DEVICE_TYPE

    return DEVICE_TYPE


def connect(fd: int, rank: int, world_size: int, strict: bool = False) -> None:
    """Make the inherited socket ``fd`` this rank's process group ("relay"). ``strict``: the
    rank's device is the stand-in GPU (helpers.standin), and the group refuses host tensors
    as NCCL does (lab 7 grades a ring that must keep its work on the GPU)."""
    if _CHANNEL:
        raise RelayError("this process is already connected to the relay")
    os_memory.prepare_allocator()  # tensors resident exactly while they live (memory tests)
    os_memory.measurable()  # a grader that is not root can reset this rank's peak memory
    if NAME not in tdist.Backend.backend_list:
        create = _create_strict if strict else _create
        devices = ["cpu", standin_device_type()] if strict else ["cpu"]
        tdist.Backend.register_backend(NAME, create, extended_api=True, devices=devices)
    _CHANNEL.append(Channel(socket.socket(fileno=fd), rank, world_size))
    events.route(_markers, sys.modules[__name__])  # markers, marks and gates over the relay
    tdist.init_process_group(NAME, store=tdist.HashStore(), rank=rank, world_size=world_size)


def _markers(label, allow, api) -> RelayMarkers | None:
    """record_traffic's markers on the relay, while it is this rank's process group."""
    return RelayMarkers(_CHANNEL[0], label, allow, api) if active() else None


def flush() -> None:
    """Return once the switch has handled everything this rank sent before (a round trip)."""
    chan = channel()
    if chan is not None and not chan.closed:
        chan.call({"t": "sync"})


def mark(name: str) -> None:
    """Have the grading process sample this rank's memory now (it answers once it has)."""
    os_memory.trim()
    _CHANNEL[0].call({"t": "mark", "name": str(name)[:200]})


def gate(name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Lab 6: the factor the grading process gives this rank's gate ``name`` now."""
    kind = str(dtype).removeprefix("torch.")
    head, payload = _CHANNEL[0].call({"t": "gate", "name": str(name)[:200], "n": int(numel),
                                      "dtype": kind})  # fmt: skip
    return torch.frombuffer(payload, dtype=dtype).clone() if payload else torch.ones(0, dtype=dtype)
