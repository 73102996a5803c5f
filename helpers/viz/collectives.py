"""Figures of notebook 02: collectives, the ring, the alpha-beta model, launch times."""

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


def plot_alpha_beta(rows: list, fits: dict, measured_on: str):
    """Measured all-reduce time vs message size and vs ranks, with the fitted model.

    rows: dict(algo, bytes, world, seconds) from helpers.collectives.measure;
    fits: algo -> helpers.costmodel.AlphaBeta (drawn as dashed lines).
    """
    import numpy as np

    from helpers.parallel import costmodel

    fig, (ax1, ax2) = new_figure(
        "all-reduce time: measured (dots) vs alpha-beta model (dashed)", measured_on, ncols=2
    )
    worlds = sorted({r["world"] for r in rows})
    sizes = sorted({r["bytes"] for r in rows})
    for i, w in enumerate(worlds):
        pts = sorted(
            (r["bytes"], r["seconds"]) for r in rows if r["algo"] == "ring" and r["world"] == w
        )
        xs, ys = zip(*pts, strict=True)
        ax1.loglog(xs, np.array(ys) * 1e3, "o", color=f"C{i}", label=f"ring, {w} ranks")
        if "ring" in fits:
            grid = np.geomspace(min(xs), max(xs), 50)
            ax1.loglog(
                grid, costmodel.predict("ring", grid, w, fits["ring"]) * 1e3, "--", color=f"C{i}"
            )
    ax1.set_xlabel("message size (bytes)")
    ax1.set_ylabel("time (ms)")
    ax1.legend(fontsize=8)
    big = sizes[-1]
    for j, algo in enumerate(sorted({r["algo"] for r in rows})):
        pts = sorted(
            (r["world"], r["seconds"]) for r in rows if r["algo"] == algo and r["bytes"] == big
        )
        xs, ys = zip(*pts, strict=True)
        ax2.plot(xs, np.array(ys) * 1e3, "o-", color=f"C{j + 3}", label=f"{algo} measured")
        if algo in fits:
            ax2.plot(
                xs,
                costmodel.predict(algo, big, np.array(xs), fits[algo]) * 1e3,
                "--",
                color=f"C{j + 3}",
            )
    ax2.set_xticks(worlds)
    ax2.set_xlabel("ranks")
    ax2.set_ylabel("time (ms)")
    ax2.set_title(f"{big / 2**20:g} MB", fontsize=9)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_ps_vs_ring(n_bytes: float, rows: list, measured_on: str):
    """Bytes through the busiest rank (model) and measured time, ring vs parameter server."""
    import numpy as np

    from helpers.parallel import costmodel

    fig, (ax1, ax2) = new_figure(
        f"parameter server vs ring, {n_bytes / 2**20:g} MB", measured_on, ncols=2
    )
    rows = [r for r in rows if r["bytes"] == n_bytes]
    if not rows:
        raise ValueError(f"no measurement at {n_bytes} bytes: pass one of the measured sizes")
    ws = np.arange(2, 17)
    for algo, label in (("ring", "ring: every rank"), ("ps", "parameter server: the server")):
        traffic = [costmodel.bytes_per_rank(algo, n_bytes, int(w)) / 2**20 for w in ws]
        ax1.plot(ws, traffic, "o-", ms=3, label=label)
    ax1.set_xlabel("ranks")
    ax1.set_ylabel("MB through the busiest link")
    ax1.legend(fontsize=8)
    worlds = sorted({r["world"] for r in rows})
    algos = [a for a in ("ring", "ps", "builtin") if any(r["algo"] == a for r in rows)]
    for j, algo in enumerate(algos):
        t = [
            next(r["seconds"] for r in rows if r["algo"] == algo and r["world"] == w) * 1e3
            for w in worlds
        ]
        ax2.bar(np.arange(len(worlds)) + (j - 1) * 0.27, t, width=0.27, label=algo)
    ax2.set_xticks(range(len(worlds)), [f"{w} ranks" for w in worlds])
    ax2.set_ylabel("measured time (ms)")
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
