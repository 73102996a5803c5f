"""FSDP (ZeRO-3) from collectives, by hand: what ``fully_shard`` does, in a hundred lines.

Each *unit* (a module: a decoder block, the embedding, the output layer) flattens the
weights of its Linear and Embedding layers into one fp32 vector, pads it to a multiple of
the N ranks, and keeps only its 1/N slice: the **master shard**, the one parameter the
optimizer sees (a unit with no Linear or Embedding, a final norm say, has no shard at all:
its ``shard`` is None, so the optimizer never sees an empty parameter that no gradient reaches).
Norms stay whole on every rank (replicated). Around the unit:

    forward    all-gather every rank's shard, cast to the compute dtype (bf16)
               -> compute with views of the full vector -> drop it (freed)
    backward   all-gather again when autograd first needs a weight (a saved-tensor hook:
               a layer whose backward needs only its input, as an embedding's, is not
               gathered again) -> the full vector's gradient -> reduce-scatter it in fp32:
               each rank gets the mean of its own slice -> drop the gathered weights
    replicated (norms) cast to the compute dtype in forward; their fp32 gradients are
               all-reduced (averaged), as DDP would

    units = [model.tok_embeddings, *model.layers.values(), model.norm, model.output]
    model = shard_model(d, model, units, compute_dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=...)  # fp32 shards + replicated norms
    loss_fn(model(tokens)).backward()
    opt.step()
    full = full_state_dict(model)     # every rank: the whole model, by its original names

What a rank holds between steps: 4 + 4 + 8 bytes (fp32 shard, its gradient, Adam) per
parameter / N, like FSDP2, plus the norms whole. While a unit computes: its full weights in
the compute dtype and their gradient (the estimator's ``gathered`` part), and for the
reduce-scatter an fp32 copy of that gradient.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as tdist
from torch import nn
from torch.func import functional_call

from helpers import compat

__all__ = ["SHARDED_TYPES", "GatherShards", "ShardedUnit", "shard_model", "full_state_dict"]

SHARDED_TYPES = (nn.Linear, nn.Embedding)  # their weights are sharded; everything else replicated


class GatherShards(torch.autograd.Function):
    """forward: all-gather the shards into the full vector (compute dtype);
    backward: reduce-scatter its gradient (fp32) so each rank gets the mean of its slice."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, unit: ShardedUnit) -> torch.Tensor:
        ctx.unit = unit
        return unit.all_gather()

    @staticmethod
    def backward(ctx, full_grad: torch.Tensor):
        unit = ctx.unit
        unit.gathered = None  # the unit's backward is done: free the weights gathered again
        return unit.reduce_scatter(full_grad), None


class ShardedUnit(nn.Module):
    """One FSDP unit: ``inner``'s Linear and Embedding weights as one flat fp32 shard."""

    def __init__(self, inner: nn.Module, rank: int, world: int, compute_dtype=None, group=None):
        super().__init__()
        self.inner, self.world, self.group = inner, world, group
        owned = [(f"{name}.{k}".lstrip("."), p) for name, m in inner.named_modules()
                 if isinstance(m, SHARDED_TYPES) for k, p in m.named_parameters(recurse=False)]  # fmt: skip
        self.names = [name for name, _ in owned]
        self.shapes = [p.shape for _, p in owned]
        self.numels = [p.numel() for _, p in owned]
        self.chunk = math.ceil(sum(self.numels) / world)  # every rank's slice has this length
        # the master shard keeps the parameters' own dtype (fp32; float64 in the exact tests)
        self.shard: nn.Parameter | None = None  # a unit of norms only has nothing to shard
        if owned:
            flat = torch.cat([p.detach().reshape(-1) for _, p in owned])
            flat = nn.functional.pad(flat, (0, self.chunk * world - flat.numel()))  # equal slices
            self.shard = nn.Parameter(flat[rank * self.chunk : (rank + 1) * self.chunk].clone())
        dtypes = [p.dtype for p in inner.parameters()]
        self.dtype = compute_dtype or (
            owned[0][1].dtype if owned else dtypes[0] if dtypes else torch.float32
        )
        for name in self.names:  # the unit keeps no full copy: forward supplies it
            path, _, attr = name.rpartition(".")
            del inner.get_submodule(path)._parameters[attr]
        self.replicated = dict(inner.named_parameters())  # what is left: norms
        for p in self.replicated.values():
            p.register_post_accumulate_grad_hook(self._average)
        self.gathered: torch.Tensor | None = None  # the full vector, while it is needed

    # -- the collectives ---------------------------------------------------------------
    def all_gather(self) -> torch.Tensor:
        piece = self.shard.detach().to(self.dtype)  # bf16: half the bytes on the wire
        if self.world == 1:  # one process: nothing to gather
            return piece.clone()
        full = torch.empty(self.chunk * self.world, dtype=self.dtype, device=piece.device)
        compat.all_gather_single(full, piece, group=self.group)
        return full

    def reduce_scatter(self, full_grad: torch.Tensor) -> torch.Tensor:
        full_grad = full_grad.to(self.shard.dtype)  # reduce in the master's precision (fp32)
        if self.world == 1:
            return full_grad
        grad = torch.empty_like(self.shard)
        compat.reduce_scatter_single(grad, full_grad, group=self.group)  # the sum over the ranks
        return grad.div_(self.world)  # the mean over the ranks' micro-batches

    def _average(self, p: nn.Parameter) -> None:
        if self.world > 1:
            tdist.all_reduce(p.grad, group=self.group)
            p.grad.div_(self.world)

    # -- forward, and the hooks that bring the weights back in backward -------------------
    def weights(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of the full vector, shaped and named as the inner module's weights."""
        pieces = full[: sum(self.numels)].split(self.numels)
        return {n: t.view(s) for n, t, s in zip(self.names, pieces, self.shapes, strict=True)}

    def forward(self, *args, **kwargs):
        params = {n: p.to(self.dtype) for n, p in self.replicated.items()}
        if self.names:
            full = GatherShards.apply(self.shard, self)
            params.update(self.weights(full))
            self.gathered = full.detach()
        args, kwargs = _cast((args, kwargs), self.dtype)  # FSDP2 casts a unit's inputs too
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            out = functional_call(self.inner, params, args, kwargs)
        self.gathered = None  # after forward nothing keeps the full weights alive
        return out

    def _pack(self, t: torch.Tensor):
        """What autograd saves: a view of the gathered weights is saved as its place only."""
        g = self.gathered
        if g is not None and t.untyped_storage().data_ptr() == g.untyped_storage().data_ptr():
            return ("gathered", t.shape, t.stride(), t.storage_offset())
        return t

    def _unpack(self, saved):
        if not (isinstance(saved, tuple) and saved[0] == "gathered"):
            return saved
        if self.gathered is None:  # the first weight backward needs: all-gather again
            self.gathered = self.all_gather()
        return self.gathered.as_strided(*saved[1:])


def _cast(tree, dtype):
    """Floating-point tensors in ``tree`` cast to ``dtype``."""
    from torch.utils._pytree import tree_map

    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return tree_map(cast, tree)


def shard_model(d, model: nn.Module, units, compute_dtype=None, group=None) -> nn.Module:
    """Replace each of ``units`` (disjoint submodules of ``model`` that hold every one of its
    parameters) by a ShardedUnit. ``d``: the Dist (rank and world size; ``group`` narrows
    them); ``compute_dtype``: torch.bfloat16 for mixed precision, None for the parameters'
    own dtype. Returns ``model``."""
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
        setattr(owner, attr, ShardedUnit(unit, rank, world, compute_dtype, group))
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
            full = unit.shard.detach().clone()
            if unit.world > 1:
                full = torch.empty(unit.chunk * unit.world, dtype=full.dtype, device=full.device)
                compat.all_gather_single(full, unit.shard.detach(), group=unit.group)
            weights.update(unit.weights(full))
        out.update({f"{prefix}.{n}": t.detach().clone() for n, t in weights.items()})
    return out
