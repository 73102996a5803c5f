"""What each collective computes, on the grading process's copies of the ranks' tensors.

The switch (relay/switch.py) collects one ``Part`` per rank of a group for the group's
n-th collective, then calls ``answer(op, parts)``: it checks that the ranks agree (same
operation, dtype, sizes, root), computes every rank's outputs, and returns them as one
flat tensor per rank (the bytes of that rank's output tensors, in order). Disagreement
raises ``Mismatch`` with a message that says which rank called what.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from helpers.course.grading.relay.frames import dtype_of

__all__ = ["COLLECTIVES", "Mismatch", "Part", "answer", "parse_part", "reduce_all"]

# Every collective the relay knows, by the name the recorder gives it (recorder/c10d.py).
COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_coalesced", "all_gather_into_tensor_coalesced",
    "gather", "gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced", "scatter", "all_to_all_single", "all_to_all", "barrier",
)  # fmt: skip
_ROOTED = ("reduce", "broadcast", "gather", "gather_into_tensor", "scatter")
_GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_coalesced",
            "all_gather_into_tensor_coalesced", "gather", "gather_into_tensor")  # fmt: skip


class Mismatch(ValueError):
    """The ranks of a group called a collective that cannot be computed as called."""


@dataclass
class Part:
    """One rank's call: its inputs (flat, in order), output sizes and options."""

    rank: int  # global rank
    op: str
    dtype: torch.dtype
    inputs: list[torch.Tensor]  # flat views of the payload
    shapes: list[list[int]]
    outputs: list[int]  # numel of each output tensor
    red: str | None = None
    root: int | None = None  # group rank
    si: list[int] | None = None  # all-to-all: elements sent to each group rank
    so: list[int] | None = None  # all-to-all: elements expected from each group rank
    held: int = 0  # bytes the switch counts as held for it while the group gathers

    def describe(self) -> str:
        sizes = " + ".join(str(math.prod(s)) for s in self.shapes) or "no"
        extra = f", root {self.root}" if self.root is not None else ""
        red = f", {self.red}" if self.red else ""
        dtype = str(self.dtype).removeprefix("torch.")
        return f"rank {self.rank} called {self.op} with {sizes} {dtype} elements{red}{extra}"


def _ints(value, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
        raise ValueError(f"{what} must be a list of sizes")
    return value


def parse_part(rank: int, header: dict, payload: bytearray) -> Part:
    """A rank's collective from its frame; ValueError when the frame does not add up."""
    op = header.get("op")
    if op not in COLLECTIVES:
        raise ValueError(f"the relay has no collective {op!r}")
    dtype = dtype_of(header.get("dtype"))
    shapes = header.get("s")
    if not isinstance(shapes, list):
        raise ValueError("s must list the input shapes")
    shapes = [_ints(s, "a shape") for s in shapes]
    numels = [math.prod(s) for s in shapes]
    size = torch.empty(0, dtype=dtype).element_size()
    if sum(numels) * size != len(payload):
        raise ValueError(f"{op}: {len(payload)} bytes do not hold inputs of shapes {shapes}")
    flat = torch.frombuffer(payload, dtype=dtype) if payload else torch.empty(0, dtype=dtype)
    inputs = list(flat.split(numels)) if numels else []
    part = Part(rank, op, dtype, inputs, shapes, _ints(header.get("o"), "o"))
    red, root = header.get("red"), header.get("root")
    part.red = red if isinstance(red, str) else None
    part.root = root if isinstance(root, int) else None
    if "si" in header:
        part.si, part.so = _ints(header["si"], "si"), _ints(header.get("so"), "so")
    return part


def reduce_all(tensors: list[torch.Tensor], red: str) -> torch.Tensor:
    """Elementwise reduction over ranks, in rank order, in the tensors' own dtype."""
    acc = tensors[0].clone()
    floating = acc.is_floating_point() or acc.is_complex()
    if red in ("BAND", "BOR", "BXOR") and floating:
        raise Mismatch(f"{red} needs integer or bool tensors, not {acc.dtype}")
    for t in tensors[1:]:
        if red in ("SUM", "AVG"):
            acc = acc | t if acc.dtype == torch.bool else acc.add_(t)
        elif red == "PRODUCT":
            acc = acc & t if acc.dtype == torch.bool else acc.mul_(t)
        elif red == "MIN":
            acc = torch.minimum(acc, t)
        elif red == "MAX":
            acc = torch.maximum(acc, t)
        else:
            acc = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[
                red
            ](acc, t)
    if red == "AVG":
        if not floating:
            raise Mismatch(f"AVG needs floating-point tensors, not {acc.dtype}")
        acc = acc.div_(len(tensors))
    return acc


def _agree(op: str, parts: list[Part]) -> None:
    first = parts[0]
    same = all(
        (p.op, p.dtype, p.red, p.root) == (first.op, first.dtype, first.red, first.root)
        for p in parts
    )
    if not same:
        raise Mismatch(f"the ranks of the group called different collectives: "
                       f"{'; '.join(p.describe() for p in parts)}")  # fmt: skip


def _flat(part: Part) -> torch.Tensor:
    return torch.cat(part.inputs) if part.inputs else torch.empty(0, dtype=part.dtype)


def _equal_sizes(op: str, parts: list[Part]) -> None:
    sizes = {tuple(t.numel() for t in p.inputs) for p in parts}
    if len(sizes) > 1:
        raise Mismatch(f"{op}: every rank must put in tensors of the same size: "
                       f"{'; '.join(p.describe() for p in parts)}")  # fmt: skip


def _pieces(t: torch.Tensor, sizes: list[int], what: str) -> list[torch.Tensor]:
    if sum(sizes) != t.numel():
        raise Mismatch(f"{what}: {t.numel()} elements cannot be split as {sizes}")
    return list(t.split(sizes))


def _outputs(op: str, parts: list[Part]) -> list[torch.Tensor | None]:
    """Each rank's outputs, flat (None: the rank gets nothing back)."""
    n = len(parts)
    empty = torch.empty(0, dtype=parts[0].dtype)
    root = parts[0].root
    if op == "barrier":
        return [empty] * n
    if op in ("all_reduce", "all_reduce_coalesced", "reduce"):
        _equal_sizes(op, parts)
        total = reduce_all([_flat(p) for p in parts], parts[0].red)
        return [total if op != "reduce" or g == root else empty for g in range(n)]
    if op == "broadcast":
        _equal_sizes(op, parts)
        return [_flat(parts[root])] * n
    if op in _GATHERS:
        counts = {len(p.inputs) for p in parts}
        if len(counts) > 1:
            raise Mismatch(f"{op}: ranks put in different numbers of tensors: "
                           f"{'; '.join(p.describe() for p in parts)}")  # fmt: skip
        whole = torch.cat([p.inputs[i] for i in range(counts.pop()) for p in parts])
        if op.startswith("gather"):
            return [whole if g == root else empty for g in range(n)]
        return [whole] * n
    if op in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
        _equal_sizes(op, parts)
        per_input = []
        for i in range(len(parts[0].inputs)):
            total = reduce_all([p.inputs[i] for p in parts], parts[0].red)
            if total.numel() % n:
                raise Mismatch(f"{op}: {total.numel()} elements do not split over {n} ranks")
            per_input.append(total.chunk(n) if total.numel() else [total] * n)
        return [torch.cat([pieces[g] for pieces in per_input]) for g in range(n)]
    if op == "reduce_scatter":
        _equal_sizes(op, parts)
        total = reduce_all([_flat(p) for p in parts], parts[0].red)
        return _pieces(total, [t.numel() for t in parts[0].inputs], op)
    if op == "scatter":
        pieces = _pieces(_flat(parts[root]), [t.numel() for t in parts[root].inputs], op)
        if len(pieces) != n:
            raise Mismatch(f"scatter: the root put in {len(pieces)} tensors for {n} ranks")
        return pieces
    return _all_to_all(op, parts)


def _all_to_all(op: str, parts: list[Part]) -> list[torch.Tensor]:
    n = len(parts)
    chunks = []
    for p in parts:
        if p.si is None or p.so is None or len(p.si) != n or len(p.so) != n:
            raise Mismatch(f"{op}: rank {p.rank} did not give {n} split sizes")
        chunks.append(_pieces(_flat(p), p.si, f"{op} on rank {p.rank}"))
    for g, p in enumerate(parts):
        for r in range(n):
            if chunks[r][g].numel() != p.so[r]:
                raise Mismatch(f"{op}: rank {parts[r].rank} sends {chunks[r][g].numel()} "
                               f"elements to rank {p.rank}, which expects {p.so[r]}")  # fmt: skip
    return [torch.cat([chunks[r][g] for r in range(n)]) for g in range(n)]


def answer(op: str, parts: list[Part]) -> list[torch.Tensor]:
    """Every rank's outputs (flat, one tensor per group rank) for one matched collective."""
    _agree(op, parts)
    if parts[0].root is not None and not 0 <= parts[0].root < len(parts):
        raise Mismatch(f"{op}: root {parts[0].root} is not a rank of this group of {len(parts)}")
    if op in _ROOTED and parts[0].root is None:
        raise Mismatch(f"{op} needs a root")
    outs = _outputs(op, parts)
    for p, out in zip(parts, outs, strict=True):
        if out.numel() != sum(p.outputs):
            raise Mismatch(f"{op}: rank {p.rank}'s output tensors hold {sum(p.outputs)} "
                           f"elements, the {op} brings it {out.numel()}")  # fmt: skip
    return outs
