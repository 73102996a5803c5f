"""Figures of notebook 06 (tensor parallelism): the two splits, bytes per layer, TP vs DP."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from helpers.viz.common import new_figure

RANK_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def _matrix(ax, x0, y0, w, h, label, pieces=1, axis="cols", colours=None, alpha=0.55):
    """A w x h box at (x0, y0), cut into ``pieces`` along columns or rows, one colour each."""
    for i in range(pieces):
        c = (colours or RANK_COLOURS)[i % len(RANK_COLOURS)] if pieces > 1 else "0.75"
        if axis == "cols":
            box = Rectangle((x0 + i * w / pieces, y0), w / pieces, h)
        else:  # rows, drawn top to bottom
            box = Rectangle((x0, y0 + h - (i + 1) * h / pieces), w, h / pieces)
        box.set(facecolor=c, edgecolor="k", alpha=alpha)
        ax.add_patch(box)
    ax.text(x0 + w / 2, y0 - 0.35, label, ha="center", va="top", fontsize=9)


def plot_splits(world: int = 2):
    """Column split (Y = [X A_1, X A_2], all-gather) and row split (Y = X_1 A_1 + X_2 A_2,
    all-reduce) of Y = X A; colours are ranks."""
    fig, (left, right) = new_figure("Y = X A split over ranks (colour = rank)", ncols=2, width=6)
    n = world
    # column split: X whole, A by columns, Y by columns -> all-gather
    _matrix(left, 0, 1, 2, 2, "X (whole, every rank)")
    _matrix(left, 2.6, 1, 2, 2, "A by columns", n, "cols")
    _matrix(left, 5.2, 1, 2, 2, "Y: rank r holds X A_r", n, "cols")
    left.annotate("AllGather\n(to get all of Y)", (6.2, 3.1), ha="center", va="bottom", fontsize=9)
    left.set_title("column split", fontsize=10)
    # row split: X by columns, A by rows, each rank a full-size partial Y -> all-reduce
    _matrix(right, 0, 1, 2, 2, "X by columns", n, "cols")
    _matrix(right, 2.6, 1, 2, 2, "A by rows", n, "rows")
    for r in range(n):
        off = 0.12 * r
        _matrix(right, 5.2 + off, 1 - off, 2, 2, "" if r else "", 1, alpha=0.25)
        right.add_patch(Rectangle((5.2 + off, 1 - off), 2, 2, fill=False,
                                  edgecolor=RANK_COLOURS[r % len(RANK_COLOURS)], lw=2))  # fmt: skip
    right.text(6.2, 1 - 0.12 * n - 0.35, "partial Y = X_r A_r, every rank", ha="center", va="top",
               fontsize=9)  # fmt: skip
    right.annotate(
        "AllReduce\n(sum of the partials)", (6.2, 3.1), ha="center", va="bottom", fontsize=9
    )
    right.set_title("row split", fontsize=10)
    for ax in (left, right):
        ax.set_xlim(-0.3, 7.8)
        ax.set_ylim(-0.6, 4.0)
        ax.set_aspect("equal")
        ax.axis("off")
    return fig


def plot_bytes_per_variant(rows: dict, measured_on: str):
    """Bars: bytes one rank sent in one forward + backward, per way of splitting a block.

    rows: {variant: {collective name: bytes sent}}.
    """
    fig, (ax,) = new_figure("what one rank sends per training step of one MLP", measured_on)
    names = sorted({c for per in rows.values() for c in per})
    bottom = [0.0] * len(rows)
    for i, c in enumerate(names):
        vals = [rows[v].get(c, 0) / 1024 for v in rows]
        ax.barh(list(rows), vals, left=bottom, label=c, color=RANK_COLOURS[i % 6], alpha=0.8)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xlabel("KiB sent by one rank (ring algorithms)")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_tp_vs_dp(tokens, tp_model, dp_model, counted: dict, world: int, measured_on: str):
    """Bytes a rank sends per step against tokens per step: TP grows, DP is flat.

    counted: {("tp" | "dp", tokens): bytes} counted on real ranks, dots on the model's lines.
    """
    fig, (ax,) = new_figure(f"bytes per rank per training step, {world} ranks", measured_on)
    ax.loglog(tokens, tp_model, "-", color="tab:red", label="TP model: 4 L B T d e 2(N-1)/N")
    ax.loglog(tokens, dp_model, "-", color="tab:blue", label="DP model: P e 2(N-1)/N")
    for mode, colour in (("tp", "tab:red"), ("dp", "tab:blue")):
        pts = sorted((t, b) for (m, t), b in counted.items() if m == mode)
        if pts:
            ax.loglog(*zip(*pts, strict=True), "o", color=colour, label=f"{mode.upper()} counted")
    ax.set_xlabel("tokens per step (batch x sequence)")
    ax.set_ylabel("bytes sent per rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_link_times(rows: list[tuple[str, float]], title: str):
    """Horizontal bars of modelled seconds: [(label, seconds), ...], log scale."""
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.2))
    labels, secs = zip(*rows, strict=True)
    colours = ["tab:red" if lab.startswith("TP") else "tab:blue" for lab in labels]
    ax.barh(labels, [1e3 * s for s in secs], color=colours, alpha=0.8)
    for i, s in enumerate(secs):
        ax.text(1e3 * s, i, f" {1e3 * s:.1f} ms", va="center", fontsize=8)
    ax.set_xlim(0, 1.2e3 * max(secs))
    ax.set_xlabel("milliseconds per step (model)")
    ax.set_title(title, fontsize=10)
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


# Transformer shapes for the explorer: (width d, blocks L, parameters P). Llama 2's sizes.
MODELS = {
    "Llama-2-7B-sized": (4096, 32, 6.74e9),
    "Llama-2-13B-sized": (5120, 40, 13.0e9),
    "Llama-2-70B-sized": (8192, 80, 69.0e9),
}


def link_explorer(step_times, model: str = "Llama-2-7B-sized", tokens: int = 4096, tp: int = 8):
    """An ipywidgets explorer of ``step_times(d, L, P, tokens, tp) -> [(label, seconds)]``
    (the notebook's own model): pick a model, the tokens per step and the TP size, see the
    bars (the static chart above the explorer is what papermill keeps)."""
    import ipywidgets as W
    from IPython.display import display

    sl = {"continuous_update": False, "style": {"description_width": "initial"}}
    controls = {
        "model": W.Dropdown(options=list(MODELS), value=model, description="model"),
        "tokens": W.SelectionSlider(
            options=[2**k for k in range(9, 18)], value=tokens, description="tokens per step", **sl
        ),  # fmt: skip
        "tp": W.SelectionSlider(options=[2, 4, 8, 16], value=tp, description="TP size", **sl),
    }
    out = W.Output()

    def redraw(_=None):
        v = {k: c.value for k, c in controls.items()}
        out.clear_output(wait=True)
        with out:
            fig = plot_link_times(step_times(*MODELS[v["model"]], v["tokens"], v["tp"]),
                                  f"{v['model']}, TP = {v['tp']}, {v['tokens']} tokens per step (model)")  # fmt: skip
            display(fig)
            plt.close(fig)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox(list(controls.values())), out])


MEMORY_PARTS = (("params", "parameters"), ("grads", "gradients"), ("optimizer", "AdamW states"),
                ("activations", "saved activations"))  # fmt: skip


def plot_memory(measured: dict, counted: dict, labels: dict, measured_on: str):
    """Bytes one rank holds, by TP degree and layout: stacked bars measured, a black tick
    where the count (Korthikanti's formula and the shard sizes) puts the total.

    measured, counted: {(layout, tp): {"params": B, "grads": B, "optimizer": B,
    "activations": B}}; labels: {layout: short name under its bar}.
    """
    fig, (ax,) = new_figure("what one rank holds: model states and saved activations",
                            measured_on, width=8)  # fmt: skip
    bars = sorted(measured, key=lambda k: (k[1], list(labels).index(k[0])))
    ticks = []
    for x, (lay, t) in enumerate(bars):
        bottom = 0.0
        for k, (part, name) in enumerate(MEMORY_PARTS):
            v = measured[lay, t][part] / 2**20
            ax.bar(x, v, 0.7, bottom=bottom, color=RANK_COLOURS[k], alpha=0.75, edgecolor="k",
                   lw=0.4, label=name if x == 0 else None)  # fmt: skip
            bottom += v
        ax.plot(x, sum(counted[lay, t].values()) / 2**20, "k_", ms=22, mew=2,
                label="counted (formula)" if x == 0 else None)  # fmt: skip
        ticks.append(f"TP = {t}" if t == 1 else f"{labels[lay]}\nTP = {t}")
    ax.set_xticks(range(len(bars)), ticks, fontsize=8)
    ax.set_ylabel("MiB per rank (measured)")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def plot_overlap(runs: dict, measured_on: str):
    """The backward of a column-parallel layer, median phases: synchronous (the all-reduce
    of dX between dX and dW) against overlapped (the all-reduce in flight during dW).

    runs: {False: [phases], True: [phases]}, each phases a dict with dX, comm, dW, wait.
    """

    def med(rows, key):
        xs = sorted(r[key] for r in rows if isinstance(r[key], float))
        return 1e3 * xs[len(xs) // 2]

    fig, (ax,) = new_figure("backward of a column-parallel layer: median of each phase",
                            measured_on, width=8)  # fmt: skip
    sync, over = runs[False], runs[True]
    lanes = {
        "synchronous": [("dX = dY W", med(sync, "dX"), 0), ("all-reduce dX", med(sync, "comm"), 2),
                        ("dW = dY^T X", med(sync, "dW"), 1)],
        "overlapped": [("dX = dY W", med(over, "dX"), 0), ("dW = dY^T X", med(over, "dW"), 1),
                       ("wait for the all-reduce", med(over, "wait"), 3)],
    }  # fmt: skip
    for y, phases in enumerate(lanes.values()):
        start = 0.0
        for name, ms, colour in phases:
            ax.barh(y, ms, left=start, color=RANK_COLOURS[colour], alpha=0.8, edgecolor="k")
            if ms > 0.04 * sum(p[1] for p in phases):
                ax.text(start + ms / 2, y, f"{name}\n{ms:.0f} ms", ha="center", va="center",
                        fontsize=7)  # fmt: skip
            start += ms
    dx, flight = lanes["overlapped"][0][1], lanes["overlapped"][1][1] + lanes["overlapped"][2][1]
    ax.barh(1.42, flight, left=dx, height=0.16, color=RANK_COLOURS[2], alpha=0.8)
    ax.text(dx, 1.62, "all-reduce of dX in flight (launched with async_op=True)", fontsize=7)
    ax.set_yticks([0, 1], list(lanes))
    ax.set_ylim(-0.6, 1.9)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds (median of each phase)")
    fig.tight_layout()
    return fig


def plot_degree(sweep: dict, measured_on: str):
    """Seconds per training step by TP degree: compute and collectives (medians), with the
    spread of the step time (min to max over the repeats)."""
    fig, (ax,) = new_figure("one training step by tensor-parallel degree", measured_on)
    degrees = sorted(sweep)

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    comm = [1e3 * med(sweep[t]["comm"]) for t in degrees]
    comp = [1e3 * med([s - c for s, c in zip(sweep[t]["step"], sweep[t]["comm"], strict=True)])
            for t in degrees]  # fmt: skip
    xs = range(len(degrees))
    ax.bar(xs, comp, color="tab:blue", alpha=0.8, label="compute (step - collectives)")
    ax.bar(xs, comm, bottom=comp, color="tab:red", alpha=0.8, label="inside TP's collectives")
    for x, t in zip(xs, degrees, strict=True):
        steps = [1e3 * s for s in sweep[t]["step"]]
        ax.plot([x, x], [min(steps), max(steps)], "k-", lw=1)
        ax.plot(x, med(steps), "ko", ms=4, label="step: median, min-max" if x == 0 else None)
    ax.set_xticks(list(xs), [f"TP = {t}" for t in degrees])
    ax.set_ylabel("milliseconds per step (rank 0)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
