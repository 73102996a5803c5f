# Plausible wrong submissions for lab 4, used by tests/grading (format: helpers/course/grading/roundtrip.py).
# Each replaces one solution cell; the cells it does not name keep the solution, so every
# one of them must score strictly between zero and full marks.

# === wrong: forgets_backward_all_reduce
# %% cell: comm_ops
%%program lab4_ops
import torch
import torch.distributed as tdist


class CopyToTP(torch.autograd.Function):
    # "f is the identity": true forward, but each rank's dL/dx is only its part of the sum.
    # Outputs and weight gradients stay right; the gradient to the layer below is wrong.
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.contiguous().clone()
        tdist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
        tdist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(tdist.get_world_size(), dim=-1)[tdist.get_rank()].contiguous()

# === wrong: all_reduces_twice
# %% cell: comm_ops
%%program lab4_ops
import torch
import torch.distributed as tdist


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        tdist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    # "The transpose of an all-reduce is an all-reduce": g also sums in the backward pass.
    # dL/dy is already the same on every rank, so every gradient below comes out N times too big.
    @staticmethod
    def forward(ctx, x):
        out = x.contiguous().clone()
        tdist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        tdist.all_reduce(grad)
        return grad


class GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
        tdist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(tdist.get_world_size(), dim=-1)[tdist.get_rank()].contiguous()

# === wrong: gathers_with_an_all_reduce
# %% cell: comm_ops
%%program lab4_ops
import torch
import torch.distributed as tdist


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        tdist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.contiguous().clone()
        tdist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherFromTP(torch.autograd.Function):
    # The right values, the wrong collective: each rank writes its piece into a zero tensor
    # N times wider and all-reduces it. N times the bytes of an all-gather's input, twice sent.
    @staticmethod
    def forward(ctx, x):
        n, r = tdist.get_world_size(), tdist.get_rank()
        full = torch.zeros(*x.shape[:-1], n * x.shape[-1], dtype=x.dtype)
        full[..., r * x.shape[-1] : (r + 1) * x.shape[-1]] = x
        tdist.all_reduce(full)
        return full

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(tdist.get_world_size(), dim=-1)[tdist.get_rank()].contiguous()

# === wrong: splits_the_wrong_dimension
# %% cell: layers
%%program lab4_layers
import torch
import torch.nn.functional as F
from torch import nn

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab4_ops.py
    from lab4_ops import CopyToTP, GatherFromTP, ReduceFromTP


class ColumnParallelLinear(nn.Module):
    # "Column split = columns of the weight": but torch stores W = A^T, [out, in], so
    # W's columns are the INPUT features. The shapes no longer fit the full input.
    def __init__(self, full: nn.Linear, d, gather_output: bool = False):
        super().__init__()
        self.gather_output = gather_output
        n, r = d.world_size, d.rank
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=1)[r].clone())
        self.bias = nn.Parameter(full.bias.detach().chunk(n, dim=0)[r].clone())

    def forward(self, x):
        y = F.linear(CopyToTP.apply(x), self.weight, self.bias)
        return GatherFromTP.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, d):
        super().__init__()
        n, r = d.world_size, d.rank
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=0)[r].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        return ReduceFromTP.apply(F.linear(x, self.weight)) + self.bias

# === wrong: bias_on_every_rank
# %% cell: layers
%%program lab4_layers
import torch
import torch.nn.functional as F
from torch import nn

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab4_ops.py
    from lab4_ops import CopyToTP, GatherFromTP, ReduceFromTP


class ColumnParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, d, gather_output: bool = False):
        super().__init__()
        self.gather_output = gather_output
        n, r = d.world_size, d.rank
        if full.out_features % n:
            raise ValueError(f"{n} ranks do not divide out_features = {full.out_features}")
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=0)[r].clone())
        self.bias = nn.Parameter(full.bias.detach().chunk(n, dim=0)[r].clone())

    def forward(self, x):
        y = F.linear(CopyToTP.apply(x), self.weight, self.bias)
        return GatherFromTP.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    # F.linear with the bias on every rank, then the sum: the bias is added N times.
    def __init__(self, full: nn.Linear, d):
        super().__init__()
        n, r = d.world_size, d.rank
        if full.in_features % n:
            raise ValueError(f"{n} ranks do not divide in_features = {full.in_features}")
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=1)[r].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        return ReduceFromTP.apply(F.linear(x, self.weight, self.bias))

# === wrong: gathers_between_the_layers
# %% cell: tp_mlp
%%program lab4_mlp
import torch.distributed as tdist
from torch import nn

if __name__ != "__main__":  # imported by the cluster job: Part 2 is programs/lab4_layers.py
    from lab4_layers import ColumnParallelLinear, RowParallelLinear


class TPMLP(nn.Module):
    # The naive pairing: gather fc1's whole output, then cut this rank's slice out again.
    # The same numbers, but an extra all-gather of [tokens, hidden] every forward pass.
    def __init__(self, mlp: nn.Sequential, d):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp[0], d, gather_output=True)
        self.act = mlp[1]
        self.fc2 = RowParallelLinear(mlp[2], d)

    def forward(self, x):
        h = self.act(self.fc1(x))
        return self.fc2(h.chunk(tdist.get_world_size(), dim=-1)[tdist.get_rank()])

# === wrong: counts_tensor_bytes_not_ring_bytes
# %% cell: mlp_bytes
def mlp_bytes_sent(tokens: int, dim: int, world_size: int, bytes_per_number: int = 4) -> float:
    # Two all-reduces of [tokens, dim], but counted as the tensor's size: a ring all-reduce
    # makes each rank send 2 (N - 1) / N of it.
    return 2 * tokens * dim * bytes_per_number

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# tamper_ and rewrites_recorder_ reach into the grader and must score zero; imports_ is
# refused before it runs; decoy_ and deciding_ are caught by what the tests check.

# === wrong: tamper_switches_off_close
# Grader tampering: the tests' own comparison, close(), gets the code of a function that
# checks nothing, so every value check after it passes. The guard refuses both the code
# swap and the change of a name the lab's cells define: zero.
# %% cell: mlp_bytes
close.__code__ = (lambda got, want, what: None).__code__


def mlp_bytes_sent(tokens: int, dim: int, world_size: int, bytes_per_number: int = 4) -> float:
    tensor = tokens * dim * bytes_per_number
    return 2 * 2 * (world_size - 1) / world_size * tensor

# === wrong: imports_workbook_layers
# An importable answer: the workbook's own tensor-parallel layers. Refused by lab 4's
# grading.toml before it runs: the layer and MLP tests fail.
# %% cell: layers
%%program lab4_layers
from helpers.parallel.tensor.tp import ColumnParallelLinear, RowParallelLinear

# === wrong: decoy_sums_through_files
# A decoy: f and g all-reduce zeros of the right shape (the tests count them) and the sums
# travel through files. Right values and right collectives; what the all-reduces carry, and
# a message changed in flight, show that they carry nothing.
# %% cell: comm_ops
%%program lab4_ops
import torch
import torch.distributed as tdist


def _sum_through_files(t, tag):
    r, n = tdist.get_rank(), tdist.get_world_size()
    torch.save(t.detach().clone(), f"/tmp/lab4-decoy-{tag}-{t.numel()}-{r}.pt")
    tdist.all_reduce(torch.zeros_like(t))  # counted by the tests, carries nothing
    total = sum(torch.load(f"/tmp/lab4-decoy-{tag}-{t.numel()}-{k}.pt") for k in range(n))
    return total


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum_through_files(grad.contiguous(), "f")


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _sum_through_files(x.contiguous(), "g")

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
        tdist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(tdist.get_world_size(), dim=-1)[tdist.get_rank()].contiguous()

# === wrong: decoy_private_full_mlp
# A decoy: every rank keeps a full private copy of the MLP (in a list, where
# named_parameters does not look) and computes the output with it, while the layers'
# all-reduces run beside it on zeros of the right shape. The bytes the rank keeps, what
# the all-reduces carry and the layers' gradients give it away.
# %% cell: tp_mlp
%%program lab4_mlp
import copy

import torch
from torch import nn

if __name__ != "__main__":  # imported by the cluster job: Part 2 is programs/lab4_layers.py
    from lab4_layers import ColumnParallelLinear, RowParallelLinear
    from lab4_ops import CopyToTP, ReduceFromTP


class TPMLP(nn.Module):
    def __init__(self, mlp: nn.Sequential, d):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp[0], d)
        self.act = mlp[1]
        self.fc2 = RowParallelLinear(mlp[2], d)
        self.private = [copy.deepcopy(mlp)]

    def forward(self, x):
        zeros = torch.zeros(*x.shape[:-1], self.fc2.weight.shape[0])
        x = CopyToTP.apply(x)
        return self.private[0](x) + ReduceFromTP.apply(zeros)

# === wrong: rewrites_recorder_hides_a_gather
# Recorder rewriting: the gather's all-gather runs with torch's dispatch modes switched
# off, so the recorder never sees it. The guard refuses the dispatch internals: zero.
# %% cell: comm_ops
%%program lab4_ops
import torch
import torch.distributed as tdist
from torch.utils._python_dispatch import _disable_current_modes


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        tdist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.contiguous().clone()
        tdist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
        with _disable_current_modes():
            tdist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(tdist.get_world_size(), dim=-1)[tdist.get_rank()].contiguous()

# === wrong: deciding_g_sums_in_place
# Only the deciding cases catch it: g all-reduces into its input and returns it. The sum is
# right, and so is every gradient; but a caller who uses x again after y = g(x) (a residual
# connection) gets the sum instead. The hidden tests always reuse the input.
# %% cell: comm_ops
%%program lab4_ops
import torch
import torch.distributed as tdist


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        tdist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        tdist.all_reduce(x)  # in place: x itself now holds the sum
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
        tdist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(tdist.get_world_size(), dim=-1)[tdist.get_rank()].contiguous()

# === wrong: f_backward_sums_into_grad
# f's backward all-reduces straight into the gradient autograd handed it, to save a copy. Every
# value the tests compare is right (the sum arrives, and the all-reduce carried this rank's own
# gradient when it left), but autograd gives that same tensor to every other consumer of f's
# output: a residual branch beside f would receive the sum over the ranks instead of its own
# gradient. The tests look at the handed gradient after backward.
# %% cell: comm_ops
%%program lab4_ops
import torch
import torch.distributed as tdist


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()  # already contiguous: the same tensor
        tdist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.contiguous().clone()
        tdist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(tdist.get_world_size())]
        tdist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(tdist.get_world_size(), dim=-1)[tdist.get_rank()].contiguous()

# === wrong: column_keeps_the_full_layer
# The right shares, but the column layer keeps the full nn.Linear it was built from (to
# "check" its shapes later): every rank holds the whole layer, which the operating system
# counts once the test has dropped its own.
# %% cell: layers
%%program lab4_layers
import torch
import torch.nn.functional as F
from torch import nn

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab4_ops.py
    from lab4_ops import CopyToTP, GatherFromTP, ReduceFromTP


class ColumnParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, d, gather_output: bool = False):
        super().__init__()
        self.gather_output = gather_output
        n, r = d.world_size, d.rank
        if full.out_features % n:
            raise ValueError(f"{n} ranks do not divide out_features = {full.out_features}")
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=0)[r].clone())
        has_bias = full.bias is not None
        self.bias = nn.Parameter(full.bias.detach().chunk(n, dim=0)[r].clone()) if has_bias else None
        self.shapes = [full]  # not a submodule: named_parameters does not see it

    def forward(self, x):
        y = F.linear(CopyToTP.apply(x), self.weight, self.bias)
        return GatherFromTP.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, d):
        super().__init__()
        n, r = d.world_size, d.rank
        if full.in_features % n:
            raise ValueError(f"{n} ranks do not divide in_features = {full.in_features}")
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=1)[r].clone())
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x):
        partial = F.linear(x, self.weight)
        y = ReduceFromTP.apply(partial)
        return y if self.bias is None else y + self.bias

# === wrong: column_full_layer_kept_in_a_memfd
# Issue 38's red team (12/12 at 91eb736): the column layer keeps the full nn.Linear in a
# memfd (outside what the grader counts); the sandbox now refuses memfd.
# The right shares, but the column layer keeps the full nn.Linear it was built from (to
# "check" its shapes later): every rank holds the whole layer, which the operating system
# counts once the test has dropped its own.
# %% cell: layers
%%program lab4_layers
import torch
import torch.nn.functional as F
from torch import nn

if __name__ != "__main__":  # imported by the cluster job: Part 1 is programs/lab4_ops.py
    from lab4_ops import CopyToTP, GatherFromTP, ReduceFromTP


class ColumnParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, d, gather_output: bool = False):
        super().__init__()
        self.gather_output = gather_output
        n, r = d.world_size, d.rank
        if full.out_features % n:
            raise ValueError(f"{n} ranks do not divide out_features = {full.out_features}")
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=0)[r].clone())
        has_bias = full.bias is not None
        self.bias = nn.Parameter(full.bias.detach().chunk(n, dim=0)[r].clone()) if has_bias else None
        _os = torch.importlib.import_module("os")
        fd = _os.memfd_create("layer")  # the full layer, kept in a memfd the rank never maps
        data = full.weight.detach().numpy().tobytes()
        view = memoryview(data)
        while len(view):
            view = view[_os.write(fd, view):]
        del data, view
        self.shapes = [fd]

    def forward(self, x):
        y = F.linear(CopyToTP.apply(x), self.weight, self.bias)
        return GatherFromTP.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, d):
        super().__init__()
        n, r = d.world_size, d.rank
        if full.in_features % n:
            raise ValueError(f"{n} ranks do not divide in_features = {full.in_features}")
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=1)[r].clone())
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x):
        partial = F.linear(x, self.weight)
        y = ReduceFromTP.apply(partial)
        return y if self.bias is None else y + self.bias
