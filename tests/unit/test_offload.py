"""helpers.parallel.sharded.offload: the copies between host and device, and where model states live."""

import torch
from torch import nn

from helpers.parallel.sharded.offload import HostDeviceCopies, placement


def test_copies_are_counted_by_direction_and_bytes():
    x = torch.randn(4, 8)
    with HostDeviceCopies() as copies:
        on_device = x.to("meta")  # host -> another device: 128 bytes
        x.clone()  # no copy between devices
        torch.empty(2, 8).copy_(x[:2])  # host -> host: not counted
    assert copies.bytes == {"host->device": 128, "device->host": 0}
    assert (
        copies.copies == {"host->device": 1, "device->host": 0} and on_device.device.type == "meta"
    )
    # (device -> host needs a device with data: notebook 04 measures it on the stand-in GPU)


def test_placement_counts_weights_gradients_and_optimizer_state():
    model = nn.Linear(3, 2)  # 6 + 2 parameters
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    got = placement(model, opt)
    assert got == {"weights": {"cpu": 32}, "gradients": {"cpu": 32}, "optimizer": {"cpu": 64}}
