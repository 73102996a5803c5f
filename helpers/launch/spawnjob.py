"""Book-keeping for one spawn() call: per-rank output, results, exit codes, the root cause.

helpers.launch.pool feeds it what arrives on the workers' sockets and the zygote's exit
reports; it decides which rank failed first by itself (as opposed to ranks
that only noticed a dead peer) so the notebook is shown the right traceback.
"""

from __future__ import annotations

import pickle
import sys
import time

from helpers.launch.results import PEER_ERROR


class SpawnJob:
    """Book-keeping for one spawn: output buffers, results, exit codes, the root cause."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.id = 0  # the pool's number for this call, echoed in the zygote's exit reports
        self.values: dict[int, bytes] = {}
        self.exits: dict[int, int] = {}
        self.res: dict[int, bytes] = {}
        self.res_done: set[int] = set()
        self.partial: dict[tuple[str, int], str] = {}
        self.errors: list[tuple] = []  # (rank, traceback, pickled exception, summary)
        self.late_errors: list[tuple] = []  # errors reported after we killed the workers
        self.timed_out = False
        self.crashes: list[tuple[int, int]] = []  # (rank, code): died on its own, no result
        self.r_connected: set[int] = set()  # ranks whose result socket we accepted
        self.killed = False
        self.first_failure: float | None = None

    def feed(self, kind: str, rank: int, data: bytes) -> None:
        if kind == "r":
            self.res[rank] = self.res.get(rank, b"") + data
            return
        text = self.partial.pop((kind, rank), "") + data.decode("utf-8", "replace")
        *lines, rest = text.split("\n")
        if rest:
            self.partial[(kind, rank)] = rest
        for line in lines:
            _emit(kind, rank, line)

    def closed(self, kind: str, rank: int) -> None:
        if kind != "r":
            rest = self.partial.pop((kind, rank), "")
            if rest:
                _emit(kind, rank, rest)
            return
        self.res_done.add(rank)
        try:
            result = pickle.loads(self.res.pop(rank, b""))
        except Exception:
            return  # killed while reporting: the exit code tells the story
        if result[0] == "ok":
            self.values[rank] = result[1]
        elif self.killed:  # dying because we killed its peers: a consequence, not a cause
            self.late_errors.append((rank, *result[1:]))
        else:
            self.errors.append((rank, *result[1:]))
            self.first_failure = self.first_failure or time.monotonic()

    def exited(self, rank: int, code: int) -> None:
        self.exits[rank] = code
        # After we killed the workers, a signal exit (code < 0) is ours; a positive code
        # is still the rank's own doing (os._exit(7) whose report was slower than a peer's).
        if code > 0 or (code != 0 and not self.killed):
            self.crashes.append((rank, code))
            self.first_failure = self.first_failure or time.monotonic()

    def flush_output(self) -> None:
        for kind, rank in list(self.partial):
            _emit(kind, rank, self.partial.pop((kind, rank)))

    def own_failure(self) -> bool:
        """A rank failed by itself (not merely noticed that a peer died)."""
        errs = {e[0] for e in self.errors}
        crashed = [r for r, _ in self.crashes if r not in errs and r not in self.values]
        return bool(crashed) or any(not PEER_ERROR.search(e[1]) for e in self.errors)

    def root_cause(self):
        """('error', rank, tb, exc, summary) or ('crash', rank, code) or None."""
        own = [e for e in self.errors if not PEER_ERROR.search(e[1])]
        if own:
            return ("error", *own[0])
        errs = {e[0] for e in self.errors}
        for rank, code in self.crashes:
            if rank not in errs and rank not in self.values:
                return ("crash", rank, code)
        if self.errors:
            return ("error", *self.errors[0])
        if self.late_errors and not self.timed_out:
            return ("error", *self.late_errors[0])
        return None

    def failure_census(self) -> dict:
        """Which ranks failed by themselves (not because a peer vanished), for RankFailure."""
        own = sorted(
            {e[0] for e in [*self.errors, *self.late_errors] if not PEER_ERROR.search(e[1])}
        )
        return {"failed": own, "world_size": self.n}

    def accounted_ranks(self) -> set[int]:
        """Ranks whose fate is known: returned, raised, or exited with an error."""
        return {e[0] for e in self.errors} | set(self.values) | {r for r, _ in self.crashes}

    def complete(self) -> bool:
        return len(self.values) == self.n

    def finished(self) -> bool:
        """Every worker has exited and every result socket that was opened is read."""
        waiting = [r for r in range(self.n) if r in self.r_connected and r not in self.res_done]
        return len(self.exits) == self.n and not waiting


def _emit(kind: str, rank: int, line: str) -> None:
    tag = f"[rank{rank}]: "
    if line.startswith(tag):  # torch already tags error lines with the rank
        line = line[len(tag) :]
    stream = sys.stdout if kind == "o" else sys.stderr
    print(f"[rank{rank}] {line}", file=stream, flush=True)


def loads_or_none(data: bytes | None):
    try:
        return pickle.loads(data) if data else None
    except Exception:
        return None
