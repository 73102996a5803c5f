"""What every rank must agree on in a collective: its kind, shapes, dtypes, root and reduce op.

``signature(method, args)`` reads the arguments torch passes a process group's backend method
(``allreduce(tensors, opts)``, ``_allgather_base(out, x, opts)``, ...) and returns the name a
learner knows and a text that must be the same on every rank of the group, as NCCL needs it:
the kind, the number of elements of each tensor (NCCL moves counts, not shapes: a 0-d tensor
meets a [1] one, as DeepSpeed's pipeline stages all-reduce their loss), the dtype, root and
reduce op (torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` compares shapes too, for its backends).
An all-to-all's splits and a gather's or scatter's root lists legitimately differ between
ranks: only what must agree is in the text.
"""

from __future__ import annotations

__all__ = ["signature", "NAMES"]

NAMES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced",
    "broadcast": "broadcast", "allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor", "allgather_coalesced": "all_gather_coalesced",
    "all_gather_single_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all_single", "alltoall_base": "all_to_all_single",
    "alltoall": "all_to_all", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier",
}  # fmt: skip


def _t(x) -> str:
    """'32 float32': NCCL moves a count of elements; a [4, 8] tensor meets a [32] one."""
    return f"{x.numel()} {str(x.dtype).removeprefix('torch.')}"


def _ts(xs) -> str:
    return "[" + ", ".join(_t(x) for x in xs) + "]"


def _op(opts) -> str:
    op = getattr(opts, "reduceOp", None)
    return f", op={op.op.name}" if op is not None else ""


def _row(x) -> str:
    """An all-to-all's dtype: how many elements go to each rank may differ."""
    return str(x.dtype).removeprefix("torch.")


def signature(method: str, args: tuple) -> tuple[str, str]:
    """(the collective's name, what every rank must call it with) for a backend method."""
    name = NAMES.get(method, method)
    a = args
    if method in ("allreduce", "allreduce_coalesced"):
        body = _ts(a[0]) + _op(a[1])
    elif method == "broadcast":
        body = f"{_ts(a[0])}, root={a[1].rootRank}"
    elif method in ("allgather", "allgather_coalesced"):
        body = "[" + ", ".join(_ts(outs) for outs in a[0]) + "]"
    elif method in ("_allgather_base", "all_gather_single"):
        body = f"{_t(a[0])} <- {_t(a[1])}"
    elif method in ("all_gather_single_coalesced", "reduce_scatter_single_coalesced"):
        body = f"{_ts(a[0])} <- {_ts(a[1])}" + (_op(a[2]) if "reduce" in method else "")
    elif method == "reduce_scatter":
        body = "[" + ", ".join(_ts(ins) for ins in a[1]) + "]" + _op(a[2])
    elif method in ("_reduce_scatter_base", "reduce_scatter_single"):
        body = f"{_t(a[0])} <- {_t(a[1])}{_op(a[2])}"
    elif method in ("all_to_all_single", "alltoall_base"):
        body = _row(a[1])
    elif method == "alltoall":
        body = str(a[1][0].dtype).removeprefix("torch.") if a[1] else ""
    elif method == "reduce":
        body = f"{_ts(a[0])}, root={a[1].rootRank}{_op(a[1])}"
    elif method == "gather":
        body = f"{_ts(a[1])}, root={a[2].rootRank}"
    elif method == "scatter":
        body = f"{_ts(a[0])}, root={a[2].rootRank}"
    else:  # barrier
        body = ""
    return name, f"{name}({body})"
