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


def _errorbar(ax, rows, key, color, label, fmt="o"):
    """Measured medians with their quartiles (the spread between repeats) as error bars."""
    import numpy as np

    rows = sorted(rows, key=lambda r: r[key])
    xs = np.array([r[key] for r in rows], dtype=float)
    med = np.array([r["seconds"] for r in rows]) * 1e3
    lo = np.array([r.get("lo", r["seconds"]) for r in rows]) * 1e3
    hi = np.array([r.get("hi", r["seconds"]) for r in rows]) * 1e3
    err = np.clip([med - lo, hi - med], 0, None)  # (2, points); quartiles always bracket the median
    ax.errorbar(xs, med, yerr=err, fmt=fmt, color=color, capsize=2, label=label)
    return xs


def plot_prediction(pingpong: list, ab, rows: list, measured_on: str):
    """Ping-pong fit (left), then all-reduces: measured vs predicted from that one fit.

    pingpong: rows of helpers.parallel.collectives.pingpong; ab: the AlphaBeta
    fitted to them; rows: helpers.parallel.collectives.measure rows. Dots with
    bars are measurements (median, quartiles); dashed lines are the model.
    """
    import numpy as np

    from helpers.parallel import costmodel

    fig, (ax0, ax1, ax2) = new_figure(
        "all-reduce: measured (dots, bars = quartiles) vs MODEL predicted from the ping-pong (dashed)",
        f"{measured_on}; dashed lines are computed, not measured",
        ncols=3,
        width=4.6,
    )
    xs = _errorbar(ax0, pingpong, "bytes", "k", "ping-pong, one way")
    grid = np.geomspace(xs.min(), xs.max(), 50)
    ax0.plot(
        grid,
        (ab.alpha + grid * ab.beta) * 1e3,
        "--",
        color="k",
        label="fit to lower quartiles: alpha + n beta",
    )
    ax0.set_title(f"fit once: {ab}", fontsize=8)
    big_world = max(r["world"] for r in rows)
    big = max(r["bytes"] for r in rows)
    algos = [a for a in ("ring", "ps", "builtin") if any(r["algo"] == a for r in rows)]
    for j, algo in enumerate(algos):
        c = f"C{j}"
        pts = [r for r in rows if r["algo"] == algo and r["world"] == big_world]
        xs = _errorbar(ax1, pts, "bytes", c, algo)
        grid = np.geomspace(xs.min(), xs.max(), 50)
        # gloo's all_reduce has the ring's formula: the two lines coincide, so their dashes
        # alternate (blue, green, blue, ...) instead of one hiding the other.
        ls = (6, (6, 6)) if algo == "builtin" else (0, (6, 6)) if algo == "ring" else "--"
        ax1.plot(
            grid,
            costmodel.predict(algo, grid, big_world, ab) * 1e3,
            linestyle=ls,
            color=c,
            label=f"{algo} model" + (" (= ring model)" if algo == "builtin" else ""),
        )
        pts = [r for r in rows if r["algo"] == algo and r["bytes"] == big]
        ws = _errorbar(ax2, pts, "world", c, algo, fmt="o-")
        ax2.plot(ws, costmodel.predict(algo, big, ws, ab) * 1e3, linestyle=ls, color=c)
    for ax in (ax0, ax1):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
    ax1.set_title(f"{big_world} ranks", fontsize=9)
    ax2.set_title(f"{big / 2**20:g} MiB", fontsize=9)
    ax2.set_xticks(sorted({r["world"] for r in rows}))
    ax2.set_xlabel("ranks")
    ax0.set_ylabel("time (ms)")
    lo, hi = ax1.get_ylim()
    ax1.set_ylim(lo, hi * 8)  # headroom on the log axis: the 6-entry legend sits above the data
    ax1.legend(fontsize=7, loc="upper left", ncol=2)
    for ax in (ax0, ax2):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_bus_bandwidth(rows: list, ab, measured_on: str):
    """Bus bandwidth 2(N-1)/N * n / t of every measured all-reduce, beside the link's 1/beta."""
    from helpers.parallel import costmodel

    fig, (ax,) = new_figure(
        "bus bandwidth of each all-reduce (same formula for all)", measured_on, width=7.5
    )
    worlds = sorted({r["world"] for r in rows})
    styles = ["o-", "s--", "^:", "v-."]
    for j, algo in enumerate(
        a for a in ("ring", "ps", "builtin") if any(r["algo"] == a for r in rows)
    ):
        for k, w in enumerate(worlds):
            pts = sorted(
                (r["bytes"], r["seconds"]) for r in rows if r["algo"] == algo and r["world"] == w
            )
            n, t = zip(*pts, strict=True)
            bw = costmodel.bus_bandwidth(n, w, t) / 1e9
            ax.plot(n, bw, styles[k % 4], color=f"C{j}", ms=4, label=f"{algo}, {w} ranks")
    ax.axhline(ab.bandwidth / 1e9, color="k", lw=1)
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


def plot_ps_vs_ring(n_bytes: float, rows: list, measured_on: str):
    """Bytes the busiest rank sends (a model: counted, not measured) and measured times."""
    import numpy as np

    from helpers.parallel import costmodel

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
