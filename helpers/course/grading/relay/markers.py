"""A rank's recording markers on the relay: what ``record_traffic`` tells the switch.

Under the relay the switch logs the rank's collectives and messages itself; the rank's
recorder only says where a recording starts and ends (label, content, allow, the key of
its Tamper) and reports what only the rank can see: its allocations and the refusals its
own recorder made first. Opening and closing wait for the switch's answer, so a
recording is complete in the grading process when ``record_traffic`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from helpers.course.grading.relay.channel import Channel

__all__ = ["RelayMarkers"]


class RelayMarkers:
    """The same interface as recorder.events.EventSender (send, close), over the relay."""

    def __init__(self, chan: Channel, label: str, content: bool, allow: Iterable[str] | None,
                 tamper, api: threading.local):  # fmt: skip
        self.chan, self._saved_api, self.label = chan, chan.api, label
        key = None if tamper is None else tamper.key
        allowed = None if allow is None else sorted(allow)
        chan.call({"t": "open", "label": label, "content": bool(content), "allow": allowed,
                   "tamper": key})  # fmt: skip
        chan.api = api  # the backend reads isend/irecv from record_traffic's named_p2p

    def send(self, event: dict, content: torch.Tensor | None = None) -> None:
        self.chan.post({"t": "event", "event": event, "label": self.label})

    def close(self) -> None:
        self.chan.api = self._saved_api
        self.chan.call({"t": "close"})
