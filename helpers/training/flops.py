"""FLOPs of a training step and the share of a device's peak they use (MFU), for small models.

Two counts that must agree: by hand, from each layer's shapes (a convolution with C_in input
channels, a k x k kernel and an output of C_out x H x W does 2 C_in k^2 C_out H W FLOPs
forward, a multiply and an add per weight and output pixel; a linear layer 2 x in x out), and
torch's own ``torch.utils.flop_counter.FlopCounterMode``, which counts every matrix product
and convolution the dispatcher runs, forward and backward.

    per_layer = layer_flops(model, x[:1])              # forward FLOPs of one sample, by hand
    counted = counted_flops(model, x, y)               # {"forward", "backward"} per sample
    mfu(counted["forward"] + counted["backward"], samples_per_s, peak_flops)

Backward does about twice forward's work (the gradient of the inputs and of the weights each
cost a forward), less where a layer needs no input gradient (the first layer: its input is
the data).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["counted_flops", "layer_flops", "mfu"]


def layer_flops(model: nn.Module, sample: torch.Tensor) -> dict[str, int]:
    """Forward FLOPs of one sample (``sample``: a batch of 1) per Conv2d and Linear layer,
    from their shapes: 2 x (multiply-adds). Biases, activations and pooling are left out."""
    counts: dict[str, int] = {}

    def hook(name):
        def count(layer, inputs, out):
            if isinstance(layer, nn.Conv2d):
                kh, kw = layer.kernel_size
                per_output = layer.in_channels // layer.groups * kh * kw
                counts[name] = counts.get(name, 0) + 2 * per_output * out[0].numel()
            else:
                counts[name] = counts.get(name, 0) + 2 * layer.in_features * layer.out_features

        return count

    hooks = [m.register_forward_hook(hook(name)) for name, m in model.named_modules()
             if isinstance(m, (nn.Conv2d, nn.Linear))]  # fmt: skip
    try:
        with torch.no_grad():
            model(sample)
    finally:
        for h in hooks:
            h.remove()
    return counts


def counted_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """FLOPs per sample of one training step's forward and backward, as torch counts them."""
    loss_fn = nn.CrossEntropyLoss()
    with FlopCounterMode(display=False) as forward:
        loss = loss_fn(model(x), y)
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return {"forward": forward.get_total_flops() / len(y),
            "backward": backward.get_total_flops() / len(y)}  # fmt: skip


def mfu(flops_per_sample: float, samples_per_s: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the FLOP rate the samples need, over the device's peak."""
    return flops_per_sample * samples_per_s / peak_flops
