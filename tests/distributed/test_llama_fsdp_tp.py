"""Tiny Llama 2 with FSDP + TP (2 x 2 on 4 gloo ranks) trains exactly like the 1-rank model."""

import pytest
import torch

from helpers import launch
from helpers.programs import train_llama as T


def _run(d, cfg):
    torch.set_num_threads(1)
    out = T.train(d, cfg)
    return out["losses"]


def _shards(d, cfg):
    torch.set_num_threads(1)
    _, mesh, model = T.build(d, cfg)
    wq = model.layers["0"].attention.wq.weight
    w2 = model.layers["0"].feed_forward.w2.weight
    return {
        "coords": (mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()),
        "wq_local": tuple(wq.to_local().shape),
        "w2_local": tuple(w2.to_local().shape),
        "mesh_dims": wq.device_mesh.mesh_dim_names,
        "wq_full": wq.full_tensor(),  # gathered over dp and tp: must be the serial weight
    }


@pytest.mark.parametrize("loss_parallel", [False, True])
def test_fsdp_tp_2x2_losses_equal_one_rank(loss_parallel):
    cfg = T.LlamaConfig(
        tp=2, batch_size=4, seq_len=16, steps=5, lr=0.5, loss_parallel=loss_parallel, peak_flops=1e9
    )
    ref = T.serial_losses(cfg)
    per_rank = launch.spawn(_run, 4, args=(cfg,))
    for losses in per_rank:  # every rank reports the same global-batch loss
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), atol=1e-4, rtol=0)
    assert ref[-1] < ref[0], "the tiny model should learn the synthetic sequences"


def test_weights_are_2d_sharded():
    cfg = T.LlamaConfig(tp=2)
    out = launch.spawn(_shards, 4, args=(cfg,))
    assert [o["coords"] for o in out] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # wq (64 x 64): TP splits its rows (column-wise = output features), FSDP splits them again
    assert all(o["wq_local"] == (16, 64) for o in out)
    # w2 (64 x 192): TP splits its columns (row-wise = input features), FSDP its rows
    assert all(o["w2_local"] == (32, 96) for o in out)
    assert out[0]["mesh_dims"] == ("dp", "tp")  # one DTensor sharded over both dimensions
    from helpers.models import llama2

    serial = llama2.Transformer(llama2.CONFIGS["tiny"]).init_weights(cfg.seed)
    for o in out:
        torch.testing.assert_close(o["wq_full"], serial.layers["0"].attention.wq.weight)


def test_tp_that_does_not_divide_heads_is_refused():
    from helpers.models import llama2
    from helpers.parallel.composed.llama_parallel import check_tp_degree

    with pytest.raises(ValueError, match="n_kv_heads"):
        check_tp_degree(llama2.CONFIGS["tiny"], 4)


def _phases(d, cfg):
    torch.set_num_threads(1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        T.train(d, cfg)
    return {e.name for e in prof.events()}


def test_a_step_has_named_phases_for_the_profilers():
    # the same names become NVTX ranges in the generated nsys job on GPUs
    cfg = T.LlamaConfig(tp=2, batch_size=2, seq_len=8, steps=1, peak_flops=1e9)
    for names in launch.spawn(_phases, 2, args=(cfg,)):
        assert {"forward", "backward", "optimizer"} <= names, sorted(names)[:20]
