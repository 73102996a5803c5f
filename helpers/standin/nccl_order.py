"""NCCL's rules for the order of operations, as a model: would these ranks hang on GPUs?

What NCCL (and torch's ProcessGroupNCCL on top of it) does, and gloo on CPU ranks does not:

* **one stream per group.** A rank's operations in a process group run on one stream, in the
  order the rank posted them: a later one starts only when the earlier one is done. torch
  does this for collectives, for batches, and for unbatched ``send``/``isend``/``recv``/
  ``irecv`` too when the group is bound to a device ("In eager initialization mode, unbatched
  P2P ops are treated as independent collective ops, and are thus serialized with all other
  ops on this ProcessGroup, including other P2P ops", torch 2.14's warning), as
  ``helpers.dist.init`` binds it (``device_id``). A group made without a device keeps a
  communicator, and a stream, per pair of ranks for its unbatched messages instead
  (``Model(eager=False)``);
* **rendezvous.** A send completes only when the matching receive runs (NCCL may block a
  send until the receive is posted, whatever its size: NVIDIA/nccl#479). The k-th send from
  a to b matches the k-th receive on b from a; tags are not looked at;
* **a batch is one group.** ``batch_isend_irecv`` posts its operations together (NCCL's
  ``ncclGroupStart/End``): they progress together, in any order among themselves, and match
  only operations posted in a batch on the other side;
* **collectives** complete when every rank has started the same one (the n-th collective of
  each rank);
* **waiting** on an operation (a blocking ``send``/``recv``, ``work.wait()``) makes every
  operation the rank posts afterwards wait for it.

So on 2 ranks, ``isend`` to the peer then ``recv`` from it, on both ranks, hangs: each
rank's receive is queued behind its own send, which waits for the other's receive. On a
group bound to a device the same ring step hangs on any number of ranks (each rank's receive
from the left waits behind its send to the right, round the ring). Gloo lets an ``isend`` go
out before its receive is posted and lets the same program pass.

``Model`` takes each rank's operations as they are posted (``Op``) and says which ones can
never complete (a cycle of waits), and, once every rank is stuck, which ones are waiting
for something no rank will post; ``nccl_explain`` says why in sentences, and runs it on
complete logs (the lab graders' recorded traffic). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Op", "Model", "RULE", "FIX", "describe"]

RULE = (
    "on NCCL, a rank's operations in a group run in the order it posted them (one stream per "
    "group, sends and receives included, for a group bound to its GPU as helpers.dist.init "
    "binds it), and a send completes only when the matching receive runs, whatever its size"
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

    def __init__(self, world: int, eager: bool = True):
        self.world, self.eager = world, eager  # eager: the group is bound to a device
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
        unbatched = op.kind != "coll" and op.batch is None
        stream = ("pair", op.peer) if unbatched and not self.eager else ("group",)
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
