"""Plots used by the notebooks.

Every function returns the matplotlib Figure (so notebooks can save or tweak
it) and draws with the Agg-safe API, so papermill and CI render figures
without a display. Functions that plot measurements take a ``measured_on``
string that is printed under the title: a figure that depends on hardware
says what it was measured on.
"""

from __future__ import annotations

import matplotlib

if matplotlib.get_backend().lower() not in ("module://matplotlib_inline.backend_inline",):
    # Headless default for scripts and tests; notebooks keep their inline backend.
    try:
        import IPython

        if IPython.get_ipython() is None:
            matplotlib.use("Agg")
    except ImportError:
        matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402


def machine_label() -> str:
    """'2-core CPU (gloo), torch 2.14.1' — what hardware-dependent figures were measured on."""
    import os

    import torch

    if torch.cuda.is_available():
        hw = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)} (nccl)"
    else:
        hw = f"{os.cpu_count()}-core CPU (gloo)"
    return f"{hw}, torch {torch.__version__.split('+')[0]}"


def new_figure(title: str, measured_on: str | None = None, ncols: int = 1, width: float = 5.5):
    """A figure with one row of ``ncols`` axes and a 'measured on' footnote."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 3.8), squeeze=False)
    fig.suptitle(title)
    if measured_on:
        fig.text(0.99, 0.01, f"measured on {measured_on}", ha="right", va="bottom", fontsize=8,
                 color="0.4")
    return fig, list(axes[0])
