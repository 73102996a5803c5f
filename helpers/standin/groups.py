"""The two process groups of the stand-in GPU.

"standin" carries device tensors over gloo and refuses host tensors as NCCL does;
"dryrun" lets one rank play a whole job, answering each collective locally.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as tdist

from helpers.standin.tensor import is_device_tensor

__all__ = ["standin_backend_class", "dryrun_backend_class", "POINT_TO_POINT"]

# Point-to-point messages a dry-run rank sent or received: ranks that exchange them (pipeline
# stages) may differ from each other; ranks that only meet in collectives are alike.
POINT_TO_POINT = [0]


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
    "scatter", "send", "recv", "recv_anysource", "barrier", "monitored_barrier",
)  # fmt: skip


def standin_backend_class():
    from torch._C._distributed_c10d import Backend, ProcessGroupGloo

    class StandinBackend(Backend):
        """NCCL's contract on CPU: device tensors only, carried by gloo underneath."""

        def __init__(self, store, rank: int, size: int, timeout: timedelta):
            super().__init__(rank, size)
            self.gloo = ProcessGroupGloo(store, rank, size, timeout)

        def getBackendName(self):
            return "standin"

        # batch_isend_irecv asks; left to the C++ base, the question recurses into Python
        supports_coalescing = False

    def forward(name):
        def method(self, *args):
            return getattr(self.gloo, name)(*[_host(a) for a in args])

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

        def wait(self, timeout=None):
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

    return DryRunBackend
