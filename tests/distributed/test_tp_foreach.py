"""A TP model steps with the optimizer path a GPU takes.

On CUDA, torch's optimizers default to their ``foreach`` implementation (one kernel over all
the tensors of a parameter group); on the CPU to a loop over the tensors. The foreach kernels
refuse a list that mixes DTensors (what a DTensor plan made of the sharded layers) with plain
tensors (what it left alone), so ``AdamW(model.parameters())`` over a partly parallelized model
crashed on every GPU (the H100 run of issue 30, 06's tp-decoder jobs) and never on CPU ranks.
``helpers.parallel.tensor.tp.param_groups`` gives each kind its own group. These tests take the GPU's
path on CPU ranks: ``foreach=True``, or torch's own default made to choose foreach as on CUDA.
06's tp-decoder jobs themselves are checked by the dry run in the notebook's test
(tests/notebooks/test_execute.py), whose stand-in GPU takes CUDA's foreach default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers import launch
from helpers.parallel.sharded.memory import local_tensor
from helpers.parallel.tensor import tp as TP
from helpers.parallel.tensor import tp_inference as TI

MIXED = "got mixed torch.Tensor and DTensor"


def _train(d, sequence_parallel: bool, grouped: bool, foreach: bool):
    """Two AdamW steps of the DTensor-parallel decoder: this rank's shards, or the error."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (d.world_size,))
    model = TI.apply_dtensor_tp(TI.tiny_decoder(), mesh, sequence_parallel)
    params = TP.param_groups(model.parameters()) if grouped else model.parameters()
    opt = torch.optim.AdamW(params, lr=1e-2, foreach=foreach)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    try:
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
            TI.sync_partial_grads(model)  # the sequence-parallel norms' partial gradients
            opt.step()
    except RuntimeError as e:
        return str(e)
    return {n: local_tensor(p).detach().clone() for n, p in model.named_parameters()}


def _on_each_rank(d):
    import torch.optim.optimizer as optimizer

    from helpers.parallel.tensor import tp_memory as TM

    out = {}
    for sp in (False, True):
        out["loop", sp] = _train(d, sp, grouped=False, foreach=False)  # the CPU's default
        out["foreach, one group", sp] = _train(d, sp, grouped=False, foreach=True)
        out["foreach, param_groups", sp] = _train(d, sp, grouped=True, foreach=True)
    # 06's memory measurement, its AdamW left to torch's default, made CUDA's (this rank only)
    optimizer._get_foreach_kernels_supported_devices = lambda: ["cpu"]
    out["measure_rank"] = TM.measure_rank(d, TI.DecoderConfig(), 2, 8, "sp-dtensor")
    return out


def test_param_groups_step_with_foreach_as_the_loop_does():
    for rank, out in enumerate(launch.spawn(_on_each_rank, 2)):
        for sp in (False, True):
            assert MIXED in str(out["foreach, one group", sp])  # what the H100 met
            loop, grouped = out["loop", sp], out["foreach, param_groups", sp]
            assert isinstance(grouped, dict), f"rank {rank}, sequence parallel {sp}: {grouped}"
            assert sorted(grouped) == sorted(loop)
            for name, value in grouped.items():
                torch.testing.assert_close(value, loop[name], msg=f"{name} on rank {rank}, {sp}")
        assert out["measure_rank"]["optimizer"] > 0


def test_param_groups_keeps_one_kind_per_group():
    plain = [torch.nn.Parameter(torch.ones(2)) for _ in range(3)]
    assert TP.param_groups(plain) == [{"params": plain}]
    assert TP.param_groups([]) == []
