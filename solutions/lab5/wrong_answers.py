# Plausible wrong submissions for lab 5, used by tests/grading (multi-answer format:
# helpers/course/grading/labs.py). Cells not listed keep the solution, so each submission must
# score strictly between zero and full marks.

# === wrong: rows_and_columns_swapped
# Splits q, k, v, w1, w3 by rows and wo, w2 by columns: each rank would need the other
# rank's half of the input features; the model fails (or computes something else) and the
# shards are on the wrong axes. Part 2 still scores.
# %% cell: plan
%%program lab5_plan
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


def make_mesh(device_type: str, world_size: int, tp: int):
    # A (world_size // tp, tp) DeviceMesh named ("dp", "tp"): TP groups are neighbouring ranks.
    if tp < 1 or world_size % tp:
        raise ValueError(f"tp={tp} must divide world_size={world_size}; "
                         f"choose one of {[t for t in range(1, world_size + 1) if world_size % t == 0]}")
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))


def block_plan() -> dict:
    # {sub-module name: ColwiseParallel() or RowwiseParallel()} for one Llama 2 block.
    return {
        "attention.wq": RowwiseParallel(),
        "attention.wk": RowwiseParallel(),
        "attention.wv": RowwiseParallel(),
        "attention.wo": ColwiseParallel(),
        "feed_forward.w1": RowwiseParallel(),
        "feed_forward.w3": RowwiseParallel(),
        "feed_forward.w2": ColwiseParallel(),
    }

# === wrong: tp_on_the_outer_dimension
# Puts TP on the outer mesh dimension: TP groups {0, 2} and {1, 3} straddle two nodes on a
# cluster. The numbers are right (losses equal one process), the layout is not.
# %% cell: plan
%%program lab5_plan
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


def make_mesh(device_type: str, world_size: int, tp: int):
    # A (world_size // tp, tp) DeviceMesh named ("dp", "tp"): TP groups are neighbouring ranks.
    if tp < 1 or world_size % tp:
        raise ValueError(f"tp={tp} must divide world_size={world_size}; "
                         f"choose one of {[t for t in range(1, world_size + 1) if world_size % t == 0]}")
    return init_device_mesh(device_type, (tp, world_size // tp), mesh_dim_names=("tp", "dp"))


def block_plan() -> dict:
    # {sub-module name: ColwiseParallel() or RowwiseParallel()} for one Llama 2 block.
    return {
        "attention.wq": ColwiseParallel(),  # each rank: n_heads / tp query heads
        "attention.wk": ColwiseParallel(),  # n_kv_heads / tp key heads
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),  # partial sums over heads -> all-reduce
        "feed_forward.w1": ColwiseParallel(),  # hidden units split
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),  # partial sums -> all-reduce
    }

# === wrong: attention_only
# Shards attention but forgets the feed-forward: right losses, but w1, w2, w3 (two thirds
# of a block's weights) are replicated over TP.
# %% cell: plan
%%program lab5_plan
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


def make_mesh(device_type: str, world_size: int, tp: int):
    # A (world_size // tp, tp) DeviceMesh named ("dp", "tp"): TP groups are neighbouring ranks.
    if tp < 1 or world_size % tp:
        raise ValueError(f"tp={tp} must divide world_size={world_size}; "
                         f"choose one of {[t for t in range(1, world_size + 1) if world_size % t == 0]}")
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))


def block_plan() -> dict:
    # {sub-module name: ColwiseParallel() or RowwiseParallel()} for one Llama 2 block.
    return {
        "attention.wq": ColwiseParallel(),  # each rank: n_heads / tp query heads
        "attention.wk": ColwiseParallel(),  # n_kv_heads / tp key heads
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),  # partial sums over heads -> all-reduce
    }

# === wrong: states_ignore_pp
# Divides the states by tp but forgets the pipeline: every layout with pp > 1 looks pp
# times too big, so the chosen layouts change.
# %% cell: layout
%%program lab5_layout
def states_gb(n_params: int, dp: int, tp: int, pp: int, zero: int = 0) -> float:
    # FP32 + Adam model states per GPU, in GB.
    sharded = {0: 0, 1: 8, 2: 12, 3: 16}[zero]
    return (16 - sharded + sharded / dp) * n_params / tp / 1e9


def choose_layout(n_params: int, n_layers: int, n_heads: int, nodes: int, gpus_per_node: int,
                  gpu_gb: float, zero: int = 0) -> tuple[int, int, int]:
    # (dp, tp, pp) that fits, by the preferences above.
    world = nodes * gpus_per_node
    fits = []
    for tp in range(1, gpus_per_node + 1):
        if gpus_per_node % tp or n_heads % tp:
            continue
        for pp in range(1, n_layers + 1):
            if n_layers % pp or world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if states_gb(n_params, dp, tp, pp, zero) <= 0.8 * gpu_gb:
                fits.append((-dp, max(tp, pp), tp, (dp, tp, pp)))
    if not fits:
        raise ValueError(f"no (dp, tp, pp) fits {n_params:,} parameters on {nodes} x {gpus_per_node} "
                         f"GPUs of {gpu_gb} GB; use more GPUs or ZeRO-3")
    return min(fits)[-1]

# === wrong: tp_anywhere_least_pipeline
# Lets TP span nodes and prefers the least pipeline ("TP is free"): for 13B on 2 x 8 it
# picks TP = 8, PP = 1 instead of seed 000's TP = 2, PP = 4, and TP = 16 when it fits.
# %% cell: layout
%%program lab5_layout
def states_gb(n_params: int, dp: int, tp: int, pp: int, zero: int = 0) -> float:
    # FP32 + Adam model states per GPU, in GB.
    sharded = {0: 0, 1: 8, 2: 12, 3: 16}[zero]
    return (16 - sharded + sharded / dp) * n_params / (tp * pp) / 1e9


def choose_layout(n_params: int, n_layers: int, n_heads: int, nodes: int, gpus_per_node: int,
                  gpu_gb: float, zero: int = 0) -> tuple[int, int, int]:
    # (dp, tp, pp) that fits, by the preferences above.
    world = nodes * gpus_per_node
    fits = []
    for tp in range(1, world + 1):
        if n_heads % tp:
            continue
        for pp in range(1, n_layers + 1):
            if n_layers % pp or world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if states_gb(n_params, dp, tp, pp, zero) <= 0.8 * gpu_gb:
                fits.append((-dp, pp, (dp, tp, pp)))  # the least pipeline: TP is free
    if not fits:
        raise ValueError(f"no (dp, tp, pp) fits {n_params:,} parameters on {nodes} x {gpus_per_node} "
                         f"GPUs of {gpu_gb} GB; use more GPUs or ZeRO-3")
    return min(fits)[-1]

# ---------------------------------------------------------------------------------------
# Shortcuts a learner looking for free marks might try (one of each class; labs/README.md).
# tamper_ and rewrites_recorder_ reach into the grader and must score zero; imports_ is
# refused before it runs; decoy_ and deciding_ are caught by what the tests check.

# === wrong: tamper_patches_builtins
# Grader tampering: Python's own abs() now returns 0, so every check of the form
# abs(got - want) < 1e-9 passes whatever states_gb returns. The guard refuses builtins: zero.
# %% cell: layout
%%program lab5_layout
import builtins

builtins.abs = lambda x: 0.0


def states_gb(n_params: int, dp: int, tp: int, pp: int, zero: int = 0) -> float:
    return 0.0


def choose_layout(n_params: int, n_layers: int, n_heads: int, nodes: int, gpus_per_node: int,
                  gpu_gb: float, zero: int = 0) -> tuple[int, int, int]:
    raise NotImplementedError()

# === wrong: imports_workbook_plan
# An importable answer: the workbook's own Llama 2 plan. Refused by lab 5's grading.toml
# before it runs, so the mesh and plan tests fail.
# %% cell: plan
%%program lab5_plan
from torch.distributed.device_mesh import init_device_mesh

from helpers.parallel.composed.llama_parallel import block_plan


def make_mesh(device_type: str, world_size: int, tp: int):
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))

# === wrong: imports_the_planner
# An importable answer: the workbook's 3D planner picks the layout. Refused by lab 5's
# grading.toml before it runs.
# %% cell: layout
%%program lab5_layout
from helpers.parallel.composed import planner


def states_gb(n_params: int, dp: int, tp: int, pp: int, zero: int = 0) -> float:
    sharded = {0: 0, 1: 8, 2: 12, 3: 16}[zero]
    return (16 - sharded + sharded / dp) * n_params / (tp * pp) / 1e9


def choose_layout(n_params: int, n_layers: int, n_heads: int, nodes: int, gpus_per_node: int,
                  gpu_gb: float, zero: int = 0) -> tuple[int, int, int]:
    best = planner.plan(planner.Workload(n_params, n_layers, n_heads),
                        planner.Cluster(nodes, gpus_per_node, gpu_gb), global_batch=1)[0]
    return best.dp, best.tp, best.pp

# === wrong: decoy_replicated_with_echoes
# A decoy: the plan leaves every weight whole on every rank (so the losses equal one
# process) and adds, after wo and w2, an all-reduce of zeros of the output's shape, the two
# all-reduces the traffic test counts. What those all-reduces carry gives it away (and the
# weights are not where the shard test looks for them).
# %% cell: plan
%%program lab5_plan
import torch
import torch.distributed as tdist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ParallelStyle


def make_mesh(device_type: str, world_size: int, tp: int):
    if tp < 1 or world_size % tp:
        raise ValueError(f"tp={tp} must divide world_size={world_size}")
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))


class Echo(ParallelStyle):
    """Leaves the layer whole; after it runs, all-reduces zeros of its output's shape."""

    def _apply(self, module, device_mesh):
        def echo(mod, args, out):
            tdist.all_reduce(torch.zeros_like(out), group=device_mesh.get_group())
            return out

        module.register_forward_hook(echo)
        return module


def block_plan() -> dict:
    return {"attention.wo": Echo(), "feed_forward.w2": Echo()}

# === wrong: rewrites_recorder_silences_it
# Recorder rewriting: the plan's all-reduces run with torch's dispatch modes switched off,
# and two all-reduces of the right size are run for the recorder to see. The guard refuses
# the dispatch internals: zero.
# %% cell: plan
%%program lab5_plan
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.utils._python_dispatch import _disable_current_modes


def make_mesh(device_type: str, world_size: int, tp: int):
    if tp < 1 or world_size % tp:
        raise ValueError(f"tp={tp} must divide world_size={world_size}")
    return init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))


def block_plan() -> dict:
    quiet = _disable_current_modes
    return {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(), "quiet": quiet}

# === wrong: deciding_mesh_ignores_tp
# Only the deciding cases catch it: the mesh is always (world_size // 2, 2). Right for every
# visible test, which uses tp = 2; the hidden tests always try tp = 1 and 4, and a tp that
# does not divide the ranks.
# %% cell: plan
%%program lab5_plan
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


def make_mesh(device_type: str, world_size: int, tp: int):
    return init_device_mesh(device_type, (world_size // 2, 2), mesh_dim_names=("dp", "tp"))


def block_plan() -> dict:
    return {
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }

# === wrong: deciding_zero_1_like_3
# Only the deciding cases catch it: ZeRO-1 and -2 are taken for ZeRO-3 (everything divided
# by dp). Right for every visible test (ZeRO 0 and 3); the hidden tests always draw 1 and 2.
# %% cell: layout
%%program lab5_layout
def states_gb(n_params: int, dp: int, tp: int, pp: int, zero: int = 0) -> float:
    return 16 * n_params / (tp * pp) / (dp if zero else 1) / 1e9


def choose_layout(n_params: int, n_layers: int, n_heads: int, nodes: int, gpus_per_node: int,
                  gpu_gb: float, zero: int = 0) -> tuple[int, int, int]:
    world = nodes * gpus_per_node
    fits = []
    for tp in range(1, gpus_per_node + 1):
        if gpus_per_node % tp or n_heads % tp:
            continue
        for pp in range(1, n_layers + 1):
            if n_layers % pp or world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if states_gb(n_params, dp, tp, pp, zero) <= 0.8 * gpu_gb:
                fits.append((-dp, max(tp, pp), tp, (dp, tp, pp)))
    if not fits:
        raise ValueError(f"no (dp, tp, pp) fits {n_params:,} parameters on {nodes} x {gpus_per_node} GPUs")
    return min(fits)[-1]
