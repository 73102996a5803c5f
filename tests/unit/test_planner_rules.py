"""The planner's memory rules: each framework's bytes per parameter as its own documentation
gives them, and the activations of the workbook's Llama block as autograd counts them."""

import pytest
import torch

from helpers.models import llama2
from helpers.parallel.composed import frameworks as F
from helpers.parallel.composed import workloads
from helpers.parallel.sharded.memory import saved_activation_bytes


@pytest.mark.parametrize(
    "name,d,per_param",
    [
        ("megatron", 8, 18),  # Megatron Core's table: bf16 params, fp32 grads, non-distributed
        ("megatron-distopt", 8, 6 + 12 / 8),  # ... distributed optimizer: 6 + 12/d
        ("megatron-fp16", 8, 20),  # fp16 params and grads: 20
        ("deepspeed-zero1-bf16", 4, 2 + 2 + (4 + 8 + 4) / 4),  # its default: bf16 gradients
        ("deepspeed-zero1-bf16-fp32-accum", 4, 6 + 12 / 4),  # BF16_Optimizer: fp32 gradients
        ("megatron-fp16-torch-ddp", 8, 20 + 2),  # + torch DDP's bucket copy of fp16 gradients
        ("ddp", 8, 4 + 4 + 8 + 4 + 4),  # + the bucket copy and Adam's foreach temporary
        ("ddp-bucket-view", 8, 4 + 4 + 8 + 4),  # the gradients are the buckets
        ("fsdp2-bf16", 8, (4 + 4 + 8 + 4) / 8),
    ],
)
def test_bytes_per_parameter_are_the_frameworks_tables(name, d, per_param):
    assert F.lookup(name).per_parameter(d) == pytest.approx(per_param)


def test_what_is_held_at_the_forward_peak_and_what_comes_later():
    p, largest = 1e9, 1e8
    ddp, view = F.lookup("ddp"), F.lookup("ddp-bucket-view")
    # at the end of the forward both hold 16 bytes a parameter: weights, Adam, the buckets
    assert sum(ddp.states(p, largest, 8).values()) == sum(view.states(p, largest, 8).values())
    assert sum(ddp.states(p, largest, 8).values()) == pytest.approx(16 * p)
    # later DDP without the view allocates param.grad beside its buckets: 4 bytes more
    assert ddp.late(p, largest, 8)["grads"] == 4 * p and view.late(p, largest, 8)["grads"] == 0
    fsdp = F.lookup("fsdp2-bf16")
    held = fsdp.states(p, largest, 8)
    assert held["gathered"] == 2 * 2 * largest  # two blocks of bf16 weights: this one, the next
    assert held["gradients"] == 0 and fsdp.late(p, largest, 8)["unsharded"] == 6 * largest
    with pytest.raises(KeyError, match="choose one of"):
        F.lookup("zero-4")
    with pytest.raises(ValueError, match="unknown"):
        F.Framework("x", 2, 2, 0, 8, sharded=("moment",))


def test_the_zero_papers_count_is_the_old_rule():
    z1 = F.zero_paper((2, 2, 12), 1)
    assert z1.per_parameter(8) == pytest.approx(4 + 12 / 8)  # what the planner used to charge
    assert F.zero_paper((2, 2, 12), 3).per_parameter(8) == pytest.approx(16 / 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dim,heads,kv", [(128, 4, None), (256, 8, 2), (384, 6, 3)])
def test_the_llama_block_rule_is_what_autograd_saves(dtype, dim, heads, kv):
    args = llama2.ModelArgs(dim=dim, n_layers=1, n_heads=heads, n_kv_heads=kv, vocab_size=64,
                            multiple_of=32, max_seq_len=32)  # fmt: skip
    torch.manual_seed(0)
    block = llama2.TransformerBlock(args).to(dtype)
    rope = llama2.rotary_tables(args.head_dim, 32, 1e4)
    x = torch.randn(2, 32, dim, dtype=dtype, requires_grad=True)
    counted = saved_activation_bytes(lambda t: block(t, rope), x, params=block)
    rule = workloads.llama_block_bytes(args, 32, dtype.itemsize)["block"]
    # two sequences, to the byte: the rotary table (4 hd a position) is saved once for both
    assert counted == 2 * rule - 4 * args.head_dim * 32
    if dtype == torch.bfloat16:  # Korthikanti's 34 s h undercounts this eager block by half
        assert rule > 1.5 * workloads.korthikanti(dim, 32)["block"]


def test_a_fused_norm_saves_less():
    args = llama2.CONFIGS["13B"]
    eager = workloads.llama_block_bytes(args, 4096)["block"]
    fused = workloads.llama_block_bytes(args, 4096, norm="fused")["block"]
    assert eager - fused == 4096 * 2 * (10 * 5120 + 4 - (2 * 5120 + 4))  # two norms
    with pytest.raises(ValueError, match="eager"):
        workloads.llama_block_bytes(args, 4096, norm="triton")
    # Megatron's own estimate (theoretical_memory_usage.py): s h (18 + 4 f / h), all split by TP
    meg = workloads.megatron_block_bytes(args, 4096)
    assert meg == {"block": 4096 * (18 * 5120 + 4 * 13824), "replicated": 0.0}
    assert meg["block"] < fused < eager


def _torchtitan_rmsnorm(norm, x):
    """torchtitan's 2024 eager RMSNorm (torchtitan/models/norms.py), written out: x cast to
    fp32 once, normalised, cast back, scaled."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)).type_as(x) * norm.weight


def test_the_torchtitan_norm_rule_is_what_autograd_saves():
    args = llama2.ModelArgs(dim=128, n_layers=1, n_heads=4, vocab_size=64, multiple_of=32,
                            max_seq_len=32)  # fmt: skip
    torch.manual_seed(0)
    block = llama2.TransformerBlock(args).to(torch.bfloat16)
    for norm in (block.attention_norm, block.ffn_norm):
        norm.forward = lambda x, norm=norm: _torchtitan_rmsnorm(norm, x)
    rope = llama2.rotary_tables(args.head_dim, 32, 1e4)
    x = torch.randn(2, 32, 128, dtype=torch.bfloat16, requires_grad=True)
    counted = saved_activation_bytes(lambda t: block(t, rope), x, params=block)
    rule = workloads.llama_block_bytes(args, 32, 2, norm="torchtitan")["block"]
    assert counted == 2 * rule - 4 * args.head_dim * 32  # the rotary table saved once
