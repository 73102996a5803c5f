"""CoAtNet: the paper's sizes, shapes through the stages, and bad configs."""

import pytest
import torch

from helpers.models import coatnet as C


@pytest.mark.parametrize("name", [f"CoAtNet-{i}" for i in range(8)])
def test_param_count_close_to_published(name):
    # the paper's blocks differ in small details (SE width, stem, head); 0-5 and 7 land within
    # 3 %, CoAtNet-6 within 10 % (its split stage 3 is described less precisely)
    ratio = C.param_count(C.CONFIGS[name]) / C.PUBLISHED_PARAMS[name]
    tol = 0.10 if name == "CoAtNet-6" else 0.03
    assert abs(ratio - 1) < tol, f"{name}: {ratio:.3f} of the published size"


def test_sizes_grow_with_the_family():
    sizes = [C.param_count(C.CONFIGS[f"CoAtNet-{i}"]) for i in range(8)]
    assert sizes == sorted(sizes)


def test_tiny_forward_and_stage_shapes():
    cfg = C.CONFIGS["tiny"]
    model = C.CoAtNet(cfg).eval()
    x = torch.randn(2, 3, 64, 64)
    assert model(x).shape == (2, 10)
    h = model.stem(x)
    sides = [h.shape[-1]]
    for stage in model.stages:
        h = stage(h)
        sides.append(h.shape[-1])
    assert sides == cfg.resolutions() == [32, 16, 8, 4, 2]


def test_flops_per_image_coatnet0_near_published():
    # the paper quotes 4.2 G "FLOPs" for CoAtNet-0, counting multiply-adds: ~8.4 G FLOPs
    flops = C.flops_per_image(C.CONFIGS["CoAtNet-0"])
    assert 7e9 < flops < 10e9


def test_bad_config_says_what_to_change():
    with pytest.raises(ValueError, match="must divide by"):
        C.config("tiny", image_size=60)
    with pytest.raises(ValueError, match="head_dim"):
        C.CoAtNet(C.config("tiny", head_dim=24))
