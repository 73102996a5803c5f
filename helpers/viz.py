"""Plots used by the notebooks.

Every function returns the matplotlib Figure (so notebooks can save or tweak
it) and draws with the Agg-safe API, so papermill and CI render figures
without a display. Functions that plot measurements take a ``measured_on``
string that is printed under the title: a figure that depends on hardware
says what it was measured on.
"""

from __future__ import annotations

# No backend is forced: notebooks use the inline backend, headless scripts and
# CI get Agg from matplotlib's own fallback (tests also set MPLBACKEND=Agg).
import matplotlib.pyplot as plt


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


# --------------------------------------------------------------------- collectives (notebook 02)


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

    from helpers import costmodel

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

    from helpers import costmodel

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


# --------------------------------------------------------------------------- 01: one device


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


# --------------------------------------------------------------------------- DDP (notebook 03)


def plot_bucket_timeline(timelines: dict, measured_on: str):
    """DDP buckets inside one backward pass, one row per bucket size.

    timelines: {label: helpers.buckets.timeline(...) result}. Grey: backward
    without communication (no_sync); coloured: each bucket's all_reduce from
    launch to completion; black tick: when backward returned with DDP.
    """
    fig, (ax,) = new_figure("DDP buckets during backward", measured_on, width=8.5)
    labels = list(timelines)
    for row, label in enumerate(labels):
        t = timelines[label]
        ax.barh(row, t["backward_no_comm"] * 1e3, height=0.7, color="0.85",
                label="backward compute (no_sync)" if row == 0 else None)  # fmt: skip
        for b in t["buckets"]:
            ax.barh(row, (b["done"] - b["launched"]) * 1e3, left=b["launched"] * 1e3, height=0.35,
                    color=f"C{b['index'] % 10}", edgecolor="k", linewidth=0.5)  # fmt: skip
            ax.text(b["launched"] * 1e3, row + 0.22, f"b{b['index']}", fontsize=7, va="bottom")
        ax.plot([t["backward"] * 1e3] * 2, [row - 0.4, row + 0.4], color="k", lw=2,
                label="backward returns (DDP)" if row == 0 else None)  # fmt: skip
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("ms since backward started (median of repeats)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def plot_lr_study(runs: dict, measured_on: str):
    """Loss and learning rate per step for each learning-rate recipe.

    runs: {label: metrics from helpers.programs.train_ddp.train} with "loss" and "lr".
    """
    fig, (ax_loss, ax_lr) = new_figure("Large global batch: learning-rate recipes", measured_on,
                                       ncols=2)  # fmt: skip
    for i, (label, m) in enumerate(runs.items()):
        ax_loss.plot(m["loss"], color=f"C{i}", label=label, lw=1.2)
        ax_lr.plot(m["lr"], color=f"C{i}", label=label, lw=1.2)
    ax_loss.set(xlabel="optimizer step", ylabel="training loss (mean over ranks)")
    ax_loss.set_ylim(top=min(ax_loss.get_ylim()[1], 4.0))
    ax_lr.set(xlabel="optimizer step", ylabel="learning rate", yscale="log")
    ax_loss.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_scaling(rows: list, measured_on: str, same_hardware: bool = True):
    """Throughput and efficiency against ranks for weak and strong scaling.

    rows: helpers.scaling.add_efficiency(helpers.scaling.run_study(...)).
    Dashed: the ideal when every rank brings its own device (N x the first point).
    same_hardware: all rows shared the same cores (a laptop study), so splitting
    them into more ranks without any overhead would keep the first point's
    throughput (dotted), an efficiency of 1/N.
    """
    fig, (ax_x, ax_e) = new_figure("Data-parallel scaling", measured_on, ncols=2)
    ranks = sorted({r["ranks"] for r in rows})
    for i, mode in enumerate(sorted({r["mode"] for r in rows}, reverse=True)):
        sel = [r for r in rows if r["mode"] == mode]
        n = [r["ranks"] for r in sel]
        x = [r["samples_per_s"] for r in sel]
        ax_x.plot(n, x, "o-", color=f"C{i}", label=f"{mode} (measured)")
        ax_x.plot(n, [x[0] * k / n[0] for k in n], "--", color=f"C{i}", alpha=0.5,
                  label=f"{mode}: ideal, one device per rank")  # fmt: skip
        if same_hardware:
            ax_x.plot(n, [x[0]] * len(n), ":", color=f"C{i}", alpha=0.8,
                      label=f"{mode}: same cores, no overhead")  # fmt: skip
        ax_e.plot(n, [r["efficiency"] for r in sel], "o-", color=f"C{i}", label=mode)
        for r in sel:
            if r.get("oversubscribed") and i == 0:  # one note per rank count is enough
                ax_e.annotate("more ranks\nthan cores", (r["ranks"], r["efficiency"]),
                              xytext=(-8, 12), textcoords="offset points", fontsize=7,
                              ha="right")  # fmt: skip
    if same_hardware:
        ax_e.plot(ranks, [ranks[0] / k for k in ranks], ":", color="0.3",
                  label="same cores, no overhead (1/N)")  # fmt: skip
    ax_x.set(xlabel="ranks", ylabel="samples/s (all ranks)", xticks=ranks)
    top = max([1.2] + [1.1 * r["efficiency"] for r in rows])  # > 1 happens: see the notebook
    ax_e.set(xlabel="ranks", ylabel="parallel efficiency X(N) / (N X(1))", xticks=ranks,
             ylim=(0, top))  # fmt: skip
    ax_e.axhline(1.0, color="0.5", lw=0.8, ls="--")
    ax_x.legend(fontsize=7)
    ax_e.legend(fontsize=7)
    fig.tight_layout()
    return fig
