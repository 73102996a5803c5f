"""A stand-in group's Work: gloo's, waited for only when NCCL's model says it completes."""

from __future__ import annotations

import torch.distributed as tdist

from helpers.standin.ordering import GroupCheck

__all__ = ["CheckedWork"]


class CheckedWork(tdist._Work):
    """gloo's Work, waited for only when NCCL's model says the operation completes."""

    def __init__(self, inner, check: GroupCheck | None, index: int, then=None):
        super().__init__()
        self.inner, self.check, self.index, self.then = inner, check, index, then

    def wait(self, timeout=None) -> bool:
        gone = self.check.wait(self.index) if self.check is not None else None
        try:
            if timeout is None:
                self.inner.wait()
            else:
                self.inner.wait(timeout)
        except RuntimeError as e:
            if gone is None:
                raise
            raise gone from e
        if self.then is not None:
            self.then()
            self.then = None
        return True

    def get_future(self):
        return self.inner.get_future()

    def is_completed(self) -> bool:
        return self.inner.is_completed()

    def is_success(self) -> bool:
        return self.inner.is_success()

    def exception(self):
        return self.inner.exception()

    def result(self):
        return self.inner.result()
