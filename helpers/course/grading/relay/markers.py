"""A rank's recording markers on the relay: where ``record_traffic`` starts and ends, and its name.

Under the relay the switch logs the rank's collectives and messages itself and applies the
test's plan (what may run, what is kept, what changes on its way, what memory is measured:
helpers.course.grading.recorder.plan), which no rank sees. A marker says only where a
recording starts (its label, and the collectives the rank's own recorder allows, which can
narrow the plan, never widen it) and where it ends. Opening and closing wait for the
switch's answer, so a recording is complete in the grading process (and its memory
sampled) when ``record_traffic`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from helpers.course.grading.recorder import os_memory
from helpers.course.grading.relay.channel import Channel

__all__ = ["RelayMarkers"]


class RelayMarkers:
    """The same interface as recorder.events.EventSender (send, close), over the relay."""

    def __init__(self, chan: Channel, label: str, allow: Iterable[str] | None,
                 api: threading.local):  # fmt: skip
        self.chan, self._saved_api, self.label = chan, chan.api, label
        allowed = None if allow is None else sorted(allow)
        os_memory.trim()  # the switch may sample this rank's memory as the recording opens
        chan.call({"t": "open", "label": label, "allow": allowed})
        chan.api = api  # the backend reads isend/irecv from record_traffic's named_p2p

    def send(self, event: dict, content: torch.Tensor | None = None) -> None:
        """Nothing a rank says about itself is logged: the switch sees its operations."""

    def close(self) -> None:
        self.chan.api = self._saved_api
        os_memory.trim()
        self.chan.call({"t": "close"})
