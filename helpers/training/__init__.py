"""Training on one device or many: loops, mixed precision, profiling, learning-rate rules.

    from helpers import training
    training.fit(model, train_loader, test_loader, optimizer, device=d.device, epochs=2)

``training.loop`` holds the loop (re-exported here), ``training.profiling`` the
throughput and profiler helpers, ``training.lr`` the learning-rate scaling rules
and warm-up.
"""

from helpers.training.loop import (
    PHASES,
    autocast,
    default_amp,
    evaluate,
    fit,
    grad_scaler,
    synchronize,
    train_epoch,
    train_step,
)

__all__ = [
    "PHASES",
    "autocast",
    "default_amp",
    "evaluate",
    "fit",
    "grad_scaler",
    "synchronize",
    "train_epoch",
    "train_step",
]
