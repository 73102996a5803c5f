# Plausible wrong submissions for lab 7, used by tests/grading (format: helpers/course/grading/roundtrip.py).
# Each replaces one solution cell; the cells it does not name keep the solution, so every
# one of them must score strictly between zero and full marks.

# === wrong: deciding_merges_exp_of_lse
# %% cell: blocks
%%program lab7_blocks
import math

import torch


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """[Lq, Lk] bool: True where the query at global position q_pos[i] may see key k_pos[j]."""
    return q_pos[:, None] >= k_pos[None, :]


def block_attention(q, k, v, mask=None):
    # Right, and stable.
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask.to(s.device), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    out = (p @ v) / torch.where(total > 0, total, torch.ones_like(total))
    return out, (m + torch.log(total)).squeeze(-1)


def merge(out_a, lse_a, out_b, lse_b):
    # The formula read literally: weights exp(lse) / (exp(lse_a) + exp(lse_b)). Right for
    # moderate scores; exp(lse) overflows once scores reach the hundreds (float64: ~709),
    # which only the hidden tests' large scores reach.
    ea, eb = torch.exp(lse_a), torch.exp(lse_b)
    total = ea + eb
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return (ea / safe)[..., None] * out_a + (eb / safe)[..., None] * out_b, torch.log(total)

# === wrong: deciding_contiguous_masks_only
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    # Notebook 09's rule for contiguous pieces: earlier ranks' blocks need no mask, later ones
    # are skipped, our own gets tril(). Right when every rank holds one contiguous piece;
    # wrong for two chunks per rank or any other layout (the masks must come from positions).
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    kv = torch.stack([k, v])
    for step in range(n):
        src = (r - step) % n
        if step < n - 1:
            shape = (*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1])
            nxt = torch.empty(shape, dtype=kv.dtype, device=kv.device)
            reqs = tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, kv, right), tdist.P2POp(tdist.irecv, nxt, left)])
        if not causal or src < r:
            out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1]))
        elif src == r:
            tril = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device).tril()
            out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1], tril))
        if step < n - 1:
            for req in reqs:
                req.wait()
            kv = nxt
    return out

# === wrong: sends_own_block_every_step
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    # Sends its OWN K/V at every step instead of passing on the block it received: every
    # rank sees its left neighbour's block N - 1 times and never the others'.
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    mine = torch.stack([k, v])
    out, lse = merge(torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype),
                     *block_attention(q, k, v, causal_mask(positions[r], positions[r]) if causal else None))
    for step in range(1, n):
        src = (r - step) % n
        incoming = torch.empty(*mine.shape[:-2], len(positions[left]), mine.shape[-1], dtype=q.dtype)
        reqs = tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, mine, right), tdist.P2POp(tdist.irecv, incoming, left)])
        for req in reqs:
            req.wait()
        mask = causal_mask(positions[r], positions[left]) if causal else None
        if mask is None or mask.any():
            out, lse = merge(out, lse, *block_attention(q, incoming[0], incoming[1], mask))
    return out

# === wrong: decoy_messages_work_through_files
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    # A decoy: the messages have the right shapes, peers and count, but carry zeros. The real
    # K/V go through files, and the ring's messages only tell a rank that the others' files
    # are written. The result is right; what the messages carry, and what they change, is not.
    n, r = d.world_size, d.rank
    folder = f"/tmp/lab7-decoy-{n}-{sum(len(p) for p in positions)}-{q.shape[-1]}"
    torch.save((k, v), f"{folder}-{r}.pt")
    blank = torch.zeros(2, *k.shape, dtype=k.dtype)
    for step in range(n - 1):
        src = (r - step) % n
        incoming = torch.empty(2, *k.shape[:-2], len(positions[(src - 1) % n]), k.shape[-1], dtype=k.dtype)
        reqs = tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, blank, (r + 1) % n), tdist.P2POp(tdist.irecv, incoming, (r - 1) % n)])
        for req in reqs:
            req.wait()
        blank = torch.zeros_like(incoming)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    for src in range(n):
        k_src, v_src = torch.load(f"{folder}-{src}.pt")
        mask = causal_mask(positions[r], positions[src]) if causal else None
        if mask is None or mask.any():
            out, lse = merge(out, lse, *block_attention(q, k_src, v_src, mask))
    return out

# === wrong: imports_the_workbook_ring
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    # Right answer, wrong exercise: notebook 09's ring, imported from the workbook.
    from helpers.parallel.context.ring_attention import ring_attention as workbook_ring

    return workbook_ring(d, q, k, v, positions, causal)

# === wrong: gathers_kv_instead
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    # Llama 3's way, not a ring: all-gather every rank's K/V (padded), then attend once.
    longest = max(len(p) for p in positions)
    kv = torch.stack([k, v])
    pad = kv.new_zeros(*kv.shape[:-2], longest - kv.shape[-2], kv.shape[-1])
    pieces = [torch.empty(*kv.shape[:-2], longest, kv.shape[-1], dtype=kv.dtype) for _ in positions]
    tdist.all_gather(pieces, torch.cat([kv, pad], dim=-2))
    kv_all = torch.cat([p[..., : len(pos), :] for p, pos in zip(pieces, positions)], dim=-2)
    mask = causal_mask(positions[d.rank], torch.cat(positions)) if causal else None
    return block_attention(q, kv_all[0], kv_all[1], mask)[0]

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# tamper_ and rewrites_recorder_ reach into the grader and must score zero; imports_ is
# refused before it runs (grading.toml); decoy_ and deciding_ are caught by what the tests check.

# === wrong: tamper_ast_transformer_swallows_errors
# Grader tampering: every later cell is wrapped in try/except, so no test reports an error
# and the layout's stub would pass. The guard refuses IPython's transformers: zero.
# %% cell: balanced_positions
%%program lab7_layout
import ast

import torch


class Swallow(ast.NodeTransformer):
    def visit_Module(self, node):
        handler = ast.ExceptHandler(type=ast.Name("BaseException", ast.Load()), name=None, body=[ast.Pass()])
        node.body = [ast.Try(body=node.body, handlers=[handler], orelse=[], finalbody=[])]
        return ast.fix_missing_locations(node)


get_ipython().ast_transformers.append(Swallow())


def balanced_positions(seq_len: int, world: int) -> list:
    raise NotImplementedError()

# === wrong: rewrites_recorder_gathers_unseen
# Recorder rewriting: switch torch's dispatch modes off (the recorder among them) around an
# all-gather of every rank's K/V, so the refused collective is not seen. The guard refuses
# torch's dispatch internals: zero.
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist
from torch.utils._python_dispatch import _disable_current_modes

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    longest = max(len(p) for p in positions)
    kv = torch.stack([k, v])
    kv = torch.cat([kv, kv.new_zeros(*kv.shape[:-2], longest - kv.shape[-2], kv.shape[-1])], dim=-2)
    pieces = [torch.empty_like(kv) for _ in positions]
    with _disable_current_modes():
        tdist.all_gather(pieces, kv)
    kv_all = torch.cat([p[..., : len(pos), :] for p, pos in zip(pieces, positions)], dim=-2)
    mask = causal_mask(positions[d.rank], torch.cat(positions)) if causal else None
    return block_attention(q, kv_all[0], kv_all[1], mask)[0]

# === wrong: imports_torch_context_parallel
# An importable answer: torch's own context parallelism (its ring runs inside
# scaled_dot_product_attention on DTensors). Refused by lab 7's grading.toml before it runs,
# so the ring's tests fail; Parts 1 and 3 keep their points.
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    mesh = init_device_mesh(q.device.type, (d.world_size,))
    buffers = [t.contiguous() for t in (q, k, v)]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
        return F.scaled_dot_product_attention(*buffers, is_causal=causal)

# === wrong: deciding_lse_left_on_the_host
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    # Right on CPU ranks: the running log-sum-exp is made without device=, so it lives on the
    # host. On CPU nobody notices; on a GPU the first merge meets a CUDA tensor and a CPU one and
    # stops ("Expected all tensors to be on the same device"). The tests' stand-in GPU says so.
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    kv = torch.stack([k, v])
    for step in range(n):
        src = (r - step) % n
        if step < n - 1:
            nxt = torch.empty((*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1]),
                              dtype=kv.dtype, device=kv.device)
            ops = [tdist.P2POp(tdist.isend, kv, right), tdist.P2POp(tdist.irecv, nxt, left)]
            reqs = tdist.batch_isend_irecv(ops)
        mask = causal_mask(positions[r], positions[src]).to(q.device) if causal else None
        if mask is None or mask.any():
            out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1], mask))
        if step < n - 1:
            for req in reqs:
                req.wait()
            kv = nxt
    return out

# === wrong: keeps_every_block_attends_at_the_end
# Passes the blocks round the ring exactly as asked, but keeps each one it receives and, once
# all have arrived, attends over the whole sequence at once, with no merge. The output and the
# messages are right, yet a rank ends up holding every K/V block: the memory ring attention
# exists to save grows with the sequence again, and no compute overlaps a transfer. The bytes a
# rank holds at once show it.
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge


def ring_attention(d, q, k, v, positions, causal=False):
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    kv = torch.stack([k, v])
    held = {r: kv}  # owner rank -> its K/V block
    for step in range(n - 1):
        src = (r - step) % n
        nxt = torch.empty((*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1]),
                          dtype=kv.dtype, device=kv.device)
        reqs = tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, kv, right), tdist.P2POp(tdist.irecv, nxt, left)])
        for req in reqs:
            req.wait()
        kv = nxt
        held[(src - 1) % n] = kv
    owners = sorted(held)
    keys = torch.cat([held[j][0] for j in owners], dim=-2)
    values = torch.cat([held[j][1] for j in owners], dim=-2)
    mask = None
    if causal:
        mask = causal_mask(positions[r], torch.cat([positions[j] for j in owners])).to(q.device)
    out, _ = block_attention(q, keys, values, mask)
    return out

# === wrong: keeps_blocks_in_memory_set_aside_at_import
# Keeps every block it receives (as keeps_every_block_attends_at_the_end), in 40 MiB it made and
# touched on its first call (the memory test's warm-up), then merges them at the end: the
# blocks cost no new memory during the measured ring, but the rank held them before it
# (issue 38's red team: what a rank holds before a measured run is bounded too).
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge

STORE = []  # 40 MiB, made and touched on the first call (the test's warm-up), then kept


def ring_attention(d, q, k, v, positions, causal=False):
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    if not STORE:
        STORE.append(torch.ones(5 << 20, dtype=q.dtype, device=q.device))
    store = STORE[0]
    kv = torch.stack([k, v])
    held = {r: kv}
    used = 0
    for step in range(n - 1):
        src = (r - step) % n
        shape = (*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1])
        count = 1
        for s in shape:
            count *= s
        if used + count <= store.numel():
            nxt = store[used : used + count].view(shape)
            used += count
        else:
            nxt = torch.empty(shape, dtype=kv.dtype, device=kv.device)
        reqs = tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, kv, right), tdist.P2POp(tdist.irecv, nxt, left)])
        for req in reqs:
            req.wait()
        kv = nxt
        held[(src - 1) % n] = kv
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    for j in sorted(held):
        mask = causal_mask(positions[r], positions[j]).to(q.device) if causal else None
        if mask is None or mask.any():
            out, lse = merge(out, lse, *block_attention(q, held[j][0], held[j][1], mask))
    return out

# === wrong: keeps_every_block_in_a_helper_process
# Issue 38's red team (12/12 at 91eb736): the ring passes every block, a process the rank
# forked keeps them all and attends once, no merge; the sandbox now refuses the fork.
# %% cell: ring_attention
%%program lab7_ring
import torch
import torch.distributed as tdist

if __name__ != "__main__":
    from lab7_blocks import block_attention, causal_mask, merge

_im = torch.importlib.import_module
_os = _im("os")
_bio = _im("io")


def _pack(obj):
    buf = _bio.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    return len(data).to_bytes(8, "little") + data


def _readn(fd, n):
    parts = []
    while n:
        chunk = _os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _unpack(fd):
    n = int.from_bytes(_readn(fd, 8), "little")
    return torch.load(_bio.BytesIO(_readn(fd, n)), weights_only=False)


def _writeall(fd, data):
    view = memoryview(data)
    while len(view):
        view = view[_os.write(fd, view):]


class _Vault:
    """A helper process: keeps tensors (and runs functions on them) outside the rank's memory."""

    def __init__(self, funcs=None):
        a_r, a_w = _os.pipe()
        b_r, b_w = _os.pipe()
        pid = _os.fork()
        if pid == 0:
            store, funcs = {}, funcs or {}
            while True:
                try:
                    cmd, key, val = _unpack(a_r)
                except EOFError:
                    _os.kill(_os.getpid(), 9)
                if cmd == "put":
                    store[key] = val
                elif cmd == "get":
                    _writeall(b_w, _pack(store.pop(key)))
                elif cmd == "add":
                    store.setdefault(key, []).append(val)
                elif cmd == "call":
                    try:
                        res = funcs[val](store)
                    except BaseException as e:
                        res = "child failed: " + repr(e)
                    _writeall(b_w, _pack(res))
                    store.clear()
        self.w, self.r = a_w, b_r

    def put(self, key, val):
        _writeall(self.w, _pack(("put", key, val)))

    def add(self, key, val):
        _writeall(self.w, _pack(("add", key, val)))

    def get(self, key):
        _writeall(self.w, _pack(("get", key, None)))
        return _unpack(self.r)

    def call(self, name):
        _writeall(self.w, _pack(("call", None, name)))
        return _unpack(self.r)


def _attend(store):
    q, positions, causal, r = store["meta"][0]
    held = dict(store["kv"])
    owners = sorted(held)
    keys = torch.cat([held[j][0] for j in owners], dim=-2)
    values = torch.cat([held[j][1] for j in owners], dim=-2)
    mask = causal_mask(positions[r], torch.cat([positions[j] for j in owners])) if causal else None
    out, _ = block_attention(q, keys, values, mask)
    return out


_VAULT = []


def ring_attention(d, q, k, v, positions, causal=False):
    if not _VAULT:
        _VAULT.append(_Vault({"attend": _attend}))
    vault = _VAULT[0]
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    kv = torch.stack([k, v])
    vault.add("meta", (q.cpu(), positions, causal, r))
    vault.add("kv", (r, kv.cpu()))
    for step in range(n - 1):
        src = (r - step) % n
        nxt = torch.empty((*kv.shape[:-2], len(positions[(src - 1) % n]), kv.shape[-1]),
                          dtype=kv.dtype, device=kv.device)
        reqs = tdist.batch_isend_irecv([tdist.P2POp(tdist.isend, kv, right), tdist.P2POp(tdist.irecv, nxt, left)])
        for req in reqs:
            req.wait()
        kv = nxt
        vault.add("kv", ((src - 1) % n, kv.cpu()))
    del kv, nxt
    out = vault.call("attend")
    if isinstance(out, str):
        raise RuntimeError(out)
    return out.to(q.device)
