"""Figures of notebook 02: collectives, the ring, the parameter server, launch times.

The alpha-beta model's figures are in ``helpers.viz.costmodel``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from helpers.viz.common import new_figure


def _annotated_heatmap(ax, data, labels=None, cmap="Blues", vmax=None):
    """Rows = ranks; each cell shows its value (or its label)."""
    import numpy as np

    arr = np.asarray(data, dtype=float)
    top = vmax if vmax is not None else (arr.max() * 1.3 or 1)  # 1.3: keep text readable
    ax.imshow(arr, cmap=cmap, aspect="auto", vmin=min(arr.min(), 0), vmax=top)
    for (i, j), v in np.ndenumerate(arr):
        text = labels[i][j] if labels is not None else f"{v:g}"
        ax.text(j, i, text, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(arr.shape[0]), [f"rank {r}" for r in range(arr.shape[0])])
    ax.set_xticks([])


def plot_collective(name: str, before: list, after: list, note: str = ""):
    """Each rank's tensor before and after one collective (rows = ranks)."""
    widths = [len(before[0]), len(after[0])]
    fig, axes = plt.subplots(
        1,
        2,
        figsize=(min(12, 2 + 0.45 * sum(widths)), 0.5 + 0.45 * len(before)),
        gridspec_kw={"width_ratios": widths},
    )
    fig.suptitle(f"{name}" + (f": {note}" if note else ""), fontsize=10)
    _annotated_heatmap(axes[0], before)
    _annotated_heatmap(axes[1], after, cmap="Oranges")
    axes[0].set_title("before", fontsize=9)
    axes[1].set_title("after", fontsize=9)
    axes[1].set_yticks([])
    fig.tight_layout()
    return fig


def plot_ring_steps(traces: list):
    """The ring all-reduce step by step: traces[r] = ring_trace()['trace'] of rank r.

    Each panel is one step; rows are ranks, columns chunks. A cell lists the
    ranks already summed into that chunk (rank r started with 2**r, so the
    value's binary digits name them); a red box marks the chunk just received.
    """
    import numpy as np
    from matplotlib.patches import Rectangle

    n, steps = len(traces), len(traces[0])
    fig, axes = plt.subplots(2, n, figsize=(2.3 * n, 5.0), squeeze=False)
    panels = [(0, 0)] + [(0, s) for s in range(1, n)] + [(1, s) for s in range(n - 1)]
    for k, (row, col) in enumerate(panels[:steps]):
        ax = axes[row][col]
        vals = np.array([[v for v in traces[r][k]["state"]] for r in range(n)], dtype=int)
        who = [[("".join(str(b) for b in range(n) if v >> b & 1)) for v in rv] for rv in vals]
        count = np.vectorize(lambda v: bin(int(v)).count("1"))(vals)
        _annotated_heatmap(ax, count, labels=who, cmap="Greens", vmax=1.3 * n)
        ax.set_xticks(range(vals.shape[1]), [f"c{j}" for j in range(vals.shape[1])], fontsize=7)
        rec = traces[0][k]
        ax.set_title(
            "start" if rec["phase"] == "start" else f"{rec['phase']} {rec['step']}", fontsize=8
        )
        for r in range(n):
            got = traces[r][k]["received"]
            if got is not None:
                ax.add_patch(Rectangle((got - 0.5, r - 0.5), 1, 1, fill=False, ec="red", lw=2))
        if col:
            ax.set_yticks([])
    axes[1][n - 1].axis("off")
    axes[1][n - 1].text(
        0, 0.5, "cell = ranks summed\ninto that chunk\nred = just received", fontsize=9, va="center"
    )
    fig.suptitle(f"ring all-reduce on {n} ranks: reduce-scatter (top), all-gather (bottom)")
    fig.tight_layout()
    return fig


def plot_ps_vs_ring(n_bytes: float, rows: list, measured_on: str):
    """Bytes the busiest rank sends (a model: counted, not measured) and measured times."""
    import numpy as np

    from helpers.parallel.collectives import costmodel

    fig, (ax1, ax2) = new_figure(
        f"parameter server vs ring, {n_bytes / 2**20:g} MiB",
        f"{measured_on} (right panel; the left panel is counted from the algorithms)",
        ncols=2,
    )
    rows = [r for r in rows if r["bytes"] == n_bytes]
    if not rows:
        raise ValueError(f"no measurement at {n_bytes} bytes: pass one of the measured sizes")
    ws = np.arange(2, 17)
    for algo, label in (("ring", "ring: every rank"), ("ps", "parameter server: the server")):
        traffic = [costmodel.bytes_sent(algo, n_bytes, int(w)) / 2**20 for w in ws]
        ax1.plot(ws, traffic, "o-", ms=3, label=label)
    ax1.set_title("MODEL: MiB the busiest rank sends (= receives)", fontsize=9)
    ax1.set_xlabel("ranks")
    ax1.set_ylabel("MiB")
    ax1.legend(fontsize=8)
    worlds = sorted({r["world"] for r in rows})
    algos = [a for a in ("ring", "ps", "builtin") if any(r["algo"] == a for r in rows)]
    for j, algo in enumerate(algos):
        pts = [next(r for r in rows if r["algo"] == algo and r["world"] == w) for w in worlds]
        t = np.array([r["seconds"] for r in pts]) * 1e3
        lo = t - np.array([r.get("lo", r["seconds"]) for r in pts]) * 1e3
        hi = np.array([r.get("hi", r["seconds"]) for r in pts]) * 1e3 - t
        x = np.arange(len(worlds)) + (j - 1) * 0.27
        ax2.bar(x, t, width=0.27, yerr=np.clip([lo, hi], 0, None), capsize=2, label=algo)
    ax2.set_xticks(range(len(worlds)), [f"{w} ranks" for w in worlds])
    ax2.set_title("MEASURED: median time, bars = quartiles", fontsize=9)
    ax2.set_ylabel("time (ms)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_launch_times(times: dict, nproc: int, measured_on: str):
    """Horizontal bars: seconds until ``nproc`` ranks have done one all-reduce, per launcher.

    times: {"torchrun (fresh processes)": 18.2, "spawn, warm pool": 0.3, ...}
    """
    fig, (ax,) = new_figure(f"Starting {nproc} ranks for one all-reduce", measured_on, width=7)
    names = list(times)
    bars = ax.barh(names, [times[k] for k in names], color=[f"C{i}" for i in range(len(names))])
    ax.bar_label(bars, fmt="%.2f s", padding=3)
    ax.invert_yaxis()  # first entry on top
    ax.set_xlabel("wall time (s)")
    ax.set_xlim(0, max(times.values()) * 1.25)
    fig.tight_layout()
    return fig


def plot_overlap(study: dict, measured_on: str):
    """Median seconds (bars: quartiles) of a collective, some work, both in turn, both overlapped.

    study: {kind of work: {phase: [seconds of each repeat]}}, phases in the order to draw.
    """
    import numpy as np

    kinds = list(study)
    fig, axes = new_figure(
        "all-reduce and other work: one after the other, or overlapped (async_op=True)",
        measured_on,
        ncols=len(kinds),
        width=5.2,
    )
    for ax, kind in zip(axes, kinds, strict=True):
        phases = list(study[kind])
        q = np.array([np.percentile(np.array(study[kind][p]) * 1e3, [25, 50, 75]) for p in phases])
        err = np.clip([q[:, 1] - q[:, 0], q[:, 2] - q[:, 1]], 0, None)
        colors = ["C0", "C1", "0.6", "C2"][: len(phases)]
        bars = ax.bar(range(len(phases)), q[:, 1], yerr=err, capsize=3, color=colors)
        ax.bar_label(bars, fmt="%.0f ms", padding=2, fontsize=8)
        ax.set_xticks(range(len(phases)), [p.replace(" ", "\n", 1) for p in phases], fontsize=8)
        ax.set_title(f"work = {kind}", fontsize=9)
        ax.set_ylabel("time (ms), median; bars = quartiles")
        ax.set_ylim(0, q[:, 2].max() * 1.25)
    fig.tight_layout()
    return fig
