"""ZeRO stages side by side: DDP (stage 0), ZeroRedundancyOptimizer (1), FSDP2 (2-ish, 3) and
DeepSpeed (1, 2, 3), trained on the same data so their losses and parameters can be compared.

    ZeRO-1  torch.distributed.optim.ZeroRedundancyOptimizer: each rank keeps the optimizer
            state of some whole tensors (a greedy split by size: uneven when tensors differ)
    ZeRO-2  FSDP2 with reshard_after_forward=False (weights stay gathered forward->backward),
            DeepSpeed stage 2 (grads reduce-scattered, weights replicated)
    ZeRO-3  FSDP2 fully_shard; DeepSpeed stage 3

    out = run_steps(d, model, x, y, steps=5, lr=1e-2, mode="fsdp")
    out["losses"]  global mean loss per step      out["params"]  all parameters, flattened
    out["states"]  bytes this rank holds (helpers.parallel.memory.measure_states)

Every mode sees the same global batch ``x, y``; rank r trains on its 1/N slice, so all of
them take exactly the step one process would take on the whole batch.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.dist import Dist
from helpers.parallel import fsdp, memory

__all__ = [
    "MODES",
    "zero1_optimizer",
    "shard_numels",
    "deepspeed_config",
    "run_steps",
]

MODES = ("single", "ddp", "zero1", "fsdp", "fsdp-noreshard", "ds1", "ds2", "ds3")
WEIGHT_DECAY = 0.01


def zero1_optimizer(model: nn.Module, lr: float) -> ZeroRedundancyOptimizer:
    """AdamW whose state is split over the ranks by whole tensors (ZeRO-1)."""
    return ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr, weight_decay=WEIGHT_DECAY
    )


def shard_numels(opt: ZeroRedundancyOptimizer) -> list[int]:
    """Parameter elements each rank owns under ZeroRedundancyOptimizer (its whole-tensor split)."""
    groups = opt._partition_parameters()  # [rank][param group] -> params; no public accessor
    return [sum(p.numel() for g in per_rank for p in g["params"]) for per_rank in groups]


def deepspeed_config(stage: int, micro_batch: int, world_size: int, lr: float) -> dict:
    """A ds_config for ZeRO ``stage`` with fp32 AdamW (the same optimizer as the torch modes).
    ``torch_adam``: use torch's AdamW, not DeepSpeed's fused or CPU Adam, which compile C++ on
    first use (minutes)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"DeepSpeed ZeRO stage={stage!r}: use 0, 1, 2 or 3")
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch * world_size,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": lr, "weight_decay": WEIGHT_DECAY, "torch_adam": True},
        },
        "zero_optimization": {"stage": stage},
        "gradient_clipping": 0.0,  # DeepSpeed 0.19 clips to norm 1.0 unless told; torch does not
        "steps_per_print": 10**9,  # quiet
    }


def _mean_over_ranks(value: torch.Tensor, d: Dist) -> float:
    value = value.detach().clone()
    if d.world_size > 1:
        tdist.all_reduce(value)
    return value.item() / d.world_size


def _wrap(d: Dist, model: nn.Module, mode: str, lr: float):
    """(module to call, optimizer) for a torch mode."""
    adamw = {"lr": lr, "weight_decay": WEIGHT_DECAY}
    if mode == "single":
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    if mode in ("ddp", "zero1"):
        wrapped = DDP(model) if d.world_size > 1 else model
        opt = zero1_optimizer(model, lr) if mode == "zero1" else None
        return wrapped, opt or torch.optim.AdamW(model.parameters(), **adamw)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(d.device.type, (d.world_size,))
    fsdp.apply_fsdp(model, mesh, reshard_after_forward=(mode == "fsdp"))
    return model, torch.optim.AdamW(model.parameters(), **adamw)


def _deepspeed_steps(d: Dist, model, xs, ys, steps: int, lr: float, stage: int):
    import deepspeed

    cfg = deepspeed_config(stage, len(xs), d.world_size, lr)
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


def run_steps(d: Dist, model: nn.Module, x, y, steps: int, lr: float, mode: str) -> dict:
    """Train ``model`` (identical on every rank) for ``steps`` AdamW steps in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {MODES}")
    if len(x) % d.world_size:
        raise ValueError(f"the batch of {len(x)} does not split into {d.world_size} equal slices")
    xs, ys = x.chunk(d.world_size)[d.rank], y.chunk(d.world_size)[d.rank]
    if mode.startswith("ds"):
        return _deepspeed_steps(d, model, xs, ys, steps, lr, stage=int(mode[2:]))
    module, opt = _wrap(d, model, mode, lr)
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
