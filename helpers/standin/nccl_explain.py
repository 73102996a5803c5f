"""Why a model of NCCL's order holds these operations (``helpers.standin.nccl_order``), in words.

``why(model, item)`` follows the chain of waits from one operation that cannot complete,
sentence by sentence, to its cycle (or, once nothing more will be posted, to what is
missing); ``p2p_problems(logs)`` runs the model on complete logs, one per rank, and says why
NCCL would hang on them (lab 1's grader reads a ring's recorded messages with it).
"""

from __future__ import annotations

from helpers.standin.nccl_order import FIX, RULE, Model, Op, _Item, describe

__all__ = ["why", "p2p_problems"]


def why(model: Model, key: tuple[int, int], final: bool = False) -> str:
    """The chain of waits that holds ``key``, as sentences: to its cycle, or to what is
    missing (``final``: nothing more will be posted)."""
    started, done = set(model.started), set(model.done)
    model._run(started, done, hopeful=not final)
    lines, seen = [], []
    while key not in seen:
        seen.append(key)
        item = model.items[key]
        if key not in started:
            blocker, reason = next((d, why) for d, why in item.deps.items() if d not in done)
            first = model.items[blocker].ops[0]
            if reason == "stream":
                how = ("on the same pair of ranks" if item.stream[0] == "pair"
                       else "on the group's one stream")  # fmt: skip
                lines.append(f"{_name(item)} was posted after {describe(first)} {how}, "
                             "so it starts only when that one is done")  # fmt: skip
            else:
                lines.append(f"{_name(item)} was posted after the rank waited for "
                             f"{describe(first)}")  # fmt: skip
            key = blocker
            continue
        gap = _gap(model, item, started)
        if gap is None:
            break
        text, blocker = gap
        lines.append(text)
        if blocker is None:
            break
        key = blocker
    return ";\n  ".join(lines)


def _gap(model: Model, item: _Item, started: set):
    """(sentence, the item it waits for or None) for a started item that is not done."""
    if item.ops[0].kind == "coll":
        op = item.ops[0]
        for q, other in enumerate(model.coll_peers(op)):
            if other is None:
                return (f"{describe(op)} waits for rank {q}, which has not called it "
                        f"(rank {q} posted {len(model.colls[q])} collectives on this group, "
                        f"rank {op.rank} {len(model.colls[op.rank])})", None)  # fmt: skip
            key = model.item_of[other.rank, other.index]
            if key not in started:
                return f"{describe(op)} waits for {describe(other)} to start", key
        return None
    for op in item.ops:
        match = model.partner(op)
        if match is None:
            return (f"{describe(op)} waits for rank {op.peer} to post the matching "
                    f"{'receive' if op.kind == 'send' else 'send'}{_elsewhere(model, op)}",
                    None)  # fmt: skip
        key = model.item_of[match.rank, match.index]
        if key not in started:
            verb = "cannot complete until" if op.kind == "send" else "waits until"
            return f"{describe(op)} {verb} {describe(match)} runs", key
    return None


def _elsewhere(model: Model, op: Op) -> str:
    """A hint when the peer posted the match the other way (batched against unbatched)."""
    src, dst = (op.rank, op.peer) if op.kind == "send" else (op.peer, op.rank)
    other_kind = "recv" if op.kind == "send" else "send"
    if model._line(src, dst, op.batch is None, other_kind):
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


def p2p_problems(logs: list[list[Op]], eager: bool = True) -> list[str]:
    """Why these complete logs (one per rank, in order) would hang on NCCL ([] if they would not)."""
    model = Model(len(logs), eager)
    for log in logs:
        for op in log:
            model.add(op)
    model.update()
    problems = list(model.problems)
    stuck = model.stuck() or model.pending  # complete logs: what is pending now stays pending
    if stuck:
        problems.append(f"{RULE}; so on GPUs this hangs:\n  {why(model, stuck[0], final=True)}."
                        f"\nFix: {FIX}")  # fmt: skip
    return problems
