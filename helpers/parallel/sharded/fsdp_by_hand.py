"""FSDP (ZeRO-3) from collectives, by hand: what ``fully_shard`` does, in a hundred lines.

Each *unit* (a module: a decoder block, the embedding, the output layer) keeps only its
1/N of its weights, the **master shards**, the parameters the optimizer sees. How the
weights are cut is the unit's ``layout`` (``shard_layout``):

    "flat"          FSDP1's design: the weights of its Linear and Embedding layers
                    flattened into one fp32 vector, padded to a multiple of N, one slice
                    per rank. Norms stay whole on every rank (replicated: their fp32
                    gradients are all-reduced, as DDP would). A unit with no Linear or
                    Embedding (a final norm) has no shard at all, so the optimizer never
                    sees an empty parameter that no gradient reaches.
    "per-parameter" FSDP2's design: every parameter of the unit cut on dim 0, each rank
                    keeping rows [r*c, (r+1)*c), c = ceil(rows/N): the same local tensors
                    as FSDP2's DTensors (``to_local()``), norms included.

Around the unit, in either layout:

    forward    all-gather every rank's slice, cast to the compute dtype (bf16)
               -> the full weights (views of the buffer, or copied out of it)
               -> compute -> drop them (freed)
    backward   all-gather again when autograd first needs a weight (a saved-tensor hook:
               a layer whose backward needs only its input, as an embedding's, is not
               gathered again) -> the full gradients -> reduce-scatter them in fp32:
               each rank gets the mean of its own slice -> drop the gathered weights

    units = [model.tok_embeddings, *model.layers.values(), model.norm, model.output]
    model = shard_model(d, model, units, compute_dtype=torch.bfloat16, layout="flat")
    opt = torch.optim.AdamW(model.parameters(), lr=...)  # the fp32 shards (+ replicated norms)
    loss_fn(model(tokens)).backward()
    opt.step()
    full = full_state_dict(model)     # every rank: the whole model, by its original names

What a rank holds between steps: 4 + 4 + 8 bytes (fp32 shard, its gradient, Adam) per
parameter / N, like FSDP2 (the flat layout: plus the norms whole). While a unit computes:
its full weights in the compute dtype and their gradient (the estimator's ``gathered``
part), and for the reduce-scatter an fp32 copy of that gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.func import functional_call

from helpers import compat
from helpers.parallel.sharded.shard_layout import make_layout

__all__ = ["SHARDED_TYPES", "GatherShards", "ShardedUnit", "shard_model", "full_state_dict"]

SHARDED_TYPES = (nn.Linear, nn.Embedding)  # flat layout: their weights sharded, the rest replicated


class GatherShards(torch.autograd.Function):
    """forward: all-gather the shards into the full vector (compute dtype);
    backward: reduce-scatter its gradient (fp32) so each rank gets the mean of its slice."""

    @staticmethod
    def forward(ctx, unit: ShardedUnit, *shards: torch.Tensor) -> torch.Tensor:
        ctx.unit = unit
        return unit.all_gather()

    @staticmethod
    def backward(ctx, full_grad: torch.Tensor):
        unit = ctx.unit
        unit.gathered = None  # the unit's backward is done: free the weights gathered again
        return None, *unit.layout.grads(unit.reduce_scatter(full_grad))


class ShardedUnit(nn.Module):
    """One FSDP unit: ``inner``'s weights as fp32 master shards, cut by ``layout``."""

    def __init__(self, inner: nn.Module, rank: int, world: int, compute_dtype=None, group=None,
                 layout: str = "flat"):  # fmt: skip
        super().__init__()
        self.inner, self.world, self.group = inner, world, group
        if layout == "flat":  # FSDP1 here: the Linear and Embedding weights, norms replicated
            owned = [(f"{name}.{k}".lstrip("."), p) for name, m in inner.named_modules()
                     if isinstance(m, SHARDED_TYPES) for k, p in m.named_parameters(recurse=False)]  # fmt: skip
        else:  # FSDP2: every parameter of the unit
            owned = list(inner.named_parameters())
        self.names = [name for name, _ in owned]
        self.layout = make_layout(layout, [p.shape for _, p in owned], rank, world)
        # the master shards keep the parameters' own dtype (fp32; float64 in the exact tests);
        # a unit of norms only, in the flat layout, has nothing to shard: no parameter at all
        shards = self.layout.shard([p for _, p in owned]) if owned else []
        self.shards = nn.ParameterList([nn.Parameter(t) for t in shards])
        dtypes = [p.dtype for p in inner.parameters()]
        self.dtype = compute_dtype or (dtypes[0] if dtypes else torch.float32)
        for name in self.names:  # the unit keeps no full copy: forward supplies it
            path, _, attr = name.rpartition(".")
            del (inner.get_submodule(path) if path else inner)._parameters[attr]
        self.replicated = dict(inner.named_parameters())  # what is left: norms (flat layout)
        for p in self.replicated.values():
            p.register_post_accumulate_grad_hook(self._average)
        self.gathered: list[torch.Tensor] | None = None  # the full weights, while needed

    # -- the collectives ---------------------------------------------------------------
    def all_gather(self, dtype=None) -> torch.Tensor:
        """Every rank's slice, in ``dtype`` (the compute dtype: bf16 halves the bytes)."""
        piece = self.layout.gather_input(list(self.shards), dtype or self.dtype)
        if self.world == 1:  # one process: nothing to gather
            return piece.clone()
        full = torch.empty(self.layout.chunk * self.world, dtype=piece.dtype, device=piece.device)
        compat.all_gather_single(full, piece, group=self.group)
        return full

    def reduce_scatter(self, full_grad: torch.Tensor) -> torch.Tensor:
        full_grad = full_grad.to(self.shards[0].dtype)  # reduce in the master's precision (fp32)
        if self.world == 1:
            return full_grad
        grad = torch.empty(self.layout.chunk, dtype=full_grad.dtype, device=full_grad.device)
        compat.reduce_scatter_single(grad, full_grad, group=self.group)  # the sum over the ranks
        return grad.div_(self.world)  # the mean over the ranks' micro-batches

    def _average(self, p: nn.Parameter) -> None:
        if self.world > 1:
            tdist.all_reduce(p.grad, group=self.group)
            p.grad.div_(self.world)

    # -- forward, and the hooks that bring the weights back in backward -------------------
    def forward(self, *args, **kwargs):
        params = {n: p.to(self.dtype) for n, p in self.replicated.items()}
        if self.names:
            full = GatherShards.apply(self, *self.shards)
            weights = self.layout.unshard(full)  # flat: views of full; per-parameter: copies
            del full  # per-parameter: the gathered buffer is freed once copied out
            params.update(zip(self.names, weights, strict=True))
            self.gathered = [w.detach() for w in weights]
        args, kwargs = _cast((args, kwargs), self.dtype)  # FSDP2 casts a unit's inputs too
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            out = functional_call(self.inner, params, args, kwargs)
        self.gathered = None  # after forward nothing keeps the full weights alive
        return out

    def _pack(self, t: torch.Tensor):
        """What autograd saves: a view of a gathered weight is saved as its place only."""
        ptr = t.untyped_storage().data_ptr()
        for i, w in enumerate(self.gathered or ()):
            if ptr == w.untyped_storage().data_ptr():
                return ("gathered", i, t.shape, t.stride(), t.storage_offset())
        return t

    def _unpack(self, saved):
        if not (isinstance(saved, tuple) and saved[0] == "gathered"):
            return saved
        if self.gathered is None:  # the first weight backward needs: all-gather again
            self.gathered = self.layout.unshard(self.all_gather())
        return self.gathered[saved[1]].as_strided(*saved[2:])


def _cast(tree, dtype):
    """Floating-point tensors in ``tree`` cast to ``dtype``."""
    from torch.utils._pytree import tree_map

    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return tree_map(cast, tree)


def shard_model(
    d, model: nn.Module, units, compute_dtype=None, group=None, layout="flat"
) -> nn.Module:
    """Replace each of ``units`` (disjoint submodules of ``model`` that hold every one of its
    parameters) by a ShardedUnit. ``d``: the Dist (rank and world size; ``group`` narrows
    them); ``compute_dtype``: torch.bfloat16 for mixed precision, None for the parameters'
    own dtype; ``layout``: "flat" (FSDP1) or "per-parameter" (FSDP2). Returns ``model``."""
    world = tdist.get_world_size(group) if group is not None else d.world_size
    rank = tdist.get_rank(group) if group is not None else d.rank
    names = {id(m): n for n, m in model.named_modules() if n}
    covered = {id(p) for u in units for p in u.parameters()}
    missing = [n for n, p in model.named_parameters() if id(p) not in covered]
    if any(id(u) not in names for u in units) or missing:
        raise ValueError("units must be submodules of the model (not the model itself) that hold "
                         f"all of its parameters; in no unit: {missing[:5]}")  # fmt: skip
    for unit in units:
        path, _, attr = names[id(unit)].rpartition(".")
        owner = model.get_submodule(path) if path else model
        setattr(owner, attr, ShardedUnit(unit, rank, world, compute_dtype, group, layout))
    return model


@torch.no_grad()
def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model (master precision) under its original names, on every rank."""
    out = {}
    for prefix, unit in model.named_modules():
        if not isinstance(unit, ShardedUnit):
            continue
        weights = dict(unit.replicated)
        if unit.names:
            full = unit.layout.unshard(unit.all_gather(unit.shards[0].dtype))
            weights.update(zip(unit.names, full, strict=True))
        out.update({f"{prefix}.{n}": t.detach().clone() for n, t in weights.items()})
    return out
