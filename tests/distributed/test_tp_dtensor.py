"""DTensor tensor parallelism (parallelize_module) equals the hand-written layers and the
serial model, forward and backward, on 2 and 4 gloo ranks of a "cpu" DeviceMesh (fp32, 1e-5).

Both plans of helpers.parallel.tensor.tp_inference.block_plan: plain TP (ColwiseParallel,
RowwiseParallel) and sequence parallelism (SequenceParallel norms, PrepareModuleInput,
row-wise outputs Shard(1)).
"""

import pytest
import torch
from torch import nn

from helpers import launch
from helpers.parallel.tensor import tp_inference as TI

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 64, (2, 8), generator=g), torch.randint(0, 64, (2, 8), generator=g)


def _step(model, tokens, targets):
    logits = model(tokens)
    nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return logits.detach(), TI.local_grads(model)


def _both_rank(d, tokens, targets, sequence_parallel):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (d.world_size,), mesh_dim_names=("tp",))
    by_dtensor = _step(
        TI.apply_dtensor_tp(TI.tiny_decoder(), mesh, sequence_parallel), tokens, targets
    )
    by_hand = _step(TI.shard_decoder(TI.tiny_decoder()), tokens, targets)
    return by_dtensor, by_hand


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_dtensor_equals_hand_written_and_serial(world, sequence_parallel):
    tokens, targets = _batch()
    serial = TI.tiny_decoder()
    logits_ref, _ = _step(serial, tokens, targets)
    out = launch.spawn(_both_rank, world, (tokens, targets, sequence_parallel))
    for rank, ((logits_dt, grads_dt), (logits_hand, grads_hand)) in enumerate(out):
        want = TI.shard_names(serial, rank, world, grads=True)
        assert sorted(grads_dt) == sorted(want) == sorted(grads_hand)
        torch.testing.assert_close(logits_dt, logits_ref, **TOL)
        torch.testing.assert_close(logits_dt, logits_hand, **TOL)
        for name, g in grads_dt.items():
            where = f"{name} on rank {rank} of {world}"
            torch.testing.assert_close(g, want[name], **TOL, msg=lambda m, w=where: f"{w}: {m}")
            torch.testing.assert_close(
                g, grads_hand[name], **TOL, msg=lambda m, w=where: f"{w}: {m}"
            )


def _generate_rank(d, prompt):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (d.world_size,), mesh_dim_names=("tp",))
    tokens, cache = TI.generate(TI.apply_dtensor_tp(TI.tiny_decoder(), mesh), prompt, 8)
    return tokens, tuple(cache.k[0].shape)


def test_dtensor_greedy_generation_gives_the_unsharded_tokens():
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(7))
    ref, _ = TI.generate(TI.tiny_decoder(), prompt, 8)
    for rank, (tokens, shape) in enumerate(launch.spawn(_generate_rank, 2, (prompt,))):
        assert torch.equal(tokens, ref), f"rank {rank}"
        assert shape[1] == TI.DecoderConfig().n_heads // 2  # the cache holds this rank's heads
