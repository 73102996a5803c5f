"""helpers.parallel.sharded.zero without ranks: the ZeRO paper's traffic per stage, the ring factors
that turn recorded calls into bytes sent, any optimizer class, and the GPU DeepSpeed config."""

import pytest
import torch
from torch import nn

from helpers.dist import Dist
from helpers.parallel.sharded import zero


@pytest.mark.parametrize("n", [2, 4, 8])
def test_stage_3_sends_one_and_a_half_times_ddp(n):
    p = 1000 * n
    ddp, z3 = zero.step_traffic(p, n, stage=0), zero.step_traffic(p, n, stage=3)
    assert ddp["sent"] == pytest.approx(2 * (n - 1) / n * 4 * p)
    assert z3["sent"] == pytest.approx(1.5 * ddp["sent"])
    assert z3["all_gather_into_tensor"] == 2 * 4 * p / n  # forward and backward, a shard each
    z2 = zero.step_traffic(p, n, stage=3, reshard=False)  # one gather: ZeRO-2's volume
    assert z2["sent"] == pytest.approx(ddp["sent"])
    assert (
        zero.step_traffic(p, n, stage=3, param_bytes=2)["all_gather_into_tensor"] == 2 * 2 * p / n
    )


def test_sent_bytes_of_recorded_calls():
    calls = [("all_gather_into_tensor", 100), ("reduce_scatter_tensor", 400), ("all_reduce", 40)]
    assert zero.sent_bytes(calls, 4) == pytest.approx(3 * 100 + 0.75 * 400 + 1.5 * 40)
    with pytest.raises(ValueError, match="no ring volume for 'send'"):
        zero.sent_bytes([("send", 8)], 2)


def test_zero1_takes_any_optimizer_class_and_its_settings():
    model = nn.Linear(4, 2)
    with pytest.raises(TypeError, match="give an optimizer class"):
        zero.zero1_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="leave optimizer at torch.optim.AdamW"):
        zero.run_steps(
            Dist(), model, torch.zeros(2, 4), torch.zeros(2), 1, 0.1, "ds2", torch.optim.SGD
        )


def test_deepspeed_gpu_config_has_bf16_overlap_and_offload():
    cpu = zero.deepspeed_config(2, 8, 2, 1e-2)
    gpu = zero.deepspeed_config(3, 8, None, 1e-4, gpu=True)  # any number of GPUs
    assert "bf16" not in cpu and cpu["optimizer"]["params"]["torch_adam"]
    assert gpu["bf16"] == {"enabled": True} and "torch_adam" not in gpu["optimizer"]["params"]
    assert gpu["zero_optimization"]["overlap_comm"] is True
    assert gpu["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "train_batch_size" not in gpu and cpu["train_batch_size"] == 16
