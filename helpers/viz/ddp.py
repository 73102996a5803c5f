"""Figures of notebook 03: DDP bucket timeline, learning-rate study, scaling."""

from __future__ import annotations

from helpers.viz.common import new_figure


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


def plot_megatron_weak_scaling(table: list[dict]):
    """Seed 000's Megatron-LM table (Narayanan et al., SC 2021): real-cluster weak scaling.

    table rows: dict(gpus, params_b, tflops_per_gpu, peak_pct, pflops). Left: aggregate
    PFLOP/s against GPUs with the ideal (the first row x GPUs / its GPUs); right:
    TFLOP/s per GPU, which weak scaling keeps flat.
    """
    import numpy as np

    fig, (ax_a, ax_g) = new_figure(
        "Megatron-LM on A100 GPUs (published data, not measured here)", None, ncols=2
    )
    fig.text(0.99, 0.01, "data: Narayanan et al. 2021, Selene cluster (DGX A100, InfiniBand)",
             ha="right", va="bottom", fontsize=8, color="0.4")  # fmt: skip
    g = np.array([r["gpus"] for r in table], dtype=float)
    agg = np.array([r["pflops"] for r in table])
    per = np.array([r["tflops_per_gpu"] for r in table])
    ax_a.loglog(g, agg, "o-", label="measured by the authors")
    ax_a.loglog(g, agg[0] * g / g[0], "--", color="0.5", label="ideal: N x the 32-GPU rate")
    for r in table[:: max(1, len(table) // 5)]:
        ax_a.annotate(f"{r['params_b']:g}B", (r["gpus"], r["pflops"]), fontsize=7,
                      xytext=(4, -10), textcoords="offset points")  # fmt: skip
    ax_a.set(xlabel="GPUs", ylabel="aggregate PFLOP/s")
    ax_a.legend(fontsize=8)
    ax_g.semilogx(g, per, "o-", color="C2")
    ax_g.set_ylim(0, 330)
    ax_g.axhline(312, color="0.5", ls=":", lw=1)
    ax_g.text(g[0], 300, "A100 bf16 peak: 312 TFLOP/s", fontsize=7, va="top")
    ax_g.set(xlabel="GPUs (model grows with them)", ylabel="TFLOP/s per GPU")
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
