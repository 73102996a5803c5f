"""ZeRO stages side by side: DDP (stage 0), ZeroRedundancyOptimizer (1), FSDP2 (2-ish, 3) and
DeepSpeed (1, 2, 3), trained on the same data so their losses and parameters can be compared,
and what each stage sends per step.

    ZeRO-1  torch.distributed.optim.ZeroRedundancyOptimizer: each rank keeps the optimizer
            state of some whole tensors (a greedy split by size: uneven when tensors differ)
    ZeRO-2  FSDP2 with reshard_after_forward=False (weights stay gathered forward->backward),
            DeepSpeed stage 2 (grads reduce-scattered, weights replicated)
    ZeRO-3  FSDP2 fully_shard; DeepSpeed stage 3

    out = run_steps(d, model, x, y, steps=5, lr=1e-2, mode="fsdp")        # AdamW, wd 0.01
    out = run_steps(d, model, x, y, 5, 0.1, "zero1", torch.optim.SGD, momentum=0.9)
    out["losses"]  global mean loss per step      out["params"]  all parameters, flattened
    out["states"]  bytes this rank holds (helpers.parallel.sharded.memory.measure_states)

Every mode sees the same global batch ``x, y``; rank r trains on its 1/N slice, so all of
them take exactly the step one process would take on the whole batch.

Communication per step and rank (the ZeRO paper, section 7), for a model of P parameters of
b bytes (Psi = P b) on N ranks, counted as a bandwidth-optimal (ring) algorithm sends it:

    collective        bytes a rank puts in    bytes it sends
    all-reduce        M (the whole tensor)    2 (N-1)/N M   (a reduce-scatter + an all-gather)
    reduce-scatter    M (the whole tensor)    (N-1)/N M
    all-gather        M/N (its own piece)     (N-1)/N M
    broadcast         M (root and receivers)  (N-1)/N M     (averaged over the ranks)

    DDP, ZeRO-1, ZeRO-2   2 (N-1)/N Psi   all-reduce, or reduce-scatter + all-gather
    ZeRO-3 (FSDP)         3 (N-1)/N Psi   all-gather forward and backward + reduce-scatter

``step_traffic(P, N, stage)`` gives both columns; ``sent_bytes(calls, N)`` converts what a
rank was seen putting into its collectives (helpers.course.grading.recorder.traffic) into bytes sent.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist import Dist
from helpers.parallel.sharded import fsdp, memory

__all__ = [
    "MODES",
    "ADAMW",
    "zero1_optimizer",
    "shard_numels",
    "deepspeed_config",
    "run_steps",
    "wrap",
    "step_traffic",
    "sent_bytes",
]

MODES = ("single", "ddp", "zero1", "fsdp", "fsdp-noreshard", "ds1", "ds2", "ds3")
ADAMW = {"weight_decay": 0.01}  # the default optimizer's settings (torch's AdamW default too)
# What each collective sends over a ring, per byte a rank puts in (module docstring).
RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather_into_tensor": lambda n: n - 1,
    "all_gather": lambda n: n - 1,
    "broadcast": lambda n: (n - 1) / n,
}


def zero1_optimizer(params, optimizer=torch.optim.AdamW, **settings) -> ZeroRedundancyOptimizer:
    """Any torch optimizer (class and its settings) with its state split over the ranks by
    whole tensors (ZeRO-1). ``params``: a module or its parameters.

        zero1_optimizer(model, torch.optim.AdamW, lr=1e-3, weight_decay=0.01)
        zero1_optimizer(model, torch.optim.SGD, lr=0.1, momentum=0.9)
    """
    if isinstance(params, nn.Module):
        params = params.parameters()
    if not (isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer)):
        raise TypeError(f"optimizer={optimizer!r}: give an optimizer class such as "
                        "torch.optim.AdamW, and its settings as keywords (lr=..., ...)")  # fmt: skip
    return ZeroRedundancyOptimizer(params, optimizer_class=optimizer, **settings)


def shard_numels(opt: ZeroRedundancyOptimizer) -> list[int]:
    """Parameter elements each rank owns under ZeroRedundancyOptimizer (its whole-tensor split)."""
    groups = opt._partition_parameters()  # [rank][param group] -> params; no public accessor
    return [sum(p.numel() for g in per_rank for p in g["params"]) for per_rank in groups]


def deepspeed_config(stage: int, micro_batch: int, world_size: int | None, lr: float,
                     gpu: bool = False, weight_decay: float = 0.01) -> dict:  # fmt: skip
    """A ds_config for ZeRO ``stage`` with AdamW.

    ``world_size``: the data-parallel ranks, to state ``train_batch_size`` (DeepSpeed refuses
    a config whose batch is not micro-batch x accumulation x ranks); None leaves it out, and
    DeepSpeed computes it, so one config serves a job on any number of GPUs.

    ``gpu=False`` (the laptop's exact comparison): fp32, and ``torch_adam`` (torch's AdamW,
    not DeepSpeed's fused or CPU Adam, which compile C++ on first use: minutes).
    ``gpu=True`` (a cluster job): bf16 compute with fp32 master weights; ``overlap_comm``
    (gradient reductions on their own stream, overlapping backward); ``offload_optimizer``
    to pinned host memory, where DeepSpeed's CPU Adam steps the fp32 master weights.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"DeepSpeed ZeRO stage={stage!r}: use 0, 1, 2 or 3")
    zero_opt: dict = {"stage": stage}
    adam = {"lr": lr, "weight_decay": weight_decay}
    if gpu:
        zero_opt.update(overlap_comm=True, contiguous_gradients=True)
        if stage >= 1:
            zero_opt["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    else:
        adam["torch_adam"] = True
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": adam},
        "zero_optimization": zero_opt,
        "gradient_clipping": 0.0,  # DeepSpeed 0.19 clips to norm 1.0 unless told; torch does not
        "steps_per_print": 10**9,  # quiet
    }
    if world_size is not None:
        config["train_batch_size"] = micro_batch * world_size
    if gpu:
        config["bf16"] = {"enabled": True}
    return config


def step_traffic(params: int, dp: int, stage: int, param_bytes: int = 4, grad_bytes: int = 4,
                 reshard: bool = True) -> dict:  # fmt: skip
    """Bytes one rank puts into each collective in a training step, and the total it sends
    over a ring ("sent"), for ``params`` parameters on ``dp`` ranks. Stage 0/1/2: one
    all-reduce of the gradients (DDP's, and ZeRO-1/2 reduce-scatter + all-gather moves as
    much); stage 3: all-gathers of the weights (``param_bytes`` each; forward, and backward
    again unless ``reshard=False``) and one reduce-scatter of the gradients (``grad_bytes``)."""
    memory._check(dp, stage, "fp32", "adam", False)
    if stage < 3:
        put = {"all_reduce": params * grad_bytes}
    else:
        gathers = 2 if reshard else 1
        put = {"all_gather_into_tensor": gathers * params * param_bytes / dp,
               "reduce_scatter_tensor": params * grad_bytes}  # fmt: skip
    return {**put, "sent": sum(RING_FACTOR[k](dp) * v for k, v in put.items())}


def sent_bytes(calls, world: int) -> float:
    """Bytes a ring sends for the collectives a rank was seen calling: ``calls`` are
    (name, bytes put in) pairs, or helpers.course.grading.recorder.traffic.Call objects."""
    total = 0.0
    for call in calls:
        name, nbytes = (call.name, call.bytes) if hasattr(call, "name") else call
        if name not in RING_FACTOR:
            raise ValueError(f"no ring volume for {name!r}: known {sorted(RING_FACTOR)}")
        total += RING_FACTOR[name](world) * nbytes
    return total


def _mean_over_ranks(value: torch.Tensor, d: Dist) -> float:
    value = value.detach().clone()
    if d.world_size > 1:
        tdist.all_reduce(value)
    return value.item() / d.world_size


def wrap(d: Dist, model: nn.Module, mode: str, optimizer=torch.optim.AdamW, **settings):
    """(module to call, optimizer) for a torch mode: "single", "ddp", "zero1" (DDP +
    ZeroRedundancyOptimizer), "fsdp-noreshard" (ZeRO-2-like) or "fsdp" (ZeRO-3)."""
    if mode not in MODES or mode.startswith("ds"):
        raise ValueError(f"mode={mode!r}: choose one of {MODES[:5]} (DeepSpeed: run_steps)")
    if mode == "single":
        return model, optimizer(model.parameters(), **settings)
    if mode in ("ddp", "zero1"):
        wrapped = DDP(model) if d.world_size > 1 else model
        if mode == "zero1":
            return wrapped, zero1_optimizer(model, optimizer, **settings)
        return wrapped, optimizer(model.parameters(), **settings)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(d.device.type, (d.world_size,))
    fsdp.apply_fsdp(model, mesh, reshard_after_forward=(mode == "fsdp"))
    return model, optimizer(model.parameters(), **settings)


def _deepspeed_steps(d: Dist, model, xs, ys, steps: int, lr: float, stage: int, settings: dict):
    import deepspeed

    from helpers import standin

    standin.deepspeed_through_torch()  # on CPU ranks too: torch.distributed, not a compiled kernel
    cfg = deepspeed_config(stage, len(xs), d.world_size, lr,
                           weight_decay=settings.get("weight_decay", 0.01))  # fmt: skip
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=cfg
    )
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(engine(xs), ys)
        engine.backward(loss)
        engine.step()
        losses.append(_mean_over_ranks(loss, d))
    if stage == 3:  # gather the partitioned weights to compare them
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            params = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    else:
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"losses": losses, "params": params}


def run_steps(d: Dist, model: nn.Module, x, y, steps: int, lr: float, mode: str,
              optimizer=torch.optim.AdamW, **settings) -> dict:  # fmt: skip
    """Train ``model`` (identical on every rank) for ``steps`` steps of ``optimizer`` (a
    class; default AdamW with weight decay 0.01) with ``lr`` and ``settings``, in ``mode``.
    DeepSpeed modes ("ds1".."ds3") build their own AdamW from the config."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {MODES}")
    if len(x) % d.world_size:
        raise ValueError(f"the batch of {len(x)} does not split into {d.world_size} equal slices")
    if optimizer is torch.optim.AdamW:
        settings = {**ADAMW, **settings}
    settings = {"lr": lr, **settings}
    xs, ys = x.chunk(d.world_size)[d.rank], y.chunk(d.world_size)[d.rank]
    if mode.startswith("ds"):
        if optimizer is not torch.optim.AdamW:
            raise ValueError(f"mode={mode!r} builds DeepSpeed's AdamW from its config: leave "
                             "optimizer at torch.optim.AdamW")  # fmt: skip
        return _deepspeed_steps(d, model, xs, ys, steps, lr, int(mode[2:]), settings)
    module, opt = wrap(d, model, mode, optimizer, **settings)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)  # keep the gradients: measure_states counts them
        loss = nn.functional.cross_entropy(module(xs), ys)
        loss.backward()
        opt.step()
        losses.append(_mean_over_ranks(loss, d))
    return {
        "losses": losses,
        "params": fsdp.full_params(model),
        "states": memory.measure_states(model, opt),
        "local_numel": fsdp.local_numels(model),
    }
