"""CoAtNet cut in two (naive and pipelined) and tensor-parallel equals its serial model."""

import pytest
import torch

from helpers import launch
from helpers.models import coatnet as C
from helpers.parallel.composed import coatnet_parallel as CP

CFG = C.config("tiny", image_size=32)


def _data(seed=1, n=8):
    g = torch.Generator().manual_seed(seed)  # fresh inputs, not the notebook's
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def _model():
    torch.manual_seed(0)
    return C.CoAtNet(CFG)


def _pipe(d, m, schedule):
    torch.set_num_threads(1)
    x, y = _data()
    return CP.run_pipeline(d, _model(), x, y, m=m, schedule=schedule)


@pytest.mark.parametrize("m,schedule", [(1, "gpipe"), (4, "gpipe"), (4, "1f1b")])
def test_pipeline_equals_serial(m, schedule):
    out = launch.spawn(_pipe, 2, args=(m, schedule))
    x, y = _data()
    ref = CP.serial_step(_model(), x, y, m=m)
    torch.testing.assert_close(out[1]["loss"], ref["loss"], atol=1e-5, rtol=1e-5)
    assert out[0]["loss"] is None
    got = {**out[0]["grads"], **out[1]["grads"]}
    assert set(got) == set(ref["grads"])  # every parameter lives on exactly one rank
    assert not set(out[0]["grads"]) & set(out[1]["grads"])
    assert all(n.startswith(("stem", "stages.0", "stages.1")) for n in out[0]["grads"])
    for n, g in ref["grads"].items():
        torch.testing.assert_close(got[n], g, atol=1e-5, rtol=1e-4, msg=n)
    # m micro-batches: m forwards and m backwards on each rank
    assert sum(e.kind == "F" for e in out[0]["events"]) == m


def _tp(d):
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    x, y = _data(2)
    model = CP.apply_tp(_model(), init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
    out = CP.serial_step(model, x, y)
    full = {
        n: (g.full_tensor() if hasattr(g, "full_tensor") else g) for n, g in out["grads"].items()
    }
    q = model.stages[2][0].attn.q.weight
    return {"loss": out["loss"], "grads": full, "q_local": tuple(q.to_local().shape)}


def test_tp_equals_serial_and_shards_only_transformer_blocks():
    out = launch.spawn(_tp, 2)
    x, y = _data(2)
    model = _model()
    ref = CP.serial_step(model, x, y)
    for o in out:
        torch.testing.assert_close(o["loss"], ref["loss"], atol=1e-5, rtol=1e-5)
        for n, g in ref["grads"].items():
            torch.testing.assert_close(o["grads"][n], g, atol=1e-5, rtol=1e-4, msg=n)
    assert out[0]["q_local"] == (32, 32)  # 64 output features (4 heads) split over 2 ranks


def test_bad_cut_and_bad_tp_are_refused():
    with pytest.raises(ValueError, match="choose 1.."):
        CP.split(_model(), at=0)
    rows = CP.tp_traffic(C.CONFIGS["CoAtNet-0"])
    conv = [r["bytes_per_flop"] for r in rows if r["kind"] == "C"]
    attn = [r["bytes_per_flop"] for r in rows if r["kind"] == "T"]
    assert min(conv) > max(attn)  # convolutions communicate more per FLOP under TP
