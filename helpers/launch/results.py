"""What a launch returns or raises: RunResult, RankFailure, and the peer-error pattern.

A leaf module: the launchers (torchrun.py, pool.py, spawnjob.py, supervise.py)
import their result types from here, never from the package façade.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PEER_ERROR", "RankFailure", "RunResult"]

# A traceback ending like this was caused by another rank dying, not by this rank's code.
PEER_ERROR = re.compile(
    r"(closed|reset) by peer|Broken pipe|Socket Timeout|DistNetworkError|"
    r"NCCL communicator was aborted|Timed out waiting"
)


class RankFailure(RuntimeError):
    """A rank of a run() or spawn() failed; the message names it and carries its traceback.

    Attributes: rank (int or None), summary (one line), remote_traceback (str),
    original (the rank's exception object when it could be sent back, else None),
    failed (every rank that raised an error of its own), world_size (when known).

    In a notebook, IPython shows ``_render_traceback_()``: the rank's own
    traceback first, without the launcher's frames, under one line saying which
    ranks failed (all 4 raised the same error, or ranks 1 and 3 failed and the
    others were stopped).
    """

    def __init__(
        self,
        rank,
        summary: str,
        remote_traceback: str = "",
        original=None,
        failed: list[int] | None = None,
        world_size: int | None = None,
    ):
        self.rank, self.summary = rank, summary
        self.remote_traceback, self.original = remote_traceback, original
        self.failed = sorted(failed) if failed else ([rank] if rank is not None else [])
        self.world_size = world_size
        text = self.headline()
        if remote_traceback:
            text += f"\n\n--- traceback from {self._who()} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def _who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else "the run"

    def headline(self) -> str:
        """One line: which ranks failed with what, and which were stopped."""
        n, failed = self.world_size, self.failed
        kind = self.summary.split(":", 1)[0]
        if n and len(failed) == n and n > 1:
            return f"all {n} ranks raised {kind} (rank {self.rank} shown): {self.summary}"
        if len(failed) > 1:
            who = ", ".join(map(str, failed))
            stopped = [r for r in range(n) if r not in failed] if n else []
            tail = f"; ranks {', '.join(map(str, stopped))} were stopped" if stopped else ""
            return f"ranks {who} failed (rank {self.rank} shown){tail}: {self.summary}"
        stopped = ""  # world size unknown (n None) or one rank: nobody else to stop
        if n and n > 1:
            others = "the other rank was" if n == 2 else f"the other {n - 1} ranks were"
            stopped = f"; {others} stopped"
        return f"{self._who()} failed{stopped}: {self.summary}"

    def _render_traceback_(self) -> list[str]:
        """What IPython prints: the headline, then the rank's own traceback only."""
        lines = [f"RankFailure: {self.headline()}"]
        if self.remote_traceback:
            lines += [
                "",
                f"Traceback from {self._who()}:",
                *self.remote_traceback.rstrip().splitlines(),
            ]
        return lines

    def __reduce__(self):  # picklable, so it survives crossing processes itself
        return (
            type(self),
            (self.rank, self.summary, self.remote_traceback, None, self.failed, self.world_size),
        )


@dataclass
class RunResult:
    """What one run() left behind (everything is also on disk in run_dir)."""

    ok: bool
    returncode: int | None
    run_dir: Path
    command: list[str]
    wall_time: float
    logs: dict[int, str] = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    failed_rank: int | None = None
    traceback: str = ""
    timed_out: bool = False

    def raise_for_status(self) -> RunResult:
        """Raise RankFailure naming the failing rank (with its traceback) unless ok."""
        if self.ok:
            return self
        if self.timed_out:
            summary = (
                f"timed out after {self.wall_time:.0f} s and was stopped (logs in {self.run_dir})"
            )
        else:
            last = [ln for ln in self.traceback.splitlines() if ln.strip()][-1:]
            summary = (f"{last[0].strip()} " if last and self.failed_rank is not None else "") + (
                f"(torchrun exit code {self.returncode}, logs in {self.run_dir})"
            )
        raise RankFailure(self.failed_rank, summary, self.traceback)

    def __repr__(self) -> str:
        state = (
            "ok"
            if self.ok
            else ("timed out" if self.timed_out else f"failed rank {self.failed_rank}")
        )
        return f"RunResult({state}, {self.wall_time:.1f} s, metrics={self.metrics}, run_dir='{self.run_dir}')"
