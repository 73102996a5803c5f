"""Figures of the alpha-beta model (notebook 02): measured here, and published from GPU nodes.

Convention: measurements are markers alone (with their quartiles as bars where repeats
exist); the model is one dashed line per formula. The ring and gloo's all_reduce share a
formula, so they share one line.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from helpers.viz.common import new_figure

_COLOR = {"ring": "C0", "ps": "C1", "builtin": "C2"}
_MODEL = {"ring": ("k", "model: ring = gloo's all_reduce"), "ps": ("C1", "model: server")}


def _errorbar(ax, rows, key, color, label):
    """Measured medians (markers) with their quartiles (the spread between repeats) as bars."""
    rows = sorted(rows, key=lambda r: r[key])
    xs = np.array([r[key] for r in rows], dtype=float)
    med = np.array([r["seconds"] for r in rows]) * 1e3
    lo = np.array([r.get("lo", r["seconds"]) for r in rows]) * 1e3
    hi = np.array([r.get("hi", r["seconds"]) for r in rows]) * 1e3
    err = np.clip([med - lo, hi - med], 0, None)  # (2, points); quartiles always bracket the median
    ax.errorbar(xs, med, yerr=err, fmt="o", ls="none", color=color, capsize=2, label=label)
    return xs


def _model_lines(ax, x, predict):
    """One dashed line per formula: ring (= builtin) and parameter server."""
    for algo, (color, label) in _MODEL.items():
        ax.plot(x, predict(algo, x) * 1e3, "--", color=color, label=label)


def plot_prediction(pingpong: list, ab, rows: list, measured_on: str):
    """Ping-pong fit (left), then all-reduces: measured vs predicted from that one fit.

    pingpong: rows of helpers.parallel.collectives.collectives.pingpong; ab: the AlphaBeta
    fitted to them; rows: helpers.parallel.collectives.collectives.measure rows. Markers with
    bars are measurements (median, quartiles); dashed lines are the model.
    """
    from helpers.parallel.collectives import costmodel

    fig, (ax0, ax1, ax2) = new_figure(
        "all-reduce: measured (markers, bars = quartiles) vs MODEL from the ping-pong (dashed)",
        f"{measured_on}; dashed lines are computed, not measured",
        ncols=3,
        width=4.6,
    )
    xs = _errorbar(ax0, pingpong, "bytes", "k", "ping-pong, one way")
    grid = np.geomspace(xs.min(), xs.max(), 50)
    ax0.plot(
        grid, (ab.alpha + grid * ab.beta) * 1e3, "--", color="k", label="model: alpha + n beta"
    )
    ax0.set_title(f"fit once: {ab}", fontsize=8)
    big_world = max(r["world"] for r in rows)
    big = max(r["bytes"] for r in rows)
    algos = [a for a in ("ring", "ps", "builtin") if any(r["algo"] == a for r in rows)]
    for algo in algos:
        pts = [r for r in rows if r["algo"] == algo and r["world"] == big_world]
        _errorbar(ax1, pts, "bytes", _COLOR[algo], f"{algo}, measured")
        pts = [r for r in rows if r["algo"] == algo and r["bytes"] == big]
        _errorbar(ax2, pts, "world", _COLOR[algo], f"{algo}, measured")
    sizes = np.geomspace(min(r["bytes"] for r in rows), big, 50)
    _model_lines(ax1, sizes, lambda a, n: costmodel.predict(a, n, big_world, ab))
    worlds = np.array(sorted({r["world"] for r in rows}))
    _model_lines(ax2, worlds, lambda a, w: costmodel.predict(a, big, w, ab))
    for ax in (ax0, ax1):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
    ax1.set_title(f"{big_world} ranks", fontsize=9)
    ax2.set_title(f"{big / 2**20:g} MiB", fontsize=9)
    ax2.set_xticks(worlds)
    ax2.set_xlabel("ranks")
    ax0.set_ylabel("time (ms)")
    lo, hi = ax1.get_ylim()
    ax1.set_ylim(lo, hi * 8)  # headroom on the log axis: the legend sits above the data
    ax1.legend(fontsize=7, loc="upper left", ncol=2)
    for ax in (ax0, ax2):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_bus_bandwidth(rows: list, ab, measured_on: str):
    """Bus bandwidth 2(N-1)/N * n / t of every measured all-reduce, beside the link's 1/beta."""
    from helpers.parallel.collectives import costmodel

    fig, (ax,) = new_figure(
        "bus bandwidth of each all-reduce (same formula for all)", measured_on, width=7.5
    )
    worlds = sorted({r["world"] for r in rows})
    markers = ["o", "s", "^", "v"]
    for algo in (a for a in ("ring", "ps", "builtin") if any(r["algo"] == a for r in rows)):
        for k, w in enumerate(worlds):
            pts = sorted(
                (r["bytes"], r["seconds"]) for r in rows if r["algo"] == algo and r["world"] == w
            )
            n, t = zip(*pts, strict=True)
            bw = costmodel.bus_bandwidth(n, w, t) / 1e9
            ax.plot(n, bw, markers[k % 4], ls="none", color=_COLOR[algo], ms=5,
                    label=f"{algo}, {w} ranks")  # fmt: skip
    ax.axhline(ab.bandwidth / 1e9, color="k", lw=1, ls="--")
    ax.text(
        min(r["bytes"] for r in rows),
        ab.bandwidth / 1e9,
        " 1/beta from the ping-pong (model)",
        va="bottom",
        fontsize=8,
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(top=3 * ab.bandwidth / 1e9)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return fig


def plot_published(vs_ranks: dict, sweep: dict, sweep_model, b200: dict):
    """Published NCCL all-reduce bus bandwidths beside the ring model (one dashed line each).

    vs_ranks: helpers.parallel.collectives.published_comm.RING_VS_RANKS with "ring_model_GBps" and
    "ps_model_GBps" added; sweep: SWEEP_H200; sweep_model: its model bus bandwidths (GB/s)
    at sweep["bytes"]; b200: SWEEP_B200. Nothing here was measured by the workbook.
    """
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    fig.suptitle("published data: NCCL all-reduce bus bandwidth on GPU nodes, beside the "
                 "alpha-beta model (dashed)")  # fmt: skip
    fig.text(0.99, 0.01, "published data, not measured here: ML Engineering (S. Bekman), "
             "github.com/stas00/ml-engineering, network/", ha="right", fontsize=8, color="0.4")  # fmt: skip
    ax = axes[0]
    r = vs_ranks["ranks"]
    ax.plot(
        r, vs_ranks["ring_GBps"], "o", ls="none", color="C0", label="published: ring (NVLS off)"
    )
    ax.plot(r, vs_ranks["nccl_choice_GBps"], "s", ls="none", color="C2",
            label="published: NCCL's choice (NVLS from 5)")  # fmt: skip
    ax.plot(r, vs_ranks["ring_model_GBps"], "--", color="k", label="model: ring, beta at 4 GPUs")
    ax.plot(r, vs_ranks["ps_model_GBps"], ":", color="C1", label="model: parameter server")
    ax.set(title=f"{vs_ranks['gpu']}, {vs_ranks['bytes'] / 2**30:g} GiB", xlabel="GPUs",
           ylabel="bus bandwidth (GB/s)", xticks=r, ylim=(0, 560))  # fmt: skip
    ax.legend(fontsize=7, loc="center left")
    ax = axes[1]
    ax.plot(sweep["bytes"], sweep["busbw_GBps"], "o", ls="none", color="C0",
            label=f"published: {sweep['label']}")  # fmt: skip
    ax.plot(sweep["bytes"], sweep_model, "--", color="k",
            label="model: alpha from <= 256 KiB, beta from >= 1 GiB")  # fmt: skip
    ax.set(title="one node, by message size", xscale="log", yscale="log",
           xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")  # fmt: skip
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    for (label, (_ranks, bw)), mark in zip(b200["runs"].items(), ("o", "s"), strict=True):
        ax.plot(b200["bytes"], bw, mark, ls="none", label=f"published: {label}")
    ax.set(title="leaving the node: B200, 1 node and 4 nodes", xscale="log", yscale="log",
           xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")  # fmt: skip
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig
