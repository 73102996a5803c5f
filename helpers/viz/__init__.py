"""Plots used by the notebooks, one module per topic; matplotlib is imported only here.

``common`` (machine_label, device_label, new_figure), ``collectives`` and ``costmodel`` (02),
``training`` (01), ``ddp`` (03); later chapters add their own modules (memory, pipeline, tp, planner).
The functions of the first chapters are re-exported, so ``viz.plot_scaling(...)``
works after ``from helpers import viz``.
"""

from helpers.viz.collectives import (
    plot_collective,
    plot_launch_times,
    plot_overlap,
    plot_ps_vs_ring,
    plot_ring_steps,
)
from helpers.viz.common import device_label, machine_label, new_figure
from helpers.viz.costmodel import plot_bus_bandwidth, plot_prediction, plot_published
from helpers.viz.ddp import (
    plot_bucket_timeline,
    plot_lr_study,
    plot_megatron_weak_scaling,
    plot_overlap_timeline,
    plot_published_ddp_scaling,
    plot_scaling,
)
from helpers.viz.training import plot_profile, plot_samples, plot_training

__all__ = [
    "device_label",
    "machine_label",
    "new_figure",
    "plot_bucket_timeline",
    "plot_bus_bandwidth",
    "plot_collective",
    "plot_launch_times",
    "plot_lr_study",
    "plot_megatron_weak_scaling",
    "plot_overlap",
    "plot_overlap_timeline",
    "plot_published_ddp_scaling",
    "plot_prediction",
    "plot_published",
    "plot_profile",
    "plot_ps_vs_ring",
    "plot_ring_steps",
    "plot_samples",
    "plot_scaling",
    "plot_training",
]
