"""Figures of notebook 01: samples, training curves, the profiler summary."""

from __future__ import annotations

import matplotlib.pyplot as plt

from helpers.viz.common import new_figure


def plot_samples(dataset, classes, n: int = 20, ncols: int = 10, title: str = "Training samples"):
    """A grid of the first ``n`` images of a dataset of (image, label) pairs, with their labels.

    Images are normalised tensors (C, H, W); each is rescaled to [0, 1] for display.
    """
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(1.3 * ncols, 1.5 * nrows), squeeze=False)
    fig.suptitle(title)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= min(n, len(dataset)):
            continue
        x, y = dataset[i]
        img = (x - x.min()) / (x.max() - x.min() + 1e-8)  # (C, H, W) in [0, 1]
        ax.imshow(img.permute(1, 2, 0).squeeze(-1).numpy(), cmap="gray" if len(x) == 1 else None)
        ax.set_title(classes[int(y)], fontsize=8)
    fig.tight_layout()
    return fig


def plot_training(history: list, measured_on: str | None = None, title: str = "Training"):
    """Loss per step and per-epoch train/test accuracy from helpers.train.fit's history."""
    fig, (ax_loss, ax_acc) = new_figure(title, measured_on, ncols=2)
    steps = [loss for h in history for loss in h["step_losses"]]
    per_epoch = max(1, len(history[0]["step_losses"]))
    ax_loss.plot([i / per_epoch for i in range(len(steps))], steps, lw=0.6, alpha=0.5,
                 label="per step")  # fmt: skip
    ax_loss.plot([h["epoch"] for h in history], [h["test_loss"] for h in history], "o-",
                 label="test (end of epoch)")  # fmt: skip
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy loss")
    ax_loss.legend()
    epochs = [h["epoch"] for h in history]
    ax_acc.plot(epochs, [100 * h["train_accuracy"] for h in history], "o-", label="train")
    ax_acc.plot(epochs, [100 * h["test_accuracy"] for h in history], "s-", label="test")
    ax_acc.axhline(10, color="0.6", ls="--", label="chance (10 classes)")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", ylim=(0, 100))
    ax_acc.legend()
    fig.tight_layout(rect=(0, 0.03, 1, 1))  # leave room for the "measured on" footnote
    return fig


def plot_profile(summary, measured_on: str | None = None, top: int = 8):
    """Time per step by phase, and the most expensive operators (helpers.profiling.profile)."""
    fig, (ax_phase, ax_ops) = new_figure("Where a training step's time goes", measured_on, ncols=2)
    names, ms = list(summary.phases), list(summary.phases.values())
    ax_phase.bar(names, ms, color=["0.6", "tab:blue", "tab:orange", "tab:green"])
    ax_phase.set(ylabel="ms per step", title="phases")
    ops = summary.top_ops[:top][::-1]  # largest at the top of a horizontal bar chart
    labels = [op["name"].replace("aten::", "")[:32] for op in ops]
    ax_ops.barh(labels, [op["self_ms"] for op in ops])
    ax_ops.set(xlabel="self time, ms per step", title="top operators")
    fig.tight_layout(rect=(0, 0.03, 1, 1))  # leave room for the "measured on" footnote
    return fig
