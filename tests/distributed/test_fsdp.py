"""Sharded data parallelism on real gloo ranks: every ZeRO stage trains exactly like one process;
the memory estimator predicts what each rank really holds; DCP checkpoints change world size;
DeepSpeed's stages give FSDP's losses."""

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from helpers import launch
from helpers.dist import Dist
from helpers.parallel.sharded import fsdp, memory, zero

STEPS, LR = 4, 1e-2


def _mlp(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10)).to(dtype)  # fmt: skip


def _batch(n=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=g, dtype=dtype), torch.randint(0, 10, (n,), generator=g)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _modes(d: Dist, modes, x, y):
    return {m: zero.run_steps(d, _mlp(x.dtype), x, y, STEPS, LR, m) for m in modes}


@pytest.mark.parametrize("world", [2, 4])
def test_every_stage_equals_one_process(world):
    # float64: the stages differ from one process by rounding only (~1e-16), which Adam's
    # m / sqrt(v) can amplify where a gradient is near zero; fp32 agrees to ~1e-5
    x, y = _batch(dtype=torch.float64)
    ref = zero.run_steps(Dist(), _mlp(torch.float64), x, y, STEPS, LR, "single")
    modes = ("ddp", "zero1", "fsdp", "fsdp-noreshard")
    for rank, outs in enumerate(launch.spawn(_modes, world, args=(modes, x, y))):
        for mode, out in outs.items():
            where = f"{mode}, rank {rank} of {world}"
            torch.testing.assert_close(out["losses"], ref["losses"], rtol=1e-9, atol=1e-10,
                                       msg=lambda m, w=where: f"losses, {w}: {m}")  # fmt: skip
            torch.testing.assert_close(out["params"], ref["params"], rtol=1e-9, atol=1e-10,
                                       msg=lambda m, w=where: f"parameters, {w}: {m}")  # fmt: skip
    assert ref["losses"][-1] < ref["losses"][0]


def _sgd(d: Dist, x, y):
    return {m: zero.run_steps(d, _mlp(x.dtype), x, y, 2, 0.1, m, torch.optim.SGD, momentum=0.9)
            for m in ("zero1", "fsdp")}  # fmt: skip


def test_any_optimizer_class_and_its_settings():
    x, y = _batch(dtype=torch.float64)
    ref = zero.run_steps(Dist(), _mlp(torch.float64), x, y, 2, 0.1, "single", torch.optim.SGD,
                         momentum=0.9)  # fmt: skip
    adamw = zero.run_steps(Dist(), _mlp(torch.float64), x, y, 2, 0.1, "single")
    assert not torch.allclose(ref["params"], adamw["params"])  # the class is really used
    for mode, out in launch.spawn(_sgd, 2, args=(x, y))[0].items():
        torch.testing.assert_close(out["params"], ref["params"], rtol=1e-9, atol=1e-10,
                                   msg=lambda m, w=mode: f"{w}: {m}")  # fmt: skip
        # SGD with momentum keeps one buffer per parameter: 8 bytes a float64 value, over 2 ranks
        assert out["states"].optimizer == pytest.approx(
            8 * memory.count_params(_mlp()) / 2, rel=0.3
        )


def _within(measured: float, predicted: float, tol=0.02) -> bool:
    return abs(measured - predicted) <= tol * predicted


@pytest.mark.parametrize("world", [1, 2, 4])
def test_estimator_matches_each_ranks_local_shards(world):
    x, y = _batch()
    per_rank = launch.spawn(_modes, world, args=(("ddp", "fsdp", "zero1"), x, y))
    model = _mlp()
    for stage, mode in ((0, "ddp"), (3, "fsdp")):
        want = memory.estimate(model, dp=world, stage=stage, precision="fp32", optimizer="adam")
        for rank, outs in enumerate(per_rank):
            got = outs[mode]["states"]
            for part in ("params", "grads", "optimizer"):
                m, p = getattr(got, part), getattr(want, part)
                assert _within(m, p), f"{mode} rank {rank}/{world} {part}: measured {m}, est. {p}"
    # ZeRO-1 splits whole tensors: per rank uneven, but together exactly one copy of the state
    want1 = memory.estimate(model, dp=world, stage=1, precision="fp32", optimizer="adam")
    total = sum(outs["zero1"]["states"].optimizer for outs in per_rank)
    assert _within(total, world * want1.optimizer)
    assert all(outs["zero1"]["states"].grads == want1.grads for outs in per_rank)


def _save_then_loss(d: Dist, path: str, x, y, save: bool):
    """Train 3 steps with FSDP on this world and save; or load and evaluate the loss."""
    from torch.distributed.device_mesh import init_device_mesh

    model = fsdp.apply_fsdp(_mlp(), init_device_mesh("cpu", (d.world_size,)))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    if save:
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        model_sd, opt_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": opt_sd}, checkpoint_id=path)
    else:
        model_sd, opt_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": opt_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    with torch.no_grad():
        return nn.functional.cross_entropy(model(x), y).item(), len(_dcp_files(path))


def _dcp_files(path):
    return sorted(Path(path).glob("*.distcp"))


def test_dcp_checkpoint_written_by_4_ranks_loads_on_2(tmp_path):
    x, y = _batch()
    path = str(tmp_path / "ckpt")
    saved = launch.spawn(_save_then_loss, 4, args=(path, x, y, True))
    loaded = launch.spawn(_save_then_loss, 2, args=(path, x, y, False))
    assert saved[0][1] == 4  # one file per writing rank
    assert loaded[0][0] == pytest.approx(saved[0][0], abs=1e-6)


def _timeline(d: Dist, reshard: bool):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (d.world_size,))
    model = fsdp.apply_fsdp(_mlp(), mesh, reshard_after_forward=reshard)
    x, y = _batch()
    events = fsdp.comm_timeline(lambda: nn.functional.cross_entropy(model(x), y).backward())
    return [(e.kind, e.layer) for e in events]


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp_gathers_before_forward_and_backward_and_reduce_scatters_after(reshard):
    events = launch.spawn(_timeline, 2, args=(reshard,))[0]
    layers = ["0", "2", "4"]  # the three Linear layers (ReLUs hold no parameters)
    fwd = [lay for kind, lay in events if kind == "all-gather (forward)"]
    bwd = [lay for kind, lay in events if kind == "all-gather (backward)"]
    rs = [lay for kind, lay in events if kind == "reduce-scatter"]
    assert fwd == layers  # in forward order, once each
    assert rs[: len(layers)] == layers[::-1]  # gradients leave in backward order
    # resharding after forward costs a second all-gather per layer, in backward order
    assert bwd == (layers[::-1] if reshard else [])


@pytest.mark.parametrize("world", [2])
def test_deepspeed_stages_give_fsdps_losses(world):
    pytest.importorskip("deepspeed", reason="DeepSpeed is the optional [deepspeed] extra")
    x, y = _batch()
    outs = launch.spawn(_modes, world, args=(("fsdp", "ds1", "ds2", "ds3"), x, y), timeout=300)
    for per_mode in outs:
        for stage in ("ds1", "ds2", "ds3"):
            torch.testing.assert_close(per_mode[stage]["losses"], per_mode["fsdp"]["losses"],
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
            torch.testing.assert_close(per_mode[stage]["params"], per_mode["fsdp"]["params"],
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
