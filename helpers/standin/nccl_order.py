"""NCCL's rules for the order of operations, as a model: would these ranks hang on GPUs?

What NCCL (and torch's ProcessGroupNCCL on top of it) does, and gloo on CPU ranks does not:

* **point-to-point, one stream per pair.** An unbatched ``send``/``isend``/``recv``/``irecv``
  between ranks a and b runs on a stream of that pair, on each side, in the order the side
  posted it: a later operation with the same peer starts only when the earlier one is done;
* **rendezvous.** A send completes only when the matching receive runs (NCCL may block a
  send until the receive is posted, whatever its size: NVIDIA/nccl#479). The k-th send from
  a to b matches the k-th receive on b from a; tags are not looked at;
* **a batch is one group.** ``batch_isend_irecv`` posts its operations together (NCCL's
  ``ncclGroupStart/End``) on the group's own stream: they progress together, in any order
  among themselves, and match only operations posted in a batch on the other side;
* **collectives** run on the group's stream too, and complete when every rank has started
  the same one (the n-th collective of each rank);
* **waiting** on an operation (a blocking ``send``/``recv``, ``work.wait()``) makes every
  operation the rank posts afterwards wait for it.

So on 2 ranks, ``isend`` to the peer then ``recv`` from it, on both ranks, hangs: each
rank's receive is queued behind its own send, which waits for the other's receive. Gloo
buffers the send and lets the same program pass.

``Model`` takes each rank's operations as they are posted (``Op``) and says which ones can
never complete (a cycle of waits), and, once every rank is stuck, which ones are waiting
for something no rank will post. ``p2p_problems`` runs it on complete logs (the lab graders'
recorded traffic). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Op", "Model", "RULE", "FIX", "p2p_problems", "describe"]

RULE = (
    "on NCCL, the operations between two ranks run in the order each side posted them, and "
    "a send completes only when the matching receive runs (whatever its size)"
)
FIX = (
    "post each step's send and receive as ONE tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, "
    "out, dst), tdist.P2POp(tdist.irecv, into, src)]) and wait on its requests, or order them by "
    "rank parity (even ranks send first, odd ranks receive first)"
)


@dataclass(frozen=True)
class Op:
    """One operation a rank posted, in its group's numbering of ranks."""

    rank: int
    index: int  # the rank's own count of operations in this group, from 0
    kind: str  # "send", "recv" or "coll"
    peer: int = -1
    batch: int | None = None  # the rank's batch number when posted in a batch_isend_irecv
    numel: int = 0
    dtype: str = ""
    name: str = ""  # isend, send, irecv, recv; a collective's name
    at: str = ""  # where the program posted it: "file:line: code"
    after: tuple[int, ...] = ()  # indices of the rank's operations it waited for before this one
    sig: str = ""  # a collective's kind, shapes and dtypes: what every rank must agree on


def describe(op: Op) -> str:
    """rank 0's isend to 1 (program.py:8: ...)"""
    where = f" ({op.at})" if op.at else f" (its message #{op.index + 1})"
    if op.kind == "coll":
        return f"rank {op.rank}'s {op.name}{where}"
    way = "to" if op.kind == "send" else "from"
    batch = " in a batch_isend_irecv" if op.batch is not None else ""
    return f"rank {op.rank}'s {op.name or op.kind} {way} {op.peer}{batch}{where}"


@dataclass
class _Item:
    """What runs as one unit on a stream: an operation, or a batch of them."""

    key: tuple[int, int]  # (rank, index of its first operation)
    ops: list[Op]
    stream: tuple
    deps: dict[tuple[int, int], str] = field(default_factory=dict)  # item -> why it comes first


class Model:
    """Every rank's operations in one group, and which of them NCCL would complete."""

    def __init__(self, world: int):
        self.world = world
        self.items: dict[tuple[int, int], _Item] = {}
        self.item_of: dict[tuple[int, int], tuple[int, int]] = {}  # (rank, op index) -> item
        self.pending: list[tuple[int, int]] = []
        self.started: set[tuple[int, int]] = set()
        self.done: set[tuple[int, int]] = set()
        self.count = [0] * world  # operations seen per rank
        self._last: list[dict] = [{} for _ in range(world)]  # stream -> its last item
        self._waited: list[dict] = [{} for _ in range(world)]  # items waited for -> op waited
        self._lines: dict[tuple, list[Op]] = {}  # (src, dst, batched, "send"/"recv") -> ops
        self.colls: list[list[Op]] = [[] for _ in range(world)]
        self._nth: dict[tuple[int, int], int] = {}  # (rank, op index) -> its place in its line
        self.problems: list[str] = []  # disagreements found (sizes, collectives)

    # -- building ----------------------------------------------------------------
    def add(self, op: Op) -> None:
        """The next operation of ``op.rank`` (operations of one rank arrive in order)."""
        r = op.rank
        if op.index != self.count[r]:
            raise ValueError(f"rank {r}: operation #{op.index} arrived, #{self.count[r]} expected")
        self.count[r] += 1
        for index in op.after:
            item = self.item_of.get((r, index))
            if item is not None and item not in self.done:
                self._waited[r][item] = index
        if op.kind == "coll":
            stream = ("group",)
        elif op.batch is not None:
            stream = ("group",)
        else:
            stream = ("pair", op.peer)
        last = self.items.get(self._last[r].get(stream))
        if op.batch is not None and last is not None and last.ops[0].batch == op.batch:
            last.ops.append(op)  # the same batch_isend_irecv: one group
            self.item_of[r, op.index] = last.key
        else:
            self._new_item(op, stream, last)
        if op.kind == "coll":
            self._add_coll(op)
        else:
            self._add_p2p(op)

    def _new_item(self, op: Op, stream: tuple, last: _Item | None) -> None:
        item = _Item((op.rank, op.index), [op], stream)
        if last is not None and last.key not in self.done:
            item.deps[last.key] = "stream"
        for waited, index in self._waited[op.rank].items():
            if waited not in self.done:
                item.deps.setdefault(waited, f"waited:{index}")
        self.items[item.key] = item
        self.item_of[op.rank, op.index] = item.key
        self._last[op.rank][stream] = item.key
        self.pending.append(item.key)

    def _line(self, src: int, dst: int, batched: bool, kind: str) -> list[Op]:
        return self._lines.setdefault((src, dst, batched, kind), [])

    def _add_p2p(self, op: Op) -> None:
        batched = op.batch is not None
        src, dst = (op.rank, op.peer) if op.kind == "send" else (op.peer, op.rank)
        mine = self._line(src, dst, batched, op.kind)
        self._nth[op.rank, op.index] = len(mine)
        mine.append(op)
        other = self._line(src, dst, batched, "recv" if op.kind == "send" else "send")
        if len(other) >= len(mine):
            match = other[len(mine) - 1]
            if (match.numel, match.dtype) != (op.numel, op.dtype) and match.dtype and op.dtype:
                send, recv = (op, match) if op.kind == "send" else (match, op)
                self.problems.append(
                    f"{describe(send)} sends {send.numel} {send.dtype} and {describe(recv)} "
                    f"receives {recv.numel} {recv.dtype}: NCCL needs the same count and dtype "
                    "on both sides of a message (it fails or hangs otherwise)"
                )

    def _add_coll(self, op: Op) -> None:
        c = len(self.colls[op.rank])
        self._nth[op.rank, op.index] = c
        self.colls[op.rank].append(op)
        for q in range(self.world):
            if q != op.rank and len(self.colls[q]) > c and self.colls[q][c].sig != op.sig:
                self.problems.append(_coll_mismatch(self.colls, c, self.colls[q][c], op))
                return

    def partner(self, op: Op) -> Op | None:
        batched = op.batch is not None
        src, dst = (op.rank, op.peer) if op.kind == "send" else (op.peer, op.rank)
        k = self._nth[op.rank, op.index]
        other = self._line(src, dst, batched, "recv" if op.kind == "send" else "send")
        return other[k] if k < len(other) else None

    def coll_peers(self, op: Op) -> list[Op | None]:
        c = self._nth[op.rank, op.index]
        return [self.colls[q][c] if c < len(self.colls[q]) else None for q in range(self.world)]

    # -- running -------------------------------------------------------------------
    def _complete(self, item: _Item, started: set, hopeful: bool) -> bool:
        if item.ops[0].kind == "coll":
            others = self.coll_peers(item.ops[0])
            return all(self.item_of[o.rank, o.index] in started if o else hopeful for o in others)
        for op in item.ops:
            match = self.partner(op)
            if match is None:
                if not hopeful:
                    return False
            elif self.item_of[match.rank, match.index] not in started:
                return False
        return True

    def _run(self, started: set, done: set, hopeful: bool) -> list[tuple[int, int]]:
        """Start and complete what can be; what is left pending."""
        pending = list(self.pending)
        changed = True
        while changed:
            changed = False
            for key in list(pending):
                item = self.items[key]
                if key not in started and all(d in done for d in item.deps):
                    started.add(key)
                    changed = True
                if key in started and self._complete(item, started, hopeful):
                    done.add(key)
                    pending.remove(key)
                    changed = True
        return pending

    def update(self) -> None:
        """Complete what the operations posted so far complete (it stays complete)."""
        self.pending = self._run(self.started, self.done, hopeful=False)
        for item in self.pending:  # forget what is done: deps and waits shrink
            deps = self.items[item].deps
            for key in [k for k in deps if k in self.done]:
                del deps[key]
        for waited in self._waited:
            for key in [k for k in waited if k in self.done]:
                del waited[key]

    def is_done(self, rank: int, index: int) -> bool:
        return self.item_of.get((rank, index)) in self.done

    def stuck(self) -> list[tuple[int, int]]:
        """Items that can never complete, whatever the ranks post next (a cycle of waits)."""
        started, done = set(self.started), set(self.done)
        return self._run(started, done, hopeful=True)

    # -- explaining --------------------------------------------------------------------
    def why(self, key: tuple[int, int], final: bool = False) -> str:
        """The chain of waits that holds ``key``, as sentences: to its cycle, or to what is
        missing (``final``: nothing more will be posted)."""
        started, done = set(self.started), set(self.done)
        self._run(started, done, hopeful=not final)
        lines, seen = [], []
        while key not in seen:
            seen.append(key)
            item = self.items[key]
            if key not in started:
                blocker, reason = next((d, why) for d, why in item.deps.items() if d not in done)
                first = self.items[blocker].ops[0]
                if reason == "stream":
                    how = ("on the same pair of ranks" if item.stream[0] == "pair"
                           else "on the group's stream")  # fmt: skip
                    lines.append(f"{_name(item)} was posted after {describe(first)} {how}, "
                                 "so it starts only when that one is done")  # fmt: skip
                else:
                    lines.append(f"{_name(item)} was posted after the rank waited for "
                                 f"{describe(first)}")  # fmt: skip
                key = blocker
                continue
            gap = self._gap(item, started)
            if gap is None:
                break
            text, blocker = gap
            lines.append(text)
            if blocker is None:
                break
            key = blocker
        return ";\n  ".join(lines)

    def _gap(self, item: _Item, started: set):
        """(sentence, the item it waits for or None) for a started item that is not done."""
        if item.ops[0].kind == "coll":
            op = item.ops[0]
            for q, other in enumerate(self.coll_peers(op)):
                if other is None:
                    return (f"{describe(op)} waits for rank {q}, which has not called it "
                            f"(rank {q} posted {len(self.colls[q])} collectives on this group, "
                            f"rank {op.rank} {len(self.colls[op.rank])})", None)  # fmt: skip
                key = self.item_of[other.rank, other.index]
                if key not in started:
                    return f"{describe(op)} waits for {describe(other)} to start", key
            return None
        for op in item.ops:
            match = self.partner(op)
            if match is None:
                return (f"{describe(op)} waits for rank {op.peer} to post the matching "
                        f"{'receive' if op.kind == 'send' else 'send'}{self._elsewhere(op)}",
                        None)  # fmt: skip
            key = self.item_of[match.rank, match.index]
            if key not in started:
                verb = "cannot complete until" if op.kind == "send" else "waits until"
                return f"{describe(op)} {verb} {describe(match)} runs", key
        return None

    def _elsewhere(self, op: Op) -> str:
        """A hint when the peer posted the match the other way (batched against unbatched)."""
        src, dst = (op.rank, op.peer) if op.kind == "send" else (op.peer, op.rank)
        other_kind = "recv" if op.kind == "send" else "send"
        if self._line(src, dst, op.batch is None, other_kind):
            return (" (rank {} posted it {} a batch_isend_irecv: NCCL matches a batch's "
                    "operations only with batched ones; post both sides the same way)").format(
                op.peer, "outside" if op.batch is not None else "in")  # fmt: skip
        return ""


def _name(item: _Item) -> str:
    if len(item.ops) > 1:
        parts = ", ".join(f"{o.name or o.kind} {'to' if o.kind == 'send' else 'from'} {o.peer}"
                          for o in item.ops)  # fmt: skip
        at = f" ({item.ops[0].at})" if item.ops[0].at else ""
        return f"rank {item.key[0]}'s batch_isend_irecv [{parts}]{at}"
    return describe(item.ops[0])


def _coll_mismatch(colls: list[list[Op]], c: int, a: Op, b: Op) -> str:
    first, second = sorted((a, b), key=lambda o: o.rank)
    text = (f"collective #{c + 1} of this group differs between ranks: {describe(first)} is "
            f"{first.sig}, {describe(second)} is {second.sig}. On NCCL this hangs or mixes up "
            "the data: every rank must call the same collectives, in the same order, with the "
            "same shapes and dtypes")  # fmt: skip
    if first.name == second.name:
        return text
    history = []
    for op in (first, second):
        start = max(0, c - 2)
        calls = ", ".join(f"#{start + i + 1} {o.name} ({o.at or 'no line'})"
                          for i, o in enumerate(colls[op.rank][start : c + 1]))  # fmt: skip
        history.append(f"rank {op.rank}: {calls}")
    return (text + ". Another collective in its place: did one rank skip a call? The last "
            "collectives of each:\n  " + "\n  ".join(history))  # fmt: skip


def p2p_problems(logs: list[list[Op]]) -> list[str]:
    """Why these complete logs (one per rank, in order) would hang on NCCL ([] if they would not)."""
    model = Model(len(logs))
    for log in logs:
        for op in log:
            model.add(op)
    model.update()
    problems = list(model.problems)
    stuck = model.stuck() or model.pending  # complete logs: what is pending now stays pending
    if stuck:
        problems.append(f"{RULE}; so on GPUs this hangs:\n  {model.why(stuck[0], final=True)}."
                        f"\nFix: {FIX}")  # fmt: skip
    return problems
