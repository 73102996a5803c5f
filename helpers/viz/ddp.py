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
