"""Figures of notebook 03: DDP bucket timeline, learning-rate study, scaling."""

from __future__ import annotations

from helpers.viz.common import new_figure


def _stacked(title: str, measured_on: str | None, rows: list[int], width: float = 9.0):
    """Panels stacked vertically (one per entry of ``rows``, height by its row count), shared x."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 1, sharex=True, squeeze=False,
                             figsize=(width, 0.9 + 0.24 * sum(rows) + 0.35 * len(rows)),
                             gridspec_kw={"height_ratios": [max(r, 1) for r in rows]})  # fmt: skip
    fig.suptitle(title)
    if measured_on:
        fig.text(0.99, 0.005, f"measured on {measured_on}", ha="right", va="bottom", fontsize=8,
                 color="0.4")  # fmt: skip
    return fig, [a[0] for a in axes]


def _rows(ax, spans: list, events: list, title: str) -> None:
    """Compute spans (label, start s, end s, colour) on top, then one row per all-reduce."""
    labels = []
    for row, (label, start, end, color) in enumerate(spans):
        ax.barh(row, (end - start) * 1e3, left=start * 1e3, height=0.7, color=color)
        labels.append(label)
    for k, e in enumerate(events):
        row = len(spans) + k
        ax.barh(row, max(e["done"] - e["launched"], 1e-5) * 1e3, left=e["launched"] * 1e3,
                height=0.7, color=f"C{k % 10}", edgecolor="k", linewidth=0.4)  # fmt: skip
        labels.append(f"{e['label']} ({4 * e['numel'] / 1024:.1f} KiB)")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first row on top
    ax.set_title(title, fontsize=9, loc="left")


def plot_bucket_timeline(timelines: dict, measured_on: str):
    """DDP's buckets inside one backward pass: one panel per cap, one row per bucket.

    timelines: {label: helpers.parallel.data.buckets.timeline(...) result}. Grey rows:
    backward without communication (no_sync) and with DDP (it returns when the last
    bucket is averaged); coloured rows: each bucket's all-reduce from launch to done.
    """
    fig, axes = _stacked("DDP buckets during backward (median of repeats)", measured_on,
                         [2 + len(t["buckets"]) for t in timelines.values()])  # fmt: skip
    for ax, (label, t) in zip(axes, timelines.items(), strict=True):
        spans = [("backward, no_sync", 0.0, t["backward_no_comm"], "0.8"),
                 ("backward with DDP", 0.0, t["backward"], "0.55")]  # fmt: skip
        rows = [{**b, "label": f"bucket {b['index']}"} for b in t["buckets"]]
        _rows(ax, spans, rows, f"bucket_cap_mb = {label}: {len(rows)} bucket(s)")
    axes[-1].set_xlabel("ms since backward started")
    fig.tight_layout()
    return fig


def plot_overlap_timeline(results: dict, measured_on: str):
    """One training step per way of averaging: its phases, then every all-reduce.

    results: helpers.parallel.data.ddp_timeline.measure(...). Each panel is the route's
    median step (one real step, so its bars belong together); the first panel is
    the step without any communication, the compute alone. The red line is when the
    gradients were averaged on this rank.
    """
    fig, axes = _stacked("What is in flight during one step (each route's median step)",
                         measured_on, [3 + len(r["events"]) for r in results.values()])  # fmt: skip
    for ax, (route, r) in zip(axes, results.items(), strict=True):
        t = r["typical"]
        spans = [("forward", 0.0, t["forward"], "0.75"),
                 ("backward", t["forward"], t["backward"], "0.5"),
                 ("wait, then step", t["backward"], t["step"], "0.85")]  # fmt: skip
        _rows(ax, spans, r["events"],
              f"{route}: {len(r['events'])} all-reduce(s), step {1e3 * t['step']:.1f} ms")  # fmt: skip
        if r["events"]:
            ax.axvline(1e3 * t["synced"], color="C3", lw=1)
    axes[-1].set_xlabel("ms since the step started (rank 0)")
    fig.tight_layout(rect=(0, 0.01, 1, 0.985))
    fig.legend(handles=[_legend_line("C3", "gradients averaged on this rank")], loc="upper right",
               fontsize=7, frameon=False)  # fmt: skip
    return fig


def _legend_line(color: str, label: str):
    """A legend entry: a short line of ``color``."""
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, lw=1, label=label)


def plot_lr_study(runs: dict, epochs: int, measured_on: str):
    """Training loss and learning rate against epochs, mean over seeds with a min..max band.

    runs: {label: [metrics of each seed from helpers.programs.train_ddp.train]}, each
    with per-step "loss" and "lr". The x axis is epochs (samples seen / training set),
    so recipes with different global batches (and step counts) line up.
    """
    import numpy as np

    fig, (ax_loss, ax_lr) = new_figure(
        "Large global batch: learning-rate recipes (mean of seeds, band = min..max)",
        measured_on,
        ncols=2,
    )
    for i, (label, seeds) in enumerate(runs.items()):
        loss = np.array([m["loss"] for m in seeds])  # (seeds, steps)
        x = np.arange(1, loss.shape[1] + 1) * epochs / loss.shape[1]
        ax_loss.plot(x, loss.mean(0), color=f"C{i}", label=label, lw=1.2)
        ax_loss.fill_between(x, loss.min(0), loss.max(0), color=f"C{i}", alpha=0.15)
        ax_lr.plot(x, seeds[0]["lr"], color=f"C{i}", label=label, lw=1.2)
    ax_loss.set(xlabel="epochs (samples seen / training set)", ylabel="training loss")
    ax_loss.set_ylim(top=min(ax_loss.get_ylim()[1], 4.0))
    ax_lr.set(xlabel="epochs", ylabel="learning rate (schedule)", yscale="log")
    ax_loss.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_published_ddp_scaling(efficiency: dict):
    """Published data-parallel weak scaling: efficiency against GPUs, one line per source.

    efficiency: {label: {gpus: per-GPU throughput / the source's own baseline}}. The data
    are as published (Goyal et al. 2017; PyTorch's DDP benchmark; PyTorch issue #17159).
    """
    fig, (ax,) = new_figure("Data-parallel weak scaling on GPU clusters (published data, "
                            "not measured here)", None, width=8.5)  # fmt: skip
    for i, (label, pts) in enumerate(efficiency.items()):
        g = sorted(pts)
        ax.plot(g, [pts[k] for k in g], "o-", color=f"C{i}", label=label)
    ax.axhline(1.0, color="0.5", ls="--", lw=0.8)
    ax.axvline(8.5, color="0.6", ls=":", lw=1)
    ax.text(9, 0.52, "more than one\n8-GPU machine", fontsize=7, color="0.4")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="GPUs (fixed batch per GPU)", ylim=(0.5, 1.05),
           ylabel="per-GPU throughput / baseline's")  # fmt: skip
    ax.legend(fontsize=7, loc="lower right")
    fig.text(0.99, 0.01, "data: Goyal et al. 2017 (baseline 8 GPUs); PyTorch benchmarks/distributed/ddp "
             "README; PyTorch issue #17159 (baseline 1 GPU)", ha="right", va="bottom", fontsize=7,
             color="0.4")  # fmt: skip
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def plot_megatron_weak_scaling(table: list[dict]):
    """Narayanan et al. (SC 2021), Table 1: 3-D parallelism (tensor x pipeline x data), published.

    table rows: dict(gpus, params_b, dp, tflops_per_gpu, peak_pct, pflops). Left: aggregate
    PFLOP/s against GPUs with the ideal (the first row x GPUs / its GPUs), each point
    labelled with its data-parallel degree; right: TFLOP/s per GPU.
    """
    import numpy as np

    fig, (ax_a, ax_g) = new_figure(
        "Megatron-LM GPT runs, 3-D parallelism on A100 GPUs (published data, not measured here)",
        None,
        ncols=2,
    )
    fig.text(0.99, 0.01, "data: Narayanan et al. 2021, Table 1; Selene (DGX A100, NVLink + NVSwitch, "
             "8 x 200 Gb/s HDR InfiniBand per node)", ha="right", va="bottom", fontsize=8,
             color="0.4")  # fmt: skip
    g = np.array([r["gpus"] for r in table], dtype=float)
    agg = np.array([r["pflops"] for r in table])
    per = np.array([r["tflops_per_gpu"] for r in table])
    ax_a.loglog(g, agg, "o-", label="measured by the authors")
    ax_a.loglog(g, agg[0] * g / g[0], "--", color="0.5", label="ideal: N x the 32-GPU rate")
    for r in table[:: max(1, len(table) // 5)]:
        ax_a.annotate(f"{r['params_b']:g}B, dp={r.get('dp', '?')}", (r["gpus"], r["pflops"]),
                      fontsize=7, xytext=(4, -10), textcoords="offset points")  # fmt: skip
    ax_a.set(xlabel="GPUs (the model grows with them)", ylabel="aggregate PFLOP/s")
    ax_a.legend(fontsize=8)
    ax_g.semilogx(g, per, "o-", color="C2")
    ax_g.set_ylim(0, 330)
    ax_g.axhline(312, color="0.5", ls=":", lw=1)
    ax_g.text(g[0], 300, "A100 bf16 peak: 312 TFLOP/s", fontsize=7, va="top")
    ax_g.set(xlabel="GPUs (tensor x pipeline x data)", ylabel="TFLOP/s per GPU")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
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
