"""A TP model steps with the optimizer path a GPU takes.

On CUDA, torch's optimizers default to their ``foreach`` implementation (one kernel over all
the tensors of a parameter group); on the CPU to a loop over the tensors. The foreach kernels
refuse a list that mixes DTensors (what a DTensor plan made of the sharded layers) with plain
tensors (what it left alone), so ``AdamW(model.parameters())`` over a partly parallelized model
crashed on every GPU (the H100 run of issue 30, 06's tp-decoder jobs) and never on CPU ranks.
``helpers.parallel.tp.param_groups`` gives each kind its own group. These tests take the GPU's
path on CPU ranks: ``foreach=True``, or torch's own default made to choose foreach as on CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from helpers import launch
from helpers.parallel import tp as TP
from helpers.parallel import tp_inference as TI
from helpers.parallel.memory import local_tensor

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
MIXED = "got mixed torch.Tensor and DTensor"
# torch's optimizers pick foreach where _get_foreach_kernels_supported_devices() lists the
# parameters' device: CUDA's default, here on the CPU. Then the program under test runs.
AS_ON_A_GPU = """
import os
import runpy

import torch.optim.optimizer as optimizer

optimizer._get_foreach_kernels_supported_devices = lambda: ["cpu"]
runpy.run_path(os.environ["PROGRAM_UNDER_TEST"], run_name="__main__")
"""


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

    from helpers.parallel import tp_memory as TM

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


def _written_by(notebook: str, target: str) -> str:
    """The program a notebook's ``%%writefile target`` cell writes (as the notebook has it now)."""
    for cell in json.loads((NOTEBOOKS / notebook).read_text())["cells"]:
        source = "".join(cell["source"])
        if source.startswith(f"%%writefile {target}\n"):
            return source.split("\n", 1)[1]
    raise LookupError(f"{notebook} has no %%writefile {target} cell")


def test_06s_tp_decoder_job_steps_with_the_gpus_optimizer_default(tmp_path, monkeypatch):
    """06's tp-decoder-1n/2n program, on 2 ranks whose AdamW takes foreach as on CUDA."""
    monkeypatch.setenv("WORKBOOK_RUNS", str(tmp_path / "runs"))
    program = tmp_path / "tp_train.py"
    program.write_text(_written_by("06_tensor_parallel.ipynb", "{TP_PROGRAM}"))
    wrapper = tmp_path / "as_on_a_gpu.py"
    wrapper.write_text(AS_ON_A_GPU)
    res = launch.run(wrapper, nproc=2, args=["--tp", "2", "--steps", "2"], timeout=180,
                     env={"PROGRAM_UNDER_TEST": str(program)}, stream=False)  # fmt: skip
    assert res.ok, res.traceback
    assert res.metrics["tp"] == 2 and res.metrics["loss"] < 4.3
