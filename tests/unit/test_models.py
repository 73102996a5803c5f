"""helpers.models: shapes, parameter counts and gradients of the workbook's CNNs."""

from __future__ import annotations

import pytest
import torch

from helpers import models


def test_cifar_cnn_is_the_seed_network():
    m = models.CifarCNN()
    assert m(torch.randn(4, 3, 32, 32)).shape == (4, 10)
    # conv 3->6 k5, conv 6->16 k5, fc 400->120->84->10 (weights + biases)
    expected = (
        (3 * 6 * 25 + 6) + (6 * 16 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)
    )
    assert models.count_parameters(m) == expected == 62_006
    assert m.fc1.in_features == 400


@pytest.mark.parametrize("width", [4, 16, 32])
def test_mnist_cnn_shapes_and_size(width):
    m = models.MnistCNN(width=width)
    assert m(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    w = width
    expected = (9 * w + w) + (9 * w * 2 * w + 2 * w) + (288 * w * 128 + 128) + (128 * 10 + 10)
    assert models.count_parameters(m) == expected
    with pytest.raises(ValueError, match="width"):
        models.MnistCNN(width=0)


def test_every_parameter_gets_a_gradient():
    for m, x in (
        (models.CifarCNN(), torch.randn(3, 3, 32, 32)),
        (models.MnistCNN(), torch.randn(3, 1, 28, 28)),
    ):
        m(x).sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


def test_create_and_count_trainable():
    assert isinstance(models.create("cifar10"), models.CifarCNN)
    m = models.create("mnist", num_classes=3, width=4)
    assert isinstance(m, models.MnistCNN) and m.fc2.out_features == 3
    total = models.count_parameters(m)
    m.conv1.requires_grad_(False)
    assert models.count_parameters(m) == total - (9 * 4 + 4)
    assert models.count_parameters(m, trainable_only=False) == total
    with pytest.raises(ValueError, match="choose one of"):
        models.create("svhn")
