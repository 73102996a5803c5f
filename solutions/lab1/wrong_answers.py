# Plausible wrong submissions for lab 1, used by tests/grading (format: helpers/course/grading.py).
# Each replaces one solution cell; the cells it does not name keep the solution, so every
# one of them must score strictly between zero and full marks.

# === wrong: forgets_to_divide
# %% cell: average_gradients
def average_gradients(d, model: nn.Module) -> None:
    # The classic mistake: sum the gradients and forget to divide by the number of ranks.
    # Replicas still stay identical, but every step is world_size times too large.
    for p in model.parameters():
        if p.grad is None:
            continue
        tdist.all_reduce(p.grad)

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
    reqs = [tdist.isend(mine, peer) for peer in range(n) if peer != r]
    for peer in range(n):
        if peer != r:
            incoming = torch.empty_like(tensor)
            tdist.recv(incoming, peer)
            tensor.add_(incoming)
    for req in reqs:
        req.wait()

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
        req = tdist.isend(passing, (r + 1) % n)
        tdist.recv(incoming, (r - 1) % n)
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
        req = tdist.isend(send_buf, right)
        tdist.recv(recv_buf, left)
        req.wait()

    for s in range(n - 1):  # reduce-scatter
        incoming = torch.empty_like(chunks[(r - s - 1) % n])
        exchange(chunks[(r - s) % n], incoming)
        chunks[(r - s - 1) % n].add_(incoming)
    for s in range(n - 1):  # all-gather
        exchange(chunks[(r + 1 - s) % n], chunks[(r - s) % n])
