"""Models used by the course, one file each.

``cnn``: the CIFAR-10 and MNIST CNNs of chapters 01-04 (``models.create("cifar10")``).
Larger models for the model-parallel chapters live beside it (``llama2``,
``coatnet``, a tiny ``decoder``) and are imported by their module name.
"""

from helpers.models.cnn import CifarCNN, MnistCNN, count_parameters, create

__all__ = ["CifarCNN", "MnistCNN", "count_parameters", "create"]
