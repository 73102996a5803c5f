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


def test_device_label_names_the_gpu_a_one_device_figure_was_measured_on(monkeypatch):
    # Notebook 01 on an H100 printed "16-core CPU, gloo, torch 2.11.0" above figures measured
    # on cuda:0: its label must name the device the figures came from.
    from helpers.viz.common import device_label

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    gpu = device_label(torch.device("cuda:0"))
    assert gpu.startswith("1 x NVIDIA H100 80GB HBM3 (cuda:0), torch ") and "CPU" not in gpu
    cpu = device_label(torch.device("cpu"))
    assert "-core CPU (" in cpu and "gloo" not in cpu and "H100" not in cpu
