"""DTensor's functional collectives on the stand-in GPU, through the ordinary collectives.

torch.distributed._functional_collectives' ops reach the device as ops of their own; here
they call torch.distributed's collectives on the same tensors, which the process group
registered for the device carries.
"""

from __future__ import annotations

import torch.distributed as tdist

__all__ = ["FUNCTIONAL", "functional"]

FUNCTIONAL = {"wait_tensor", "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
               "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
               "reduce_scatter_tensor_coalesced", "all_to_all_single"}  # fmt: skip
REDUCE = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


def functional(func, args, kwargs):
    """torch.distributed._functional_collectives' ops, through the ordinary collectives."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    name = func._schema.name.split("::")[1]
    names = [a.name for a in func._schema.arguments]
    call = dict(zip(names, args, strict=False), **kwargs)
    if name == "wait_tensor":
        return call["tensor"]
    group = _resolve_process_group(call["group_name"])
    n = tdist.get_world_size(group)

    def reduce(out, x, op):
        average = op == "avg"  # gloo has no AVG: sum, then divide
        op = tdist.ReduceOp.SUM if average else getattr(tdist.ReduceOp, REDUCE[op])
        if x is None:
            tdist.all_reduce(out, op=op, group=group)
        else:
            tdist.reduce_scatter_tensor(out, x.contiguous(), op=op, group=group)
        return out.div_(n) if average else out

    if name in ("all_reduce", "all_reduce_coalesced"):
        xs = call["inputs"] if name.endswith("coalesced") else [call["input"]]
        outs = [reduce(x.clone(), None, call["reduce_op"]) for x in xs]
        return outs if name.endswith("coalesced") else outs[0]
    if name in ("all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
        xs = call["inputs"] if name.endswith("coalesced") else [call["input"]]
        outs = []
        for x in xs:
            out = x.new_empty((x.shape[0] * n, *x.shape[1:]))
            tdist.all_gather_into_tensor(out, x.contiguous(), group=group)
            outs.append(out)
        return outs if name.endswith("coalesced") else outs[0]
    if name in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
        xs = call["inputs"] if name.endswith("coalesced") else [call["input"]]
        outs = [reduce(x.new_empty((x.shape[0] // n, *x.shape[1:])), x, call["reduce_op"])
                for x in xs]  # fmt: skip
        return outs if name.endswith("coalesced") else outs[0]
    if name == "all_to_all_single":
        x, outs = call["input"], list(call["output_split_sizes"])
        out = x.new_empty((sum(outs) if outs else x.shape[0], *x.shape[1:]))
        tdist.all_to_all_single(out, x.contiguous(), outs or None,
                                list(call["input_split_sizes"]) or None, group=group)  # fmt: skip
        return out
    raise AssertionError(name)  # _FUNCTIONAL lists what is handled above
