"""The two process groups of the stand-in GPU.

"standin" carries device tensors over gloo and keeps NCCL's contract: it refuses host tensors
and non-contiguous ones in a collective, and a receive from any source, as NCCL does, and it
checks the order of the ranks' operations against NCCL's (``helpers.standin.ordering``): a
pair that would hang on GPUs, or a collective the ranks disagree on, fails naming each rank's
line. "dryrun" lets one rank play a whole job, answering each collective locally, and notes
its operations in order for the dry run to check (``OPS``).
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as tdist

from helpers.standin.fingerprints import signature
from helpers.standin.ordering import GroupCheck, OpLog
from helpers.standin.tensor import is_device_tensor
from helpers.standin.work import CheckedWork

__all__ = ["standin_backend_class", "dryrun_backend_class", "POINT_TO_POINT", "OPS"]

# Point-to-point messages a dry-run rank sent or received: ranks that exchange them (pipeline
# stages) may differ from each other; ranks that only meet in collectives are alike.
POINT_TO_POINT = [0]
# The operations a dry-run rank posted on its default group, in order (helpers.course.dryrun
# checks them against NCCL's rules for the other ranks the job would have).
OPS: list[OpLog] = []


_C10D = tdist.distributed_c10d.__file__


def _host(x):
    """The CPU tensor behind a device tensor, for gloo; a host tensor is refused."""
    if isinstance(x, torch.Tensor):
        if not is_device_tensor(x):
            raise RuntimeError(f"No backend type associated with device type {x.device.type}")
        return x.raw
    if isinstance(x, list | tuple):
        return type(x)(_host(i) for i in x)
    return x


_COLLECTIVES = (
    "allreduce", "allreduce_coalesced", "broadcast", "allgather", "_allgather_base",
    "allgather_coalesced", "all_gather_single", "all_gather_single_coalesced", "reduce_scatter",
    "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_single_coalesced",
    "all_to_all_single", "alltoall", "alltoall_base", "reduce", "gather", "gather_single",
    "scatter", "barrier",
)  # fmt: skip
_API = {"send": ("send", "isend"), "recv": ("recv", "irecv")}  # what the program called


def _flat(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list | tuple):
        return [t for i in x for t in _flat(i)]
    return []


def _contiguous(name: str, args) -> None:
    """NCCL refuses a collective on a non-contiguous tensor (gloo reads its storage in order)."""
    for t in _flat(args):
        layouts = {4: torch.channels_last, 5: torch.channels_last_3d}
        if not (t.is_contiguous() or (t.dim() in layouts and t.is_contiguous(
                memory_format=layouts[t.dim()]))):  # fmt: skip
            raise ValueError(
                f"Tensors must be contiguous ({name} on a {list(t.shape)} view with strides "
                f"{list(t.stride())}, as NCCL says; gloo would read its storage in order and "
                "mix up the elements): pass t.contiguous() and copy the result back"
            )


def _api(kind: str) -> str:
    """isend or send (irecv or recv): the torch.distributed function the program called."""
    frame, called = sys._getframe(2), kind
    while frame is not None:  # the outermost: tdist.send calls isend in some releases
        if frame.f_code.co_name in _API[kind] and frame.f_code.co_filename == _C10D:
            called = frame.f_code.co_name
        frame = frame.f_back
    return called


def standin_backend_class():
    from torch._C._distributed_c10d import Backend, ProcessGroupGloo

    class StandinBackend(Backend):
        """NCCL's contract on CPU: device tensors only, carried by gloo underneath, in NCCL's
        order (``check``: None on a group that has no store shared by its ranks)."""

        check: GroupCheck | None = None

        def __init__(self, store, rank: int, size: int, timeout: timedelta):
            super().__init__(rank, size)
            self.gloo = ProcessGroupGloo(store, rank, size, timeout)
            self.check = GroupCheck(store, rank, size, timeout.total_seconds())

        def getBackendName(self):
            return "standin"

        # batch_isend_irecv asks; left to the C++ base, the question recurses into Python
        supports_coalescing = False

        def send(self, tensors, dst, tag):
            index = self._post("send", dst, tensors)
            return CheckedWork(self.gloo.send(_host(tensors), dst, tag), self.check, index)

        def recv(self, tensors, src, tag):
            index = self._post("recv", src, tensors)
            return CheckedWork(self.gloo.recv(_host(tensors), src, tag), self.check, index)

        def recv_anysource(self, tensors, tag):
            raise RuntimeError(
                "a receive from any source (tdist.recv without src): NCCL has none "
                "(ProcessGroupNCCL does not support recvAnysource); name the sender, "
                "tdist.recv(t, src=...)"
            )

        def _post(self, kind, peer, tensors):
            _host(tensors)  # a host tensor fails before anything is noted
            if self.check is None:
                return -1
            return self.check.post(kind, peer, tensors, _api(kind))

    def forward(name):
        def method(self, *args):
            _host(args)
            _contiguous(name, args)
            index = -1
            if self.check is not None:
                friendly, sig = signature(name, args)
                index = self.check.post("coll", -1, _flat(args[:1]), friendly, sig)
            work = getattr(self.gloo, name)(*[_host(a) for a in args])
            return CheckedWork(work, self.check, index)

        method.__name__ = name
        return method

    for name in _COLLECTIVES:
        if hasattr(ProcessGroupGloo, name):
            setattr(StandinBackend, name, forward(name))
    return StandinBackend


def _fill(out: torch.Tensor, value) -> None:
    """out <- value(), for real tensors; a fake tensor has no values to write."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(out, FakeTensor):
        out.copy_(value())


def dryrun_backend_class():
    from torch._C._distributed_c10d import Backend
    from torch.futures import Future

    class Done(tdist._Work):
        """A collective already complete; its future holds the tensors (DDP reads them)."""

        def __init__(self, result):
            super().__init__()
            self.future = Future()
            self.future.set_result(result)
            self.log, self.index = None, -1  # the operation, as the rank's OpLog noted it

        def wait(self, timeout=None):
            if self.log is not None:
                self.log.waited(self.index)
            return True

        def is_completed(self):
            return True

        def get_future(self):
            return self.future

    def done(result=None):
        return Done(result)

    class DryRunBackend(Backend):
        """One rank alone plays a whole job: each collective is answered locally, as if
        every other rank had sent what this one sent. Nothing travels."""

        def __init__(self, rank: int, size: int):
            super().__init__(rank, size)
            self.n = size
            self.log = OpLog(rank, size)
            OPS.append(self.log)

        def getBackendName(self):
            return "dryrun"

        supports_coalescing = False  # as StandinBackend's: batch_isend_irecv sends one by one

        def allreduce(self, tensors, opts):
            return done(tensors)

        def broadcast(self, tensors, opts):
            return done(tensors)

        def allgather(self, outputs, inputs, opts):
            for outs, x in zip(outputs, inputs, strict=True):
                for out in outs:
                    _fill(out, lambda x=x: x)
            return done(outputs)

        def _allgather_base(self, out, x, opts):
            _fill(out, lambda: x.reshape(1, -1).expand(self.n, -1).reshape(out.shape))
            return done([out])

        def all_gather_single(self, out, x, opts):
            return self._allgather_base(out, x, opts)

        def _reduce_scatter_base(self, out, x, opts):
            _fill(out, lambda: x.reshape(self.n, -1)[self.rank()].reshape(out.shape))
            return done([out])

        def reduce_scatter_single(self, out, x, opts):
            return self._reduce_scatter_base(out, x, opts)

        def reduce_scatter(self, outputs, inputs, opts):
            for out, parts in zip(outputs, inputs, strict=True):
                _fill(out, lambda parts=parts: parts[self.rank()])
            return done(outputs)

        def alltoall_base(self, out, x, out_splits, in_splits, opts):
            _fill(out, lambda: x.reshape(out.shape))
            return done([out])

        def all_to_all_single(self, out, x, out_splits, in_splits, opts):
            return self.alltoall_base(out, x, out_splits, in_splits, opts)

        def alltoall(self, outputs, inputs, opts):
            for out, x in zip(outputs, inputs, strict=True):
                _fill(out, lambda x=x: x)
            return done(outputs)

        def send(self, tensors, dst, tag):
            POINT_TO_POINT[0] += 1
            return done(tensors)

        def recv(self, tensors, src, tag):
            POINT_TO_POINT[0] += 1
            return done(tensors)

        def recv_anysource(self, tensors, tag):
            POINT_TO_POINT[0] += 1
            return done(tensors)

        def barrier(self, opts):
            return done()

        def reduce(self, tensors, opts):
            return done(tensors)

        def gather(self, outputs, inputs, opts):
            for outs, x in zip(outputs, inputs, strict=False):
                for out in outs:
                    _fill(out, lambda x=x: x)
            return done(outputs)

        def scatter(self, outputs, inputs, opts):
            for out, parts in zip(outputs, inputs, strict=False):
                if parts:
                    _fill(out, lambda parts=parts: parts[self.rank()])
            return done(outputs)

    for name in [*_COLLECTIVES, "send", "recv"]:
        if hasattr(DryRunBackend, name):
            setattr(DryRunBackend, name, _noted(getattr(DryRunBackend, name)))
    return DryRunBackend


def _noted(method):
    """A dry-run backend method that notes its operation in the rank's OpLog first."""
    name = method.__name__

    def noted(self, *args):
        if name in ("send", "recv"):
            index = self.log.post(name, args[1], _flat(args[0]), _api(name))
        else:
            friendly, sig = signature(name, args)
            index = self.log.post("coll", -1, _flat(args[:1]), friendly, sig)
        work = method(self, *args)
        work.log, work.index = self.log, index
        return work

    noted.__name__ = name
    return noted
