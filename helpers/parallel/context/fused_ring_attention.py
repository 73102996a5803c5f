"""Ring attention on torch's fused attention kernels: the ring of notebook 09, GPU-worthy.

Notebook 09 teaches the ring with attention written out (``q k^T``, a softmax, times ``v``:
helpers.parallel.context.ring_attention), which materialises each block's [L_q, L_k] score matrix
in memory and runs a handful of separate kernels. This module keeps the same ring (K/V
blocks to the right-hand neighbour for N - 1 steps, partial results merged with their
log-sum-exp by ``online_softmax.merge``) and computes each block with the fused kernel
that ``F.scaled_dot_product_attention`` itself would run, asking it for its log-sum-exp:

    device, dtype            forward kernel (returns out and lse)                 backward kernel
    CPU, any float           aten._scaled_dot_product_flash_attention_for_cpu     ..._for_cpu_backward
    GPU, bf16 / fp16         aten._scaled_dot_product_flash_attention (FA2)       ..._flash_attention_backward
    GPU, fp32                aten._scaled_dot_product_efficient_attention         ..._efficient_attention_backward
                             (compute_log_sumexp=True; its lse is padded to 32 rows)

(chosen by helpers.devices.is_gpu and the dtype: ``block_kernel``; the dry run's stand-in GPU,
which has no CUDA kernels, gets the CPU one). The lse these kernels
return has no derivative in torch's autograd formulas, so the ring is a
``torch.autograd.Function`` whose backward is a ring too, as in torch's own ring
(torch.distributed.tensor.experimental) and zhuzilin/ring-flash-attention: given the GLOBAL
output and GLOBAL lse, a fused backward call on one block returns exactly that block's share
of dq, dk and dv (it recomputes P = exp(S - lse) with the final lse). dq stays home; dK/dV of
a block travel round the ring with it, each rank adding its share, and reach the block's
owner after N steps.

Causal masking, from the global positions (positions sorted, ranks' shares disjoint):

    the rank's own block        one call with is_causal=True: local order is global order,
                                so the kernel's triangle over the local indices is exactly
                                the causal mask, whatever chunks the share is made of;
    another rank's block        no key equals a query's position, so a query at position i
                                sees the block's keys before i: a PREFIX of the (sorted)
                                block. Consecutive queries that see the same prefix form one
                                full (not causal) call on q[rows] x k[:prefix]; rows that see
                                no key are skipped.

For the load-balanced layout (rank r holds chunks r and 2N-1-r, context_layout) that gives,
at each step after the first, ONE call: a block from a lower rank (chunks s < r and
2N-1-s > 2N-1-r) is seen, its first chunk only, by both of the rank's chunks (full queries x
first half of the keys); a block from a higher rank is seen whole by the rank's second chunk
only (second half of the queries x all keys). torch's ring makes the same two cases.

    fused_ring_attention(q, k, v, positions, causal=False, group=None)   this rank's output
        (differentiable: forward and backward are rings)
    torch_ring_attention(q, k, v, causal, rotate, group=None)   torch's own ring for the same
        kernel, to compare ring with ring (see its docstring)
"""

from __future__ import annotations

import functools
import inspect
import math

import torch
import torch.distributed as tdist

from helpers import devices
from helpers.parallel.context.online_softmax import merge
from helpers.parallel.context.ring_attention import exchange, ring_peers

__all__ = [
    "BlockKernel",
    "FusedRingAttention",
    "block_kernel",
    "fused_ring_attention",
    "segments",
    "torch_ring_attention",
]

aten = torch.ops.aten
_LOW_PRECISION = (torch.bfloat16, torch.float16)


class BlockKernel:
    """One fused attention kernel with its backward: ``forward`` -> (out, lse [..., Lq])."""

    def __init__(self, name: str, scale: float):
        self.name, self.scale = name, scale

    def forward(self, q, k, v, causal: bool):
        if self.name == "cpu_flash":
            return aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, causal, scale=self.scale
            )
        if self.name == "flash":
            out, lse, *_ = aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, causal, False, scale=self.scale
            )
            return out, lse
        out, lse, *_ = aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, causal, scale=self.scale
        )
        return out, lse[..., : q.shape[-2]]  # its lse has ceil(Lq / 32) * 32 rows

    def backward(self, dout, q, k, v, out, lse, causal: bool):
        """(dq, dk, dv) of this block, given the GLOBAL out and lse of these query rows."""
        if self.name == "cpu_flash":
            return aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out, lse, 0.0, causal, scale=self.scale
            )
        seed = torch.zeros((2,), dtype=torch.int64, device=q.device)  # no dropout: unused
        offset = torch.zeros((), dtype=torch.int64, device=q.device)
        if self.name == "flash":
            return aten._scaled_dot_product_flash_attention_backward(
                dout, q, k, v, out, lse, None, None, q.shape[-2], k.shape[-2], 0.0, causal,
                seed, offset, scale=self.scale,
            )  # fmt: skip
        rows = 32 * math.ceil(q.shape[-2] / 32)
        padded = lse.new_zeros((*lse.shape[:-1], rows))
        padded[..., : q.shape[-2]] = lse
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            dout, q, k, v, None, out, padded, seed, offset, 0.0, [True, True, True, False],
            causal, scale=self.scale,
        )  # fmt: skip
        return dq, dk, dv


def block_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> BlockKernel:
    """The fused kernel for this device and dtype (see the module docstring).

    A device that is a GPU to helpers.devices but has no CUDA kernels (the stand-in GPU of the
    dry run's strict check, whose tensors compute on the CPU) gets the CPU kernel.
    """
    scale = head_dim**-0.5
    if not devices.is_gpu(device):
        return BlockKernel("cpu_flash", scale)
    gpu = BlockKernel("flash" if dtype in _LOW_PRECISION else "efficient", scale)
    return gpu if _has_kernel(gpu.name, device, dtype) else BlockKernel("cpu_flash", scale)


@functools.cache
def _has_kernel(name: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the device runs this kernel (one call on a tiny block, once per process)."""
    q = torch.zeros((1, 1, 8, 8), dtype=dtype, device=device)
    try:
        BlockKernel(name, 1.0).forward(q, q, q, False)
    except NotImplementedError:  # "Could not run ... with arguments from the 'CPU' backend"
        return False
    return True


def segments(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, own: bool) -> list:
    """(query slice, keys seen: a prefix length, is_causal) for each kernel call on one block.

    own: the block is this rank's own (q_pos is k_pos). See the module docstring.
    """
    if not causal or own:
        return [(slice(None), len(k_pos), causal)]
    seen = torch.searchsorted(k_pos.contiguous(), q_pos.contiguous()).tolist()  # keys before
    out, start = [], 0
    for i in range(1, len(seen) + 1):
        if i == len(seen) or seen[i] != seen[start]:
            if seen[start] > 0:
                out.append((slice(start, i), seen[start], False))
            start = i
    return out


def _forward(kernel, q, k, v, positions, causal, group):
    rank, n, right, left = ring_peers(group)
    acc = torch.float32 if q.dtype in _LOW_PRECISION else q.dtype
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
    kv = torch.stack([k, v])
    for step in range(n):
        src = (rank - step) % n
        reqs, nxt = [], None
        if step < n - 1:  # the next block in flight while this one is computed
            nxt = kv.new_empty((*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1]))
            reqs = exchange(kv, nxt, right, left, group)
        for rows, seen, is_causal in segments(positions[rank], positions[src], causal, src == rank):
            o, s = kernel.forward(q[..., rows, :], kv[0][..., :seen, :], kv[1][..., :seen, :],
                                  is_causal)  # fmt: skip
            out[..., rows, :], lse[..., rows] = merge(out[..., rows, :], lse[..., rows],
                                                      o.to(acc), s.to(acc))  # fmt: skip
        for req in reqs:
            req.wait()
        kv = nxt if nxt is not None else kv
    return out.to(q.dtype), lse


def _backward(kernel, q, k, v, out, lse, dout, positions, causal, group):
    rank, n, right, left = ring_peers(group)
    acc = torch.float32 if q.dtype in _LOW_PRECISION else q.dtype
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = torch.stack([k, v])
    dkv = torch.zeros(kv.shape, dtype=acc, device=q.device)  # travels with its block
    lse = lse.to(torch.float32) if acc != q.dtype else lse
    for step in range(n):
        src = (rank - step) % n
        reqs, nxt = [], None
        if step < n - 1:
            nxt = kv.new_empty((*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1]))
            reqs = exchange(kv, nxt, right, left, group)
        for rows, seen, is_causal in segments(positions[rank], positions[src], causal, src == rank):
            grads = kernel.backward(
                dout[..., rows, :], q[..., rows, :], kv[0][..., :seen, :], kv[1][..., :seen, :],
                out[..., rows, :], lse[..., rows].contiguous(), is_causal,
            )  # fmt: skip
            dq[..., rows, :] += grads[0]
            dkv[0][..., :seen, :] += grads[1]
            dkv[1][..., :seen, :] += grads[2]
        incoming = dkv.new_empty((*dkv.shape[:-2], len(positions[(src - 1) % n]), dkv.shape[-1]))
        for req in [*reqs, *exchange(dkv, incoming, right, left, group)]:
            req.wait()
        kv, dkv = (nxt if nxt is not None else kv), incoming
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class FusedRingAttention(torch.autograd.Function):
    """``FusedRingAttention.apply(q, k, v, positions, causal, group)``: forward and backward rings."""

    @staticmethod
    def forward(ctx, q, k, v, positions, causal=False, group=None):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        kernel = block_kernel(q.device, q.dtype, q.shape[-1])
        out, lse = _forward(kernel, q, k, v, positions, causal, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kernel, ctx.positions, ctx.causal, ctx.group = kernel, positions, causal, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _backward(ctx.kernel, q, k, v, out, lse, dout.contiguous(), ctx.positions,
                          ctx.causal, ctx.group)  # fmt: skip
        return *grads, None, None, None


def fused_ring_attention(q, k, v, positions, causal=False, group=None) -> torch.Tensor:
    """This rank's attention output over the whole sequence, each block by a fused kernel.

    q, k, v: [B, H, L_r, D] on this rank's device; positions: every rank's sorted global
    positions (context_layout). Differentiable; forward only under ``torch.no_grad()``.
    """
    if tdist.get_world_size(group) != len(positions):
        raise ValueError(f"{len(positions)} shares of positions for "
                         f"{tdist.get_world_size(group)} ranks")  # fmt: skip
    return FusedRingAttention.apply(q, k, v, positions, causal, group)


def torch_ring_attention(q, k, v, causal: bool, rotate: str, group=None) -> torch.Tensor:
    """torch's ring (forward): the function ``context_parallel`` runs for its CUDA kernels,
    ``_templated_ring_attention``, given this device's kernel (``block_kernel``).

    rotate: "alltoall" (torch's ring: K/V passed on at each step) or "allgather" (its default:
    every block gathered at once). Causal runs use torch's load balancing, whose layout is
    context_layout.balanced_positions when N divides the sequence into 2N equal chunks.
    On a GPU use ``context_parallel`` itself; this is for CPU ranks, where context_parallel
    has no version of the CPU kernel (notebook 09, section 9). Private API: torch 2.6 passes
    a mesh where 2.14 passes a process group.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.experimental import _attention as cp

    cp.set_rotate_method(rotate)
    cp._cp_options.enable_load_balance = causal
    group = group or tdist.group.WORLD
    where = group
    if "mesh" in inspect.signature(cp._templated_ring_attention).parameters:
        ranks = tdist.get_process_group_ranks(group)
        where = DeviceMesh.from_group(group, q.device.type, mesh=ranks)
    kernel = block_kernel(q.device, q.dtype, q.shape[-1])
    ops = {"cpu_flash": aten._scaled_dot_product_flash_attention_for_cpu,
           "flash": aten._scaled_dot_product_flash_attention,
           "efficient": aten._scaled_dot_product_efficient_attention}  # fmt: skip
    extra = {"compute_log_sumexp": True, "attn_bias": None} if kernel.name == "efficient" else {}
    return cp._templated_ring_attention(where, 2, ops[kernel.name], q, k, v, is_causal=causal,
                                        **extra)[0]  # fmt: skip
