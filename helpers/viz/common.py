"""What every figure shares: a 'measured on' footnote and the label of the machine.

Every plotting function of helpers.viz returns the matplotlib Figure (so notebooks
can save or tweak it) and draws with the Agg-safe API, so papermill and CI render
figures without a display. Functions that plot measurements take a
``measured_on`` string printed under the title: a figure that depends on
hardware says what it was measured on.
"""

from __future__ import annotations

# No backend is forced: notebooks use the inline backend, headless scripts and
# CI get Agg from matplotlib's own fallback (tests also set MPLBACKEND=Agg).
import matplotlib.pyplot as plt


def machine_label(backend: str = "gloo", ranks: int | str | None = None) -> str:
    """'2-core CPU, gloo, 4 ranks, torch 2.14.1': what a measurement ran on.

    backend: the backend the measurement really used (``d.backend`` of its
    ranks, e.g. "gloo" for everything launch.spawn runs here, even on a GPU
    node). GPUs are named only when the backend is nccl, because a gloo
    measurement on a GPU node moved CPU tensors. ranks: a number, or words for a
    figure that gathers several runs ("1, 2 and 4").
    """
    import os

    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if backend == "nccl" and torch.cuda.is_available():
        hw = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    else:
        hw = f"{cores}-core CPU"
    who = f", {ranks} ranks" if ranks else ""
    return f"{hw}, {backend}{who}, torch {torch.__version__.split('+')[0]}"


def device_label(device) -> str:
    """What a one-device measurement ran on: '1 x NVIDIA H100 80GB HBM3 (cuda:0), torch 2.11.0'
    on a GPU, '2-core CPU (Intel Xeon ...), torch 2.14.1' on the CPU.

    For a notebook that computes on ``device`` itself (no ranks, no backend): its figures were
    measured on that device, and the label says which.
    """
    import os
    import platform
    import re
    from pathlib import Path

    import torch

    from helpers import devices

    version = torch.__version__.split("+")[0]
    if devices.is_gpu(device):
        return f"1 x {devices.device_name(device)} ({device}), torch {version}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    found = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    model = found.group(1).strip() if found else (platform.processor() or platform.machine())
    return f"{cores}-core CPU ({model}), torch {version}"


def new_figure(title: str, measured_on: str | None = None, ncols: int = 1, width: float = 5.5):
    """A figure with one row of ``ncols`` axes and a 'measured on' footnote."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 3.8), squeeze=False)
    fig.suptitle(title)
    if measured_on:
        fig.text(
            0.99,
            0.01,
            f"measured on {measured_on}",
            ha="right",
            va="bottom",
            fontsize=8,
            color="0.4",
        )
    return fig, list(axes[0])
