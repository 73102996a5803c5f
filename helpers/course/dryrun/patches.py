"""What a fake rank changes in torch while it runs, and why.

Each patch keeps a program going where a rank alone, on tensors without values, cannot do
what a real rank does: attention as CUDA runs it, tensors made on the host then moved,
worker processes (whose fetch still may not touch the device), object collectives, checkpoints, the shape check DDP makes across ranks.
``patch_for_fake_run`` applies them and returns what to put back.
"""

from __future__ import annotations

import contextlib

import torch
from torch._subclasses.fake_tensor import FakeTensor

from helpers.standin.cuda_rules import forked_worker

__all__ = ["patch_for_fake_run", "ORIGINAL_SWAP"]


def _gpu_attention(original):
    """F.scaled_dot_product_attention, choosing CUDA's fused kernels for fake GPU tensors."""

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if (
            not (isinstance(q, FakeTensor) and q.device.type != "cpu")
            or attn_mask is not None
            or kw
        ):
            return original(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)
        if q.dtype in (torch.float16, torch.bfloat16):
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, scale=scale)[0]  # fmt: skip
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, dropout_p, is_causal, scale=scale)[0]  # fmt: skip

    return attention


ORIGINAL_SWAP = torch.utils.swap_tensors


def _alone_patches(tdist) -> list:
    """A rank alone: objects "gathered" are its own, and nothing is saved or loaded.

    Object collectives pickle into byte tensors that fake mode cannot fill; checkpoints of
    fake tensors have no values to write, and a real checkpoint cannot load into them.
    """
    import torch.distributed.checkpoint as dcp

    from helpers.parallel.sharded import checkpoint

    def all_gather_object(out, obj, group=None):
        out[:] = [obj] * len(out)

    def gather_object(obj, object_gather_list=None, dst=None, group=None, **_):
        if object_gather_list is not None:
            object_gather_list[:] = [obj] * len(object_gather_list)

    def scatter_object_list(out, scatter_list=None, src=None, group=None, **_):
        out[0] = scatter_list[tdist.get_rank(group)] if scatter_list else out[0]

    def skip(*args, **kwargs):
        return None

    return [(tdist, "all_gather_object", all_gather_object),
            (tdist, "gather_object", gather_object), (tdist, "scatter_object_list", scatter_object_list),
            (tdist, "broadcast_object_list", skip), (dcp, "save", skip), (dcp, "load", skip),
            (torch, "save", skip), (torch, "set_rng_state", skip),
            (checkpoint, "set_rng_state", skip)]  # generators saved under fake mode hold no values  # fmt: skip


def patch_for_fake_run(swap_tensors) -> list:
    """What a fake run changes in torch while it runs; returns (owner, name, old value)."""
    import torch.distributed as tdist
    import torch.utils.data as tud
    from torch._subclasses.fake_tensor import is_fake

    tensor, loader_init, to_numpy = torch.tensor, tud.DataLoader.__init__, torch.Tensor.numpy
    get_iter, single = tud.DataLoader._get_iterator, tud.dataloader._SingleProcessDataLoaderIter

    def numpy(self, *, force=False):  # a fake tensor has no values: zeros of its shape and type
        if not is_fake(self):
            return to_numpy(self, force=force)
        import numpy as np

        # numpy's name for the dtype (torch.float32 -> float32; bfloat16 fails, as .numpy() does),
        # named rather than made from a tensor, which fake mode would fake again
        return np.zeros(tuple(self.shape), dtype=np.dtype(str(self.dtype).removeprefix("torch.")))

    def tensor_on_device(data, *args, device=None, **kwargs):  # via the host: fake on the device
        out = tensor(data, *args, **kwargs)
        return out if device is None or torch.device(device).type == "cpu" else out.to(device)

    def loader(self, *args, **kwargs):  # fake batches cannot cross to worker processes
        workers = args[5] if len(args) > 5 else kwargs.get("num_workers", 0)
        if len(args) > 5:  # num_workers given in its place: DataLoader(ds, 8, True, None, None, 2)
            args = (*args[:5], 0, *args[6:])
        else:
            kwargs["num_workers"] = 0
        kwargs["pin_memory"] = False
        kwargs.pop("prefetch_factor", None), kwargs.pop("persistent_workers", None)
        loader_init(self, *args, **kwargs)
        self.forked_workers = workers  # fetched as a worker fetches: no device (cuda_rules)

    def next_data(it):  # a loader asked for workers: its fetch runs as in a forked worker
        index = it._next_index()
        with forked_worker() if getattr(it, "forked", False) else contextlib.nullcontext():
            return it._dataset_fetcher.fetch(index)

    def get_iterator(self):
        it = get_iter(self)
        it.forked = bool(getattr(self, "forked_workers", 0))
        return it

    patches = [(torch.utils, "swap_tensors", swap_tensors), (torch, "tensor", tensor_on_device),
               (torch.Tensor, "numpy", numpy),
               (tud.DataLoader, "__init__", loader), (tud.DataLoader, "_get_iterator", get_iterator),
               (single, "_next_data", next_data), *_alone_patches(tdist),
               # DDP compares every rank's parameter shapes by reading gathered bytes, which a
               # rank alone cannot fake; the device-strict run checks it on real ranks
               (tdist, "_verify_params_across_processes", lambda *a, **k: None),
               (torch.nn.functional, "scaled_dot_product_attention",
                _gpu_attention(torch.nn.functional.scaled_dot_product_attention))]  # fmt: skip
    old = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    return old
