"""The memory estimator: the ZeRO paper's table, DeepSpeed's own estimators, and activations
measured with saved-tensor hooks (single process; tests/distributed/test_fsdp.py measures
sharded states on real ranks)."""

import re

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.models import llama2
from helpers.parallel.sharded import memory as M

deepspeed = pytest.importorskip("deepspeed", reason="DeepSpeed is the optional [deepspeed] extra")
from deepspeed.runtime.zero.stage3 import (  # noqa: E402
    estimate_zero3_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs_all_cold,
    model_to_params,
)
from deepspeed.runtime.zero.stage_1_and_2 import (  # noqa: E402
    estimate_zero2_model_states_mem_needs,
    estimate_zero2_model_states_mem_needs_all_cold,
)

P7B = llama2.param_count(llama2.CONFIGS["7B"])


def test_seed_000_table_16_bytes_of_states_per_parameter():
    one_b = 10**9
    fp32 = M.estimate(one_b, precision="fp32")
    assert (fp32.params, fp32.grads, fp32.optimizer) == (4e9, 4e9, 8e9)
    mixed = M.estimate(one_b, precision="mixed")
    assert (mixed.params, mixed.grads, mixed.optimizer) == (2e9, 2e9, 12e9)
    # + 8 B/param of activations (seed 000's high-end estimate) = its 24 GB per billion
    assert fp32.total + 8 * one_b == 24e9
    assert M.estimate(one_b, optimizer="sgd").total == 8e9


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_each_stage_divides_one_more_state_by_n(precision):
    s = [M.estimate(P7B, dp=8, stage=k, precision=precision) for k in range(4)]
    base = s[0]
    assert s[1].optimizer == base.optimizer / 8 and s[1].grads == base.grads
    assert s[2].grads == base.grads / 8 and s[2].params == base.params
    assert s[3].params == base.params / 8
    assert [x.total for x in s] == sorted((x.total for x in s), reverse=True)
    # the ZeRO paper's figure 1 (7.5B, N=64, K=12): 120 GB -> 31.4 -> 16.6 -> 1.9 GB
    zero = [M.estimate(7_500_000_000, dp=64, stage=k, precision="mixed").total / 1e9
            for k in range(4)]  # fmt: skip
    assert [round(z, 1) for z in zero] == [120.0, 31.4, 16.6, 1.9]


def test_offload_moves_the_shards_to_the_cpu():
    on_gpu = M.estimate(P7B, dp=4, stage=2, precision="mixed")
    off = M.estimate(P7B, dp=4, stage=2, precision="mixed", offload=True)
    assert off.total == on_gpu.params and off.cpu == on_gpu.grads + on_gpu.optimizer


@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 64])
def test_agrees_with_deepspeed_zero2_and_zero3(gpus):
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
    total, largest = model_to_params(model)
    assert (total, largest) == (M.count_params(model), M.largest_layer(model))
    # DeepSpeed adds an fp32 copy of the gradient shard to the ZeRO paper's 2 + 2 + 12
    for offload in (False, True):
        _, ds2 = estimate_zero2_model_states_mem_needs(total, gpus, 1, cpu_offload=offload)
        ours2 = M.estimate(model, gpus, 2, "mixed", offload=offload, fp32_grad_shard=True)
        assert abs(ours2.total - ds2) <= 1, (offload, ours2, ds2)
        _, ds3, _ = estimate_zero3_model_states_mem_needs(
            total, largest, gpus, 1, cpu_offload=offload, cpu_offload_params=offload
        )
        ours3 = M.estimate(model, gpus, 3, "mixed", offload=offload, fp32_grad_shard=True)
        # ... and its ZeRO-3 sum leaves out the 16-bit weight shard (its comment: 18 = 2 grads
        # + 4 fp32 grads + 4 fp32 weights + 8 Adam), which we count: 2 B/param / N more
        assert abs(ours3.total - ours3.params - ds3) <= 1, (offload, ours3, ds3)


def _printed_gpu_gib(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\|\s+([\d.]+)GB \|", text)]


def test_agrees_with_deepspeeds_printed_all_cold_tables(capsys):
    largest = 4096 * 11008  # Llama 2 7B's largest matrix
    estimate_zero2_model_states_mem_needs_all_cold(P7B, num_gpus_per_node=8)
    estimate_zero3_model_states_mem_needs_all_cold(P7B, largest, num_gpus_per_node=8)
    printed = _printed_gpu_gib(capsys.readouterr().out)
    ours = [
        M.estimate(P7B, 8, 2, "mixed", offload=True, fp32_grad_shard=True).total,
        M.estimate(P7B, 8, 2, "mixed", fp32_grad_shard=True).total,
    ]
    # zero3 prints (params offloaded, optimizer offloaded), (optimizer only), (nothing) x 2
    assert printed[:2] == [round(b / 2**30, 2) for b in ours]
    zero3 = M.estimate(P7B, 8, 3, "mixed", largest=largest, fp32_grad_shard=True)
    assert round((zero3.total - zero3.params) / 2**30, 2) == printed[-1]


def test_bad_input_says_what_to_change():
    with pytest.raises(ValueError, match="stage=4"):
        M.estimate(1000, dp=2, stage=4)
    with pytest.raises(ValueError, match="precision='bf16'"):
        M.estimate(1000, precision="bf16")
    with pytest.raises(ValueError, match="stage >= 1"):
        M.estimate(1000, stage=0, offload=True)
    with pytest.raises(TypeError, match="positive parameter count"):
        M.estimate(-5)


def _blocks(hidden=64, heads=4, layers=3, attention="flash"):
    torch.manual_seed(0)
    return nn.ModuleList(M.GPTBlock(hidden, heads, attention=attention) for _ in range(layers))


@pytest.mark.parametrize("ckpt,attention", [(False, "flash"), (True, "flash"), (False, "eager")])
@pytest.mark.parametrize("shape", [(2, 64, 64, 4), (3, 40, 96, 6)])
def test_activation_estimate_within_10_percent_of_saved_tensors(ckpt, attention, shape):
    batch, seq, hidden, heads = shape
    blocks = _blocks(hidden, heads, layers=3, attention=attention)
    x = torch.randn(batch, seq, hidden, requires_grad=True)

    def forward(x):
        for b in blocks:
            # reentrant checkpointing saves its input through the hooks, and nothing else
            x = checkpoint(b, x, use_reentrant=True) if ckpt else b(x)
        return x.sum()

    measured = M.saved_activation_bytes(forward, x, params=blocks)
    predicted = M.activations(batch, seq, hidden, heads, layers=3, checkpoint=ckpt,
                              eager=attention == "eager").stored  # fmt: skip
    assert abs(measured - predicted) <= 0.10 * predicted, (measured, predicted)


def test_eager_attention_keeps_the_s_by_s_probabilities():
    flash = M.block_values(4096, 4096, 32, ffn=2 * 11008)
    eager = M.block_values(4096, 4096, 32, ffn=2 * 11008, eager=True)
    assert eager - flash == 4096 * 32 * (4096 - 1)  # a x s x s instead of a x s (log-sum-exp)
    with pytest.raises(ValueError, match="use 'flash' or 'eager'"):
        M.GPTBlock(64, 4, attention="sdpa")


def test_llama_7b_largest_fsdp_unit_is_a_decoder_block():
    args = llama2.CONFIGS["7B"]
    block = 4 * args.dim * args.dim + 3 * args.dim * args.ffn_hidden + 2 * args.dim
    assert M.llama_largest_unit(args) == block == 202_383_360 > args.vocab_size * args.dim


def test_checkpointing_keeps_one_value_per_token_and_channel_per_layer():
    full = M.activations(8, 4096, 4096, 32, layers=32, bytes_per_value=2)
    ckpt = M.activations(8, 4096, 4096, 32, layers=32, bytes_per_value=2, checkpoint=True)
    assert ckpt.stored == 32 * 8 * 4096 * 4096 * 2
    assert ckpt.peak == ckpt.stored + full.stored / 32
    assert full.stored / ckpt.stored == pytest.approx(16 + (32 + 4) / 4096)


def test_measure_states_counts_what_adam_adds():
    model = nn.Linear(100, 10)
    opt = torch.optim.Adam(model.parameters())
    assert M.measure_states(model, opt).total == 4 * 1010  # no grads, no state yet
    model(torch.randn(3, 100)).sum().backward()
    opt.step()
    got = M.measure_states(model, opt)
    want = M.estimate(model, precision="fp32", optimizer="adam")
    assert got.as_dict() == {k: v for k, v in want.as_dict().items()}


def test_deepspeed_job_uses_the_deepspeed_launcher_on_one_node_and_torchrun_across_nodes():
    import subprocess

    from helpers.cluster.jobscript import JobSpec, render
    from helpers.cluster.profiles import load_profile

    p = load_profile("engaging")
    spec = dict(name="ds-zero", profile=p, values=p.values({"env": "E"}), launcher="deepspeed",
                program="program.py", args=("--deepspeed_config", "c.json"), run_dir=".")  # fmt: skip
    one = render(JobSpec(nodes=1, gpus_per_node=4, **spec))
    last = one.rstrip("\n").splitlines()[-1]
    assert last == "deepspeed --num_gpus=4 --master_port=$PORT program.py --deepspeed_config c.json"
    assert "export OMP_NUM_THREADS=1" in one and "torchrun" not in last
    two = render(JobSpec(nodes=2, gpus_per_node=4, **spec))
    last = two.rstrip("\n").splitlines()[-1]
    assert last.startswith("srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=4")
    assert last.endswith("program.py --deepspeed_config c.json")
    for script in (one, two):  # both parse as bash
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
