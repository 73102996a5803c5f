"""Figures of notebook 10 (expert parallelism): the load per expert, balance and drops over
training runs, what imbalance costs on the ranks, all-to-all time against the bytes, and the
explorer of E, k, N, capacity and skew."""

from __future__ import annotations

from helpers.viz.common import new_figure


def plot_load(loads: dict, cap: int | None, measured_on: str | None, title: str,
              cap_label: str = "capacity", dropped: dict | None = None):  # fmt: skip
    """One bar chart per routing: assignments per expert, and the capacity as a dashed line
    (labelled ``cap_label``). loads: {name: [count per expert]}. Without ``dropped``, a bar over
    the capacity is red (one source: its excess is what is dropped); with it ({name: [dropped
    per expert]}), each bar's dropped part is red, however the drops were decided."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = new_figure(title, measured_on, ncols=len(loads), width=4.2)
    for ax, (name, load) in zip(axes, loads.items(), strict=True):
        load = [int(c) for c in load]
        if dropped is None:
            ax.bar(
                range(len(load)),
                load,
                color=["tab:red" if cap and c > cap else "tab:blue" for c in load],
            )
        else:
            lost = [int(c) for c in dropped[name]]
            kept = [c - d for c, d in zip(load, lost, strict=True)]
            ax.bar(range(len(load)), kept, color="tab:blue", label="kept")
            ax.bar(range(len(load)), lost, bottom=kept, color="tab:red", label="dropped")
        if cap:
            ax.axhline(cap, color="k", ls="--", lw=1, label=f"{cap_label} {cap}")
            ax.legend(fontsize=7)
        ax.axhline(sum(load) / len(load), color="0.5", lw=1, ls=":")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("expert")
        ax.set_ylabel("token assignments")
        ax.set_title(name, fontsize=9)
    fig.tight_layout()
    return fig


def plot_mean_load(runs: dict, measured_on: str, last: int = 20):
    """One panel per setup: each expert's load averaged over the ``last`` steps, experts sorted
    busiest first, the seeds' mean as bars and their range as whiskers (the router's lasting
    preference: one batch's noise averages out); dotted, the mean load; red, a step's busiest
    expert averaged over the same steps (what each step pays). runs: {name: [RunResult]}."""
    import numpy as np

    fig, axes = new_figure(f"load per expert, averaged over the last {last} steps, and what one step pays",
                           measured_on, ncols=len(runs), width=3.4)  # fmt: skip
    top = 0.0
    for ax, (name, results) in zip(axes, runs.items(), strict=True):
        window = [
            np.array(r.load[-last:], dtype=float) for r in results
        ]  # [seed] -> [step, expert]
        sorted_mean = np.array(
            [-np.sort(-w.mean(0)) for w in window]
        )  # [seed, expert], busiest first
        busiest_step = np.mean([w.max(1).mean() for w in window])
        mean = sorted_mean.mean(0)
        err = [mean - sorted_mean.min(0), sorted_mean.max(0) - mean]
        ax.bar(range(len(mean)), mean, yerr=err, capsize=2, color="tab:blue")
        ax.axhline(window[0].sum(1).mean() / window[0].shape[1], color="0.5", lw=1, ls=":")
        ax.axhline(busiest_step, color="tab:red", lw=1.2, ls="--", label="a step's busiest")
        top = max(top, busiest_step, float(sorted_mean.max()))
        ax.set_xticks(range(len(mean)), [str(i + 1) for i in range(len(mean))], fontsize=7)
        ax.set_xlabel("experts, busiest first")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[0].set_ylabel("assignments per step")
    for ax in axes:
        ax.set_ylim(0, 1.15 * top)
    fig.tight_layout()
    return fig


def plot_balance(runs: dict, measured_on: str, window: int = 10):
    """Left: the busiest expert's load over the mean; right: the task loss; per step, each a
    moving average over ``window`` steps, the mean over the seeds as a line and their range as a
    band. runs: {name: [RunResult per seed]}."""
    import numpy as np

    fig, (ax_i, ax_l) = new_figure("balancing: load of the busiest expert, and the task loss",
                                   measured_on, ncols=2)  # fmt: skip
    colours = ["0.3", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    kernel = np.ones(window) / window
    for (name, results), colour in zip(runs.items(), colours, strict=False):
        ratio = [[max(s) / (sum(s) / len(s)) for s in r.load] for r in results]
        for ax, series in ((ax_i, ratio), (ax_l, [r.loss for r in results])):
            smooth = np.array([np.convolve(v, kernel, mode="valid") for v in series])
            steps = np.arange(window - 1, window - 1 + smooth.shape[1])
            ax.plot(steps, smooth.mean(0), color=colour, label=name)
            ax.fill_between(steps, smooth.min(0), smooth.max(0), color=colour, alpha=0.15, lw=0)
    ax_i.set_xlabel("step")
    ax_i.set_ylabel(f"busiest expert / mean load ({window}-step average)")
    ax_l.set_xlabel("step")
    ax_l.set_ylabel(f"task loss, MSE ({window}-step average)")
    ax_l.set_yscale("log")
    for ax in (ax_i, ax_l):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_imbalance(runs: dict, measured_on: str):
    """Per router skew, per rank: the rows its experts received (left) and its experts' CPU
    milliseconds, the least of its repeats (right). runs: {label: [time_layer's dict per rank]}."""
    import numpy as np

    fig, (ax_r, ax_c) = new_figure("what the skew does to each rank: its experts' rows and work",
                                   measured_on, ncols=2)  # fmt: skip
    labels = list(runs)
    ranks = len(runs[labels[0]])
    width = 0.8 / ranks
    for r in range(ranks):
        at = np.arange(len(labels)) + (r - (ranks - 1) / 2) * width
        ax_r.bar(at, [runs[lab][r]["rows_received"] for lab in labels], width, label=f"rank {r}")
        ax_c.bar(at, [1e3 * runs[lab][r]["experts_cpu_s"] for lab in labels], width)
    for ax, name in (
        (ax_r, "rows received (its experts' work)"),
        (ax_c, "experts, CPU ms (least of the repeats)"),
    ):
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel(name)
    ax_r.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_a2a_time(sizes: list, seconds: list, fit, measured_on: str):
    """All-to-all time against the bytes a rank sends: the median of the repeats (dots) and
    their range (whiskers), and the least-squares alpha + beta n. seconds: [repeats per size]."""
    import statistics

    fig, (ax,) = new_figure("one all_to_all_single: time against bytes", measured_on)
    med = [1e3 * statistics.median(s) for s in seconds]
    low = [m - 1e3 * min(s) for m, s in zip(med, seconds, strict=True)]
    high = [1e3 * max(s) - m for m, s in zip(med, seconds, strict=True)]
    ax.errorbar(
        sizes,
        med,
        yerr=[low, high],
        fmt="o",
        capsize=3,
        label="measured: median, range of the repeats",
    )
    alpha, beta = fit
    ax.plot(sizes, [1e3 * (alpha + beta * n) for n in sizes], "--",
            label="alpha + beta n (least squares)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes a rank sends")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def explorer(draw, tokens: int = 4096):
    """Sliders for E, k, N, the capacity factor and the skew: the load per expert with its
    capacity (per source: N x the capacity of one rank's tokens), the drops, and what the busiest
    receiver gets. draw: routing_draw."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    wide = {"style": {"description_width": "initial"}}
    n_experts = W.Dropdown(options=[8, 16, 32, 64], value=16, description="experts E", **wide)
    k = W.IntSlider(value=2, min=1, max=8, description="top-k", **wide)
    ranks = W.Dropdown(options=[1, 2, 4, 8], value=4, description="EP ranks N", **wide)
    factor = W.FloatSlider(
        value=1.25, min=0.5, max=4.0, step=0.25, description="capacity factor", **wide
    )
    skew = W.FloatSlider(value=0.3, min=0.0, max=2.0, step=0.1, description="router skew", **wide)
    verdict = W.HTML()

    def show(n_experts, k, ranks, factor, skew):
        k = min(k, n_experts)
        res = draw(tokens, n_experts, k, ranks, factor, skew)
        name = f"E = {n_experts}, top-{k}"
        fig = plot_load({name: res["load"].tolist()}, ranks * res["capacity"] if res["capacity"] else None,
                        None, f"{tokens:,} tokens on {ranks} ranks", "N x capacity per source",
                        dropped={name: res["drops"].tolist()})  # fmt: skip
        plt.show()
        sent, got = res["bytes"].sum(1), res["bytes"].sum(0)
        verdict.value = (f"dropped <b>{int(res['drops'].sum()):,}</b> of {tokens * k:,} assignments "
                         f"({float(res['drops'].sum()) / (tokens * k):.1%}), each on its sending rank; "
                         f"busiest expert {int(res['load'].max()):,} vs mean {tokens * k / n_experts:,.0f}. "
                         f"The busiest <b>receiver</b> gets {int(res['received_rows'].max()):,} rows "
                         f"({float(got.max()) / 2**20:.1f} MiB per all-to-all, d 4096, bf16; mean "
                         f"{float(got.float().mean()) / 2**20:.1f}); each rank sends at most "
                         f"{float(sent.max()) / 2**20:.1f} MiB")  # fmt: skip
        return fig

    out = W.interactive_output(show, {"n_experts": n_experts, "k": k, "ranks": ranks,
                                      "factor": factor, "skew": skew})  # fmt: skip
    box = W.VBox([W.HBox([n_experts, k, ranks]), W.HBox([factor, skew]), verdict, out])
    display(box)
    return box
