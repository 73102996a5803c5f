# Plausible wrong submissions for lab 1, used by tests/grading (format: helpers/course/grading/roundtrip.py).
# Each replaces one solution cell; the cells it does not name keep the solution, so every
# one of them must score strictly between zero and full marks.

# === wrong: forgets_to_divide
# %% cell: average_gradients
def broadcast_parameters(d, model: nn.Module) -> None:
    for t in [*model.parameters(), *model.buffers()]:
        tdist.broadcast(t.data, src=0)


def average_gradients(d, model: nn.Module) -> None:
    # The classic mistake: sum the gradients and forget to divide by the number of ranks.
    # Replicas still stay identical, but every step is world_size times too large.
    for p in model.parameters():
        if p.grad is None:
            continue
        tdist.all_reduce(p.grad)

# === wrong: no_broadcast
# %% cell: average_gradients
def broadcast_parameters(d, model: nn.Module) -> None:
    # Trusts the seeds: every rank is assumed to have drawn the same weights. Replicas that
    # drew their own weights then train apart for ever (averaged gradients, different starts).
    pass


def average_gradients(d, model: nn.Module) -> None:
    for p in model.parameters():
        if p.grad is None:
            continue
        tdist.all_reduce(p.grad)
        p.grad /= d.world_size

# === wrong: broadcast_from_the_last_rank
# %% cell: average_gradients
def broadcast_parameters(d, model: nn.Module) -> None:
    # One start for every rank, but the wrong one: the last rank's weights, not rank 0's.
    # The replicas agree with each other; they do not start where rank 0 (the one that
    # loaded the checkpoint, or whose seed the run reports) started.
    for t in [*model.parameters(), *model.buffers()]:
        tdist.broadcast(t.data, src=d.world_size - 1)


def average_gradients(d, model: nn.Module) -> None:
    for p in model.parameters():
        if p.grad is None:
            continue
        tdist.all_reduce(p.grad)
        p.grad /= d.world_size

# === wrong: calls_the_library
# %% cell: ring_all_reduce
%%program lab1_ring
import torch
import torch.distributed as tdist


def ring_all_reduce_(d, tensor: torch.Tensor) -> None:
    # Right answer, wrong exercise: the library's all-reduce, reached by another path.
    from torch.distributed import distributed_c10d

    distributed_c10d.all_reduce(tensor)

# === wrong: everyone_to_everyone
# %% cell: ring_all_reduce
%%program lab1_ring
import torch
import torch.distributed as tdist


def ring_all_reduce_(d, tensor: torch.Tensor) -> None:
    # The right sum from send/recv only, but not a ring: every rank sends its whole
    # tensor to every other rank (an all-to-all), (N - 1) x n elements per rank.
    n, r = d.world_size, d.rank
    mine = tensor.clone()
    incoming = {peer: torch.empty_like(tensor) for peer in range(n) if peer != r}
    ops = [tdist.P2POp(tdist.isend, mine, peer) for peer in incoming]
    ops += [tdist.P2POp(tdist.irecv, buf, peer) for peer, buf in incoming.items()]
    for req in tdist.batch_isend_irecv(ops):
        req.wait()
    for buf in incoming.values():
        tensor.add_(buf)

# === wrong: whole_tensor_round_the_ring
# %% cell: ring_all_reduce
%%program lab1_ring
import torch
import torch.distributed as tdist


def ring_all_reduce_(d, tensor: torch.Tensor) -> None:
    # A ring, and the right sum, but the whole tensor travels at every step:
    # N - 1 steps of n elements per rank instead of 2 (N - 1) chunks of n / N.
    n, r = d.world_size, d.rank
    passing = tensor.clone()  # the contribution now travelling round the ring
    for _ in range(n - 1):
        incoming = torch.empty_like(passing)
        ops = [tdist.P2POp(tdist.isend, passing, (r + 1) % n),
               tdist.P2POp(tdist.irecv, incoming, (r - 1) % n)]
        for req in tdist.batch_isend_irecv(ops):
            req.wait()
        tensor.add_(incoming)
        passing = incoming

# === wrong: chunk_instead_of_tensor_split
# %% cell: ring_all_reduce
%%program lab1_ring
import torch
import torch.distributed as tdist


def ring_all_reduce_(d, tensor: torch.Tensor) -> None:
    # The ring, but cut with tensor.chunk(n), which may return FEWER than n chunks
    # (5 elements on 4 ranks: 3 chunks of 2, 2, 1): fine for even sizes only.
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    chunks = tensor.view(-1).chunk(n)

    def exchange(send_buf, recv_buf):
        ops = [tdist.P2POp(tdist.isend, send_buf, right), tdist.P2POp(tdist.irecv, recv_buf, left)]
        for req in tdist.batch_isend_irecv(ops):
            req.wait()

    for s in range(n - 1):  # reduce-scatter
        incoming = torch.empty_like(chunks[(r - s - 1) % n])
        exchange(chunks[(r - s) % n], incoming)
        chunks[(r - s - 1) % n].add_(incoming)
    for s in range(n - 1):  # all-gather
        exchange(chunks[(r + 1 - s) % n], chunks[(r - s) % n])

# === wrong: isend_then_recv_hangs_on_gpus
# %% cell: ring_all_reduce
%%program lab1_ring
import torch
import torch.distributed as tdist


def ring_all_reduce_(d, tensor: torch.Tensor) -> None:
    # The right ring, posted as two calls: isend to the right, then a blocking recv from the
    # left (this lab's solution before issue 39). Gloo lets it pass on every number of ranks;
    # on GPUs NCCL runs a rank's sends and receives in the order it posted them, so each
    # rank's recv waits behind its own send, which waits for its neighbour's recv: a hang. The
    # ring tests refuse it with NCCL's rule; Part 1 scores.
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    chunks = torch.tensor_split(tensor.view(-1), n)

    def exchange(send_buf, recv_buf):
        req = tdist.isend(send_buf, right) if send_buf.numel() else None
        if recv_buf.numel():
            tdist.recv(recv_buf, left)
        if req is not None:
            req.wait()

    for s in range(n - 1):  # reduce-scatter
        incoming = torch.empty_like(chunks[(r - s - 1) % n])
        exchange(chunks[(r - s) % n], incoming)
        chunks[(r - s - 1) % n].add_(incoming)
    for s in range(n - 1):  # all-gather
        exchange(chunks[(r + 1 - s) % n], chunks[(r - s) % n])

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# tamper_ and rewrites_recorder_ reach into the grader and must score zero; imports_ is
# refused before it runs; decoy_ and deciding_ are caught by what the tests check.

# === wrong: tamper_custom_exception_handler
# Grader tampering: the kernel's custom exception handler swallows every error, so no test
# cell reports one and the stubs would pass. The guard refuses IPython: zero.
# %% cell: average_gradients
import IPython

IPython.get_ipython().set_custom_exc((BaseException,), lambda shell, etype, value, tb, tb_offset=None: None)


def average_gradients(d, model: nn.Module) -> None:
    raise NotImplementedError()

# === wrong: imports_ring_from_notebook_02
# An importable answer: notebook 02's ring, from the workbook. Refused by lab 1's
# grading.toml before it runs, so the ring's tests fail.
# %% cell: ring_all_reduce
%%program lab1_ring
import torch

from helpers.parallel.collectives.collectives import ring_all_reduce


def ring_all_reduce_(d, tensor: torch.Tensor) -> None:
    ring_all_reduce(d, tensor)

# === wrong: decoy_ring_through_files
# A decoy: the ring's messages go to the right neighbours, one chunk at a time, in the
# ring's volume, but they carry zeros; the sum comes from files every rank saved first.
# The result is right, the traffic looks right; when a test changes a message on its way,
# nothing changes.
# %% cell: ring_all_reduce
%%program lab1_ring
import torch
import torch.distributed as tdist


def ring_all_reduce_(d, tensor: torch.Tensor) -> None:
    n, r = d.world_size, d.rank
    right, left = (r + 1) % n, (r - 1) % n
    torch.save(tensor.clone(), f"/tmp/lab1-decoy-{r}-{tensor.numel()}.pt")
    chunks = torch.tensor_split(torch.zeros_like(tensor).view(-1), n)
    for s in range(2 * (n - 1)):  # the ring's pattern, carrying nothing
        out, into = chunks[(r - s) % n], torch.empty_like(chunks[(r - s - 1) % n])
        ops = [tdist.P2POp(tdist.isend, out, right)] if out.numel() else []
        ops += [tdist.P2POp(tdist.irecv, into, left)] if into.numel() else []
        for req in tdist.batch_isend_irecv(ops) if ops else []:
            req.wait()
    total = sum(torch.load(f"/tmp/lab1-decoy-{k}-{tensor.numel()}.pt") for k in range(n))
    tensor.copy_(total)

# === wrong: rewrites_recorder_pops_the_mode
# Recorder rewriting: pop the recorder off torch's dispatch-mode stack, call the library's
# all-reduce unseen, push it back. The guard refuses torch's private internals: zero.
# %% cell: ring_all_reduce
%%program lab1_ring
import torch
import torch.distributed as tdist


def ring_all_reduce_(d, tensor: torch.Tensor) -> None:
    recorder = torch._C._pop_torch_dispatch_stack()
    try:
        tdist.all_reduce(tensor)
    finally:
        torch._C._push_on_torch_dispatch_stack(recorder)

# === wrong: deciding_every_grad_is_set
# Only the deciding cases catch it: it assumes every parameter has a gradient. Right for
# every visible model; the hidden tests always include a frozen layer (p.grad is None).
# %% cell: average_gradients
def broadcast_parameters(d, model: nn.Module) -> None:
    for t in [*model.parameters(), *model.buffers()]:
        tdist.broadcast(t.data, src=0)


def average_gradients(d, model: nn.Module) -> None:
    for p in model.parameters():
        tdist.all_reduce(p.grad)
        p.grad /= d.world_size
