"""Context parallelism by hand equals plain softmax attention on one process (fp32, 1e-5).

The log-sum-exp merge (in one process), the layouts (contiguous and load-balanced), and on
2 and 4 gloo ranks: all-gather-K/V attention and ring attention, causal and not, even and
uneven sequence lengths, odd shapes, forward and backward (each rank's dQ, dK, dV equal the
serial gradients of its own tokens), for the plain ring, the all-gather and the ring on
torch's fused kernels (helpers.parallel.context.fused_ring_attention, which also gets a striped
layout). The ring's messages go only to the right-hand neighbour, N - 1 of them, each the
K/V block of the rank it came from, each step's send and receive posted as one
batch_isend_irecv (NCCL's pairing with 2 ranks). Lab 7's checks see what a batched ring's
messages carry, catch a decoy that sends zeros, predict a tampered ring's output, and run a
ring on the stand-in GPU, where a log-sum-exp left on the host fails as on CUDA. (What
torch's own context_parallel does on CPU ranks is asserted in notebook 09.)
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist
import torch.nn.functional as F

from helpers import launch
from helpers.parallel.context import allgather_attention as AG
from helpers.parallel.context import context_layout as L
from helpers.parallel.context import fused_ring_attention as FR
from helpers.parallel.context import online_softmax as OS
from helpers.parallel.context import ring_attention as RA
from helpers.training.peak_memory import PeakMemory

TOL = {"rtol": 1e-5, "atol": 1e-5}
WORLDS = [2, 4]


def _qkv(seed: int, shape):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(3)]


def _serial(q, k, v, causal, upstream):
    """Serial output and dQ, dK, dV for loss = sum(out * upstream)."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    s = q.shape[-2]
    mask = OS.causal_mask(torch.arange(s), torch.arange(s)) if causal else None
    out = OS.attention(q, k, v, mask)
    (out * upstream).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


# --------------------------------------------------------------------------- one process


@pytest.mark.parametrize("causal", [False, True])
def test_serial_twin_is_torch_sdpa(causal):
    q, k, v = _qkv(0, (2, 3, 11, 5))
    mask = OS.causal_mask(torch.arange(11), torch.arange(11)) if causal else None
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(OS.attention(q, k, v, mask), want, **TOL)


def test_merge_of_blocks_equals_attention_over_all_keys():
    q, k, v = _qkv(1, (2, 2, 7, 4))
    k, v = k.repeat(1, 1, 2, 1)[..., :13, :], v.repeat(1, 1, 2, 1)[..., :13, :]
    mask = OS.causal_mask(torch.arange(6, 13), torch.arange(13))  # queries at 6..12
    want = OS.attention(q, k, v, mask)
    for cuts in ([4], [1, 9], [3, 6, 12]):
        edges = [0, *cuts, 13]
        blocks = [(a, b) for a, b in zip(edges, edges[1:], strict=False)]
        for order in (blocks, blocks[::-1]):  # the merge does not care about the order
            out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"))
            for a, b in order:
                o, s = OS.block_attention(q, k[..., a:b, :], v[..., a:b, :], mask[:, a:b])
                out, lse = OS.merge(out, lse, o, s)
            torch.testing.assert_close(out, want, **TOL)
            s_full = (q @ k.transpose(-1, -2) / 2).masked_fill(~mask, float("-inf"))
            torch.testing.assert_close(lse, torch.logsumexp(s_full, -1), **TOL)


def test_block_attention_fully_masked_rows_and_huge_scores():
    q, k, v = _qkv(2, (1, 1, 4, 3))
    mask = torch.tensor([[False] * 5, [True] * 5, [False] * 5, [True, False, False, False, False]])
    out, lse = OS.block_attention(
        q, k.repeat(1, 1, 2, 1)[..., :5, :], v.repeat(1, 1, 2, 1)[..., :5, :], mask
    )
    assert torch.isfinite(out).all() and out[..., 0, :].abs().max() == 0
    assert lse[..., 0].item() == float("-inf") and torch.isfinite(lse[..., 1]).all()
    big_q = q * 1000  # scores in the thousands: exp overflows float32 without the max
    o_big, s_big = OS.block_attention(big_q, k, v)
    torch.testing.assert_close(o_big, OS.attention(big_q, k, v), **TOL)
    # merging two blocks whose log-sum-exps are far apart (1e4) stays finite
    o, s = OS.merge(o_big, s_big, torch.zeros_like(o_big), s_big - 1e4)
    torch.testing.assert_close(o, o_big, **TOL)


@pytest.mark.parametrize(("seq", "world"), [(16, 2), (13, 4), (40, 4), (9, 3)])
def test_layouts_cover_the_sequence_and_balance_causal_work(seq, world):
    for layout in (L.contiguous_positions, L.balanced_positions):
        pos = layout(seq, world)
        assert torch.equal(torch.cat(pos).sort().values, torch.arange(seq))
        assert max(len(p) for p in pos) - min(len(p) for p in pos) <= (
            1 if layout is L.contiguous_positions else 2
        )
        x = torch.randn(2, seq, 3)
        torch.testing.assert_close(L.unshard([L.shard(x, p) for p in pos], pos), x)
        # the sub-blocks a rank computes hold every causal pair once, and no future pair
        for p in pos:
            need = sum(L.computed_pairs(p, src, False) for src in pos)
            assert need == len(p) * seq
            kept = 0
            for src in pos:
                for qs, ks, mask in L.sub_blocks(p, src, True):
                    allowed = p[qs][:, None] >= src[ks][None, :]
                    assert allowed.any(dim=1).any()
                    kept += int(allowed.sum()) if mask is None else int(mask.sum())
                    if mask is None:
                        assert allowed.all()
            assert kept == int((p + 1).sum())
    work = L.causal_pairs(L.balanced_positions(seq, world))
    contiguous = L.causal_pairs(L.contiguous_positions(seq, world))
    if seq % (2 * world) == 0:
        assert len(set(work)) == 1  # exactly balanced
    assert max(work) / min(work) < max(contiguous) / min(contiguous)


def test_layout_errors_say_what_to_change():
    with pytest.raises(ValueError, match="at least 8 tokens"):
        L.balanced_positions(7, 4)
    with pytest.raises(ValueError, match=">= 1"):
        L.contiguous_positions(4, 0)


def test_peak_memory_counts_live_tensors():
    with PeakMemory() as mem:
        a = torch.empty(1000)
        b = torch.empty(2000)
        del a
        c = torch.empty(500)
    assert mem.peak == 12_000 and b.numel() + c.numel() == 2500
    q = torch.randn(1, 1, 128, 8)
    with PeakMemory() as mem:
        OS.attention(q, q, q)
    assert mem.peak >= 2 * 128 * 128 * 4  # the scores and their softmax, alive together


# --------------------------------------------------------------------------- on ranks

CASES = [  # (shape [B, H, S, D], causal, layout)
    ((2, 3, 16, 8), False, "contiguous"),
    ((1, 2, 13, 5), False, "contiguous"),  # uneven: 13 tokens on 2 or 4 ranks
    ((2, 1, 16, 4), True, "contiguous"),
    ((1, 3, 13, 5), True, "contiguous"),
    ((1, 2, 16, 8), True, "balanced"),
    ((2, 2, 19, 3), True, "balanced"),  # uneven chunks of a load-balanced layout
    ((1, 2, 11, 4), True, "striped"),
]


def _layout(name: str, seq: int, world: int) -> list[torch.Tensor]:
    if name == "striped":  # every world-th token: runs of one token, not contiguous
        return [torch.arange(r, seq, world) for r in range(world)]
    return getattr(L, f"{name}_positions")(seq, world)


def _parallel_rank(d, cases, how):
    results = []
    for i, (shape, causal, layout) in enumerate(cases):
        q, k, v = _qkv(10 + i, shape)
        up = _qkv(100 + i, shape)[0]
        pos = _layout(layout, shape[-2], d.world_size)
        mine = [L.shard(t, pos[d.rank]).clone().requires_grad_() for t in (q, k, v)]
        if how == "ring":
            out = RA.RingAttention.apply(*mine, pos, causal)
            forward_only = RA.ring_attention(
                d, *(t.detach() for t in mine), pos, causal, overlap=False
            )
        elif how == "fused":
            out = FR.fused_ring_attention(*mine, pos, causal)
            with torch.no_grad():
                forward_only = FR.fused_ring_attention(*(t.detach() for t in mine), pos, causal)
        else:
            out = AG.allgather_attention(*mine, pos, causal)
            forward_only = out.detach()
        (out * L.shard(up, pos[d.rank])).sum().backward()
        results.append((out.detach(), forward_only, *(t.grad for t in mine)))
    return results


@pytest.mark.parametrize("how", ["ring", "allgather", "fused"])
@pytest.mark.parametrize("world", WORLDS)
def test_context_parallel_equals_serial_forward_and_backward(world, how):
    per_rank = launch.spawn(_parallel_rank, world, (CASES, how))
    for i, (shape, causal, layout) in enumerate(CASES):
        q, k, v = _qkv(10 + i, shape)
        up = _qkv(100 + i, shape)[0]
        want = _serial(q, k, v, causal, up)
        pos = _layout(layout, shape[-2], world)
        for rank, results in enumerate(per_rank):
            out, fwd, dq, dk, dv = results[i]
            where = f"{how}, case {i} {shape} causal={causal} {layout}, rank {rank} of {world}"
            pairs = ((out, want[0], "out"), (fwd, want[0], "out (no overlap)"),
                     (dq, want[1], "dQ"), (dk, want[2], "dK"), (dv, want[3], "dV"))  # fmt: skip
            for got, full, name in pairs:
                what = f"{where}: {name}"
                torch.testing.assert_close(
                    got, L.shard(full, pos[rank]), **TOL, msg=lambda m, w=what: f"{w}: {m}"
                )


def _ring_traffic(d, shape):
    from helpers.course.grading.recorder.traffic import record_traffic

    q, k, v = _qkv(3, shape)
    pos = L.contiguous_positions(shape[-2], d.world_size)
    mine = [L.shard(t, pos[d.rank]) for t in (q, k, v)]
    timeline = []
    with record_traffic(exercise="ring attention") as traffic:
        RA.ring_attention(d, *mine, pos, causal=True, timeline=timeline)
    return [(m.op, m.peer, m.numel) for m in traffic.messages], timeline


@pytest.mark.parametrize("world", WORLDS)
def test_ring_sends_each_block_once_to_the_right(world):
    shape = (1, 2, 4 * world + 1, 3)  # uneven: rank 0 holds one token more
    pos = L.contiguous_positions(shape[-2], world)
    for rank, (messages, timeline) in enumerate(launch.spawn(_ring_traffic, world, (shape,))):
        sent = [(peer, n) for op, peer, n in messages if op == "isend"]
        received = [(peer, n) for op, peer, n in messages if op == "irecv"]
        blocks = [(rank - s) % world for s in range(world - 1)]  # whose K/V goes at step s
        assert sent == [((rank + 1) % world, 2 * 2 * len(pos[b]) * 3) for b in blocks], sent
        assert received == [
            ((rank - 1) % world, 2 * 2 * len(pos[(b - 1) % world]) * 3) for b in blocks
        ]
        assert [t["step"] for t in timeline] == list(range(world))
        assert all(
            t["post"] <= t["compute"][0] <= t["compute"][1] <= t["arrived"] for t in timeline
        )


def _count_batches(d, shape):
    """Run the plain ring forward and backward, and the fused one, counting p2p batches."""
    original, batches = tdist.batch_isend_irecv, []

    def counting(ops):
        batches.append(sorted(op.op.__name__ for op in ops))
        return original(ops)

    q, k, v = _qkv(5, shape)
    pos = L.balanced_positions(shape[-2], d.world_size)
    mine = [L.shard(t, pos[d.rank]).clone().requires_grad_() for t in (q, k, v)]
    tdist.batch_isend_irecv = counting
    try:
        counts = []
        for ring in (lambda: RA.RingAttention.apply(*mine, pos, True),
                     lambda: FR.fused_ring_attention(*mine, pos, True)):  # fmt: skip
            batches.clear()
            ring().sum().backward()
            counts.append(list(batches))
    finally:
        tdist.batch_isend_irecv = original
    return counts


def test_ring_steps_post_send_and_receive_as_one_batch():
    """With 2 ranks right == left: NCCL wants each step's isend/irecv pair batched."""
    for counts in launch.spawn(_count_batches, 2, ((1, 2, 8, 4),)):
        for batches in counts:  # forward: N - 1 = 1 K/V step; backward: 1 K/V + N = 2 dK/dV
            assert batches == [["irecv", "isend"]] * 4, batches


def test_fused_ring_segments_of_the_balanced_layout():
    """Per step one kernel call: own block causal; a lower rank's block its first chunk for
    every query; a higher rank's block whole, for the second chunk's queries only."""
    pos = L.balanced_positions(32, 4)  # chunks of 4: rank 1 holds 4-7 and 24-27
    assert FR.segments(pos[1], pos[1], True, own=True) == [(slice(None), 8, True)]
    assert FR.segments(pos[1], pos[0], True, own=False) == [(slice(0, 8), 4, False)]
    assert FR.segments(pos[1], pos[2], True, own=False) == [(slice(4, 8), 8, False)]
    assert FR.segments(pos[1], pos[2], False, own=False) == [(slice(None), 8, False)]


def test_fused_ring_picks_its_kernel_by_device_and_dtype(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)  # a name: no GPU is needed
    assert FR.block_kernel(cpu, torch.bfloat16, 64).name == "cpu_flash"
    monkeypatch.setattr(FR, "_has_kernel", lambda *_: True)  # as on a real GPU
    assert FR.block_kernel(gpu, torch.bfloat16, 64).name == "flash"
    assert FR.block_kernel(gpu, torch.float32, 64).name == "efficient"
    assert FR.block_kernel(gpu, torch.float16, 64).scale == 64**-0.5


def _fused_on_device(d, q, k, v, up, causal):
    import warnings

    warnings.filterwarnings("ignore", message=".*barrier.*")
    pos = L.balanced_positions(q.shape[-2], d.world_size)
    mine = [L.shard(t, pos[d.rank]).to(d.device).requires_grad_() for t in (q, k, v)]
    out = FR.fused_ring_attention(*mine, pos, causal)
    (out * L.shard(up, pos[d.rank]).to(d.device)).sum().backward()
    kernel = FR.block_kernel(d.device, q.dtype, q.shape[-1]).name
    return str(d.device), kernel, out.detach().cpu(), [t.grad.cpu() for t in mine]


def test_fused_ring_runs_on_the_stand_in_gpu_forward_and_backward():
    """Strict stand-in: every tensor on the device; no CUDA kernels there, so the CPU one."""
    from helpers.course.grading.checks.ring_attention_check import standin_gpu

    q, k, v = _qkv(8, (1, 2, 12, 4))
    up = _qkv(9, (1, 2, 12, 4))[0]
    want = _serial(q, k, v, True, up)
    pos = L.balanced_positions(12, 2)
    with standin_gpu():
        per_rank = launch.spawn(_fused_on_device, 2, (q, k, v, up, True))
    for rank, (device, kernel, out, grads) in enumerate(per_rank):
        assert (device, kernel) == ("gpu:0", "cpu_flash")
        for got, full in zip([out, *grads], want, strict=True):
            torch.testing.assert_close(got, L.shard(full, pos[rank]), **TOL)


def _ring_peak(d, seq, causal):
    q, k, v = _qkv(4, (1, 1, seq, 8))
    pos = L.contiguous_positions(seq, d.world_size)
    mine = [L.shard(t, pos[d.rank]) for t in (q, k, v)]
    with PeakMemory(d.device) as ring:
        RA.ring_attention(d, *mine, pos, causal)
    with PeakMemory(d.device) as gathered, torch.no_grad():
        AG.allgather_attention(*mine, pos, causal)
    return ring.peak, gathered.peak


def test_ring_holds_less_than_allgather_which_holds_less_than_one_process():
    seq, world = 256, 4
    q, k, v = _qkv(4, (1, 1, seq, 8))
    with PeakMemory() as serial:
        OS.attention(q, k, v)
    for ring, gathered in launch.spawn(_ring_peak, world, (seq, False)):
        # scores: S x S on one process, S/N x S after a gather, S/N x S/N per ring step
        assert ring < gathered / 2 < serial.peak / 4, (ring, gathered, serial.peak)


# --------------------------------------------------------------------------- lab 7's checks


def _plain_ring(d, q, k, v, positions, causal, zeros=False):
    """A ring written in the test (the workbook's is switched off while watched)."""
    n, r = d.world_size, d.rank
    out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    kv = torch.stack([k, v])
    for step in range(n):
        src = (r - step) % n
        s = q @ kv[0].transpose(-1, -2) / q.shape[-1] ** 0.5
        if causal:
            s = s.masked_fill(positions[r][:, None] < positions[src][None, :], float("-inf"))
        block_lse = torch.logsumexp(s, -1)
        new_lse = torch.logaddexp(lse, block_lse)
        ref = torch.where(torch.isfinite(new_lse), new_lse, torch.zeros_like(new_lse))
        block = torch.nan_to_num(torch.softmax(s, -1)) @ kv[1]
        out = torch.exp(lse - ref)[..., None] * out + torch.exp(block_lse - ref)[..., None] * block
        lse = new_lse
        if step < n - 1:
            nxt = kv.new_empty(*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1])
            sent = torch.zeros_like(kv) if zeros else kv
            ops = [tdist.P2POp(tdist.isend, sent, (r + 1) % n),
                   tdist.P2POp(tdist.irecv, nxt, (r - 1) % n)]  # fmt: skip
            for req in tdist.batch_isend_irecv(ops):  # the recorder sees batched messages
                req.wait()
            kv = nxt
    return out


def _watched(d, q, k, v, positions, causal, zeros, tamper_rank, delta):
    from helpers.course.grading.checks.ring_attention_check import watch_ring

    mine = [t.index_select(-2, positions[d.rank]) for t in (q, k, v)]
    tamper = (lambda t: t + delta) if d.rank == tamper_rank else None
    with watch_ring("the test's ring", tamper=tamper) as log:
        out = _plain_ring(d, *mine, positions, causal, zeros)
        refused = []
        for call in (lambda: RA.ring_attention(d, *mine, positions, causal),
                     lambda: F.scaled_dot_product_attention(*mine)):  # fmt: skip
            try:
                call()
            except RuntimeError as e:
                refused.append(str(e).split(":")[0])
    return out, log.summary(), refused


def test_lab7_checks_see_what_the_messages_carry():
    from helpers.course.grading.checks.ring_attention_check import (
        message_problems,
        tampered_reference,
    )

    world, seq = 3, 10
    q, k, v = (t.double() for t in _qkv(6, (1, 2, seq, 3)))
    pos = [torch.arange(r, seq, world) for r in range(world)]  # not contiguous, uneven
    want = _serial(q, k, v, True, torch.ones_like(q))[0]
    runs = {how: launch.spawn(_watched, world, (q, k, v, pos, True, how == "zeros", tamper, 0.5))
            for how, tamper in (("honest", None), ("zeros", None), ("tampered", 1))}  # fmt: skip
    for rank in range(world):
        out, log, refused = runs["honest"][rank]
        torch.testing.assert_close(out, L.shard(want, pos[rank]))
        assert message_problems(log, rank, world, k, v, pos) == []
        assert len(refused) == 1, refused  # the workbook's ring (fused attention has no lse)
        _, zero_log, _ = runs["zeros"][rank]
        assert any(
            "does not carry" in p for p in message_problems(zero_log, rank, world, k, v, pos)
        )
        tampered, _, _ = runs["tampered"][rank]
        expected = tampered_reference(q, k, v, pos, True, rank, 1, 0.5)
        torch.testing.assert_close(tampered, expected)
        assert (rank == 1) == torch.allclose(expected, out)  # only the tamperer's own output stays


def _host_lse_ring(d, q, k, v, positions, causal):
    """A ring that keeps its log-sum-exp on the host (no device=): right on CPU ranks only."""
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)  # the mistake
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    new_lse = torch.logaddexp(lse, torch.logsumexp(s, -1))
    return out + torch.softmax(s, -1) @ v + 0 * new_lse[..., None]


def _device_ring(d, q, k, v, positions, causal):
    """The same one-block ring with every buffer on q.device."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(s, -1) @ v


def test_lab7_stand_in_gpu_fails_a_log_sum_exp_left_on_the_host():
    from helpers.course.grading.checks.ring_attention_check import ring_on_gpu, standin_gpu

    q, k, v = _qkv(7, (1, 2, 6, 3))
    pos = [torch.arange(6)]  # one rank: the device rule, not the ring, is under test
    assert launch.spawn(ring_on_gpu, 1, (_host_lse_ring, q, k, v, pos, False))[0][0] == "cpu"
    with standin_gpu():
        device, out = launch.spawn(ring_on_gpu, 1, (_device_ring, q, k, v, pos, False))[0]
        with pytest.raises(launch.RankFailure, match="Expected all tensors to be on the same"):
            launch.spawn(ring_on_gpu, 1, (_host_lse_ring, q, k, v, pos, False))
    assert device == "gpu:0"
    torch.testing.assert_close(out, OS.attention(q, k, v))
