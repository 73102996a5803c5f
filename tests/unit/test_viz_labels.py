"""Figures say what they were measured on, with the backend the measurement used."""

from __future__ import annotations

import torch

from helpers.viz.common import machine_label


def test_machine_label_names_the_backend_the_measurement_used(monkeypatch):
    # A GPU node: CUDA is visible, but spawn() measurements still run gloo on CPU tensors.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100")
    gloo = machine_label("gloo", ranks=4)
    assert "CPU, gloo, 4 ranks" in gloo and "H100" not in gloo and "nccl" not in gloo
    nccl = machine_label("nccl")
    assert nccl.startswith("4x NVIDIA H100, nccl")
