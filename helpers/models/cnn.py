"""The workbook's small models.

CifarCNN: the seed's CNN for CIFAR-10 (the PyTorch tutorial's LeNet-style net):
two 5x5 convolutions with max-pooling, then three fully connected layers,
400 -> 120 -> 84 -> 10; about 62 thousand parameters.

MnistCNN: a small CNN in the style of the PyTorch MNIST example: two 3x3
convolutions, max-pooling, dropout and two fully connected layers. ``width``
scales the channels (the example's 32/64 is width=32); the default keeps it
cheap enough for several CPU ranks on a laptop.

Both take normalised images from helpers.data and return logits (B, 10).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["CifarCNN", "MnistCNN", "create", "count_parameters", "MODELS"]


class CifarCNN(nn.Module):
    """conv(3->6, 5x5) -> pool -> conv(6->16, 5x5) -> pool -> fc 400 -> 120 -> 84 -> classes."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, 3, 32, 32)
        x = self.pool(F.relu(self.conv1(x)))  # conv -> (B, 6, 28, 28), pool -> (B, 6, 14, 14)
        x = self.pool(F.relu(self.conv2(x)))  # conv -> (B, 16, 10, 10), pool -> (B, 16, 5, 5)
        x = torch.flatten(x, 1)  # (B, 400)
        x = F.relu(self.fc1(x))  # (B, 120)
        x = F.relu(self.fc2(x))  # (B, 84)
        return self.fc3(x)  # (B, num_classes) logits


class MnistCNN(nn.Module):
    """conv(1->w, 3x3) -> conv(w->2w, 3x3) -> pool -> dropout -> fc 144w -> 128 -> classes."""

    def __init__(self, num_classes: int = 10, width: int = 16, dropout: float = 0.25):
        super().__init__()
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.conv1 = nn.Conv2d(1, width, 3)
        self.conv2 = nn.Conv2d(width, 2 * width, 3)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(2 * dropout)
        self.fc1 = nn.Linear(2 * width * 12 * 12, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, 1, 28, 28)
        x = F.relu(self.conv1(x))  # (B, w, 26, 26)
        x = F.relu(self.conv2(x))  # (B, 2w, 24, 24)
        x = F.max_pool2d(x, 2)  # (B, 2w, 12, 12)
        x = self.dropout1(torch.flatten(x, 1))  # (B, 288w)
        x = self.dropout2(F.relu(self.fc1(x)))  # (B, 128)
        return self.fc2(x)  # (B, num_classes) logits


MODELS = {"cifar10": CifarCNN, "mnist": MnistCNN}


def create(dataset: str, num_classes: int = 10, **kwargs) -> nn.Module:
    """The workbook's model for a dataset: ``create(info.name)`` after ``helpers.data.load``.

    ``dataset`` is the canonical name ("cifar10" or "mnist") that helpers.data
    puts in DatasetInfo.name; spelling variants are resolved there, once.
    """
    if dataset not in MODELS:
        raise ValueError(
            f"no model for dataset {dataset!r}: choose one of {', '.join(MODELS)} "
            "(pass info.name from helpers.data.load)"
        )
    return MODELS[dataset](num_classes=num_classes, **kwargs)


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters (only those with requires_grad by default)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
