"""One recording of one rank, as the grading process logged it, and what it says about memory.

A ``Recording`` is what happened between a rank's ``record_traffic`` opening and closing
(helpers.course.grading.recorder.traffic), in order: its messages and collectives (as the
relay carried them), the messages changed on their way, lab 6's gates, and, when the
job's plan measures memory, the samples the grading process took of the rank's memory
from the operating system ("mark" events, helpers.course.grading.recorder.os_memory): one
as it opened, one at each mark the rank asked for, one as it closed.

``peak_bytes``: the most bytes the rank held at once above what it held as the recording
opened (its resident memory's high-water mark, plus what it put in its sandbox's tmpfs);
``kept_bytes``: what it held more as it closed than as it opened (its anonymous and shared
memory and tmpfs files: tensors, wherever they are kept). Both raise ``MemoryNotMeasured``
when the recording holds no samples, or a sample failed: a test then fails with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["MemoryNotMeasured", "Recording", "held", "window_peak"]


class MemoryNotMeasured(AssertionError):
    """A recording's memory could not be measured (no samples, or the rank's were refused)."""


def held(mark: dict) -> int:
    """Bytes a rank kept at a sample: anonymous and shared memory, and its tmpfs files."""
    if "error" in mark:
        raise MemoryNotMeasured(f"the memory of sample {mark.get('name')!r} could not be measured: "
                                f"{mark['error']}")  # fmt: skip
    return mark["anon"] + mark["shmem"] + mark["files"]


def window_peak(marks: list[dict]) -> int:
    """The most bytes held at once from the first sample to the last, above the first."""
    if len(marks) < 2:
        return 0
    start = marks[0]
    top = max(m["hwm"] for m in marks[1:])
    # tmpfs at each sample, and at each operation between two samples (the relay's, under a
    # memory plan): files written and removed while the rank communicated count too
    files = max([start["files"]] + [m.get("files_peak", m["files"]) for m in marks[1:]])
    return max(0, top - start["rss"]) + max(0, files - start["files"])


def checked(marks: list[dict], who: str) -> list[dict]:
    bad = [m for m in marks if "error" in m]
    if bad:
        raise MemoryNotMeasured(f"{who}: its memory could not be measured: {bad[0]['error']}")
    if len(marks) < 2:
        raise MemoryNotMeasured(
            f"{who}: {len(marks)} memory sample(s); the grading process measures a recording "
            "as it opens and as it closes (was the job's EventLog opened with memory=True?)"
        )
    return marks


@dataclass
class Recording:
    """Everything logged for one recording of one rank, in the order it happened."""

    rank: int
    label: str
    seq: int
    events: list[dict] = field(default_factory=list)
    closed: bool = False  # the recorder's context ended

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]

    @property
    def messages(self) -> list[dict]:
        """Point-to-point operations: op (send/isend/recv/irecv), peer, numel, bytes."""
        return self.of("p2p")

    @property
    def calls(self) -> list[tuple[str, int]]:
        """(collective, bytes this rank put in) of each allowed collective, in order."""
        return [(e["name"], e["bytes"]) for e in self.of("collective") if e["allowed"]]

    @property
    def refused(self) -> list[str]:
        return [e["name"] for e in self.of("collective") if not e["allowed"]]

    @property
    def tampered(self) -> list[dict]:
        return self.of("tampered")

    @property
    def marks(self) -> list[dict]:
        """The memory samples of this recording, in order (see the module docstring)."""
        return self.of("mark")

    def mark(self, name: str) -> dict:
        """The sample named ``name`` (the rank's ``probe.mark(name)``)."""
        found = [m for m in self.marks if m.get("name") == name]
        if len(found) != 1:
            raise MemoryNotMeasured(f"rank {self.rank}, {self.label}: {len(found)} samples "
                                    f"named {name!r}, expected one")  # fmt: skip
        return found[0]

    @property
    def peak_bytes(self) -> int:
        """Most bytes held at once above the recording's start (see the module docstring)."""
        return window_peak(checked(self.marks, f"rank {self.rank}, {self.label}"))

    @property
    def kept_bytes(self) -> int:
        """Bytes held more at the recording's end than at its start."""
        marks = checked(self.marks, f"rank {self.rank}, {self.label}")
        return max(0, held(marks[-1]) - held(marks[0]))

    def contents(self, kind: str = "p2p", outgoing: bool = True) -> list[torch.Tensor]:
        """The tensors that events of ``kind`` carried (sends only, by default, for p2p)."""
        picked = self.of(kind)
        if kind == "p2p":
            picked = [e for e in picked if e["op"] in ("send", "isend")] if outgoing else picked
        return [e["tensor"] for e in picked if "tensor" in e]
