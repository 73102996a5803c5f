"""Memory per GPU (notebook 04): stacked bars against a budget, estimate vs measurement, the
all-gather / reduce-scatter timeline of FSDP, and an ipywidgets explorer for Llama 2 shapes."""

from __future__ import annotations

from helpers.viz.common import new_figure

__all__ = ["PARTS", "plot_memory_bars", "plot_estimate_vs_measured", "plot_comm_timeline",
           "plot_comm_timelines", "plot_stages", "llama_memory", "explorer"]  # fmt: skip

PARTS = {  # what a GPU holds, bottom to top, and its colour
    "params": "#4c72b0",
    "grads": "#dd8452",
    "optimizer": "#55a868",
    "gathered": "#8172b3",
    "activations": "#c44e52",
}


def plot_memory_bars(bars: dict, budget: float | None = 80e9, title="Memory per GPU",
                     unit: float = 1e9, unit_name="GB", measured_on=None, ax=None):  # fmt: skip
    """``bars``: {label: {part: bytes}} -> one stacked bar per label, and the budget line."""
    fig = None
    if ax is None:
        fig, (ax,) = new_figure(title, measured_on, width=max(6.5, 0.9 * len(bars) + 3))
    labels = list(bars)
    bottom = [0.0] * len(labels)
    for part, colour in PARTS.items():
        heights = [bars[k].get(part, 0.0) / unit for k in labels]
        if any(heights):
            ax.bar(labels, heights, bottom=bottom, color=colour, label=part)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    if budget:  # labelled in the legend, outside the axes: the bars never hide it
        ax.axhline(
            budget / unit, color="k", ls="--", lw=1, label=f"{budget / unit:.4g} {unit_name}"
        )
    ax.set_ylabel(f"{unit_name} per GPU")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: no overlap
    ax.tick_params(axis="x", labelsize=8, rotation=20)
    ax.figure.subplots_adjust(bottom=0.22, right=0.8)  # room for labels and legend
    return fig or ax.figure


def plot_estimate_vs_measured(rows: list[dict], measured_on=None):
    """rows: {"label", "measured": {part: bytes}, "estimated": {part: bytes}} per rank.
    Measured: stacked bars; estimated: a black tick at the estimated total."""
    fig, (ax,) = new_figure("Each rank's model states: measured (bars) vs estimated (ticks)",
                            measured_on, width=max(6.0, 0.6 * len(rows) + 2))  # fmt: skip
    plot_memory_bars({r["label"]: r["measured"] for r in rows}, budget=None, unit=1e3,
                     unit_name="kB", ax=ax)  # fmt: skip
    for i, r in enumerate(rows):
        ax.plot([i - 0.4, i + 0.4], [sum(r["estimated"].values()) / 1e3] * 2, "k-", lw=2)
    ax.set_title("")
    return fig


TIMELINE = {"compute (forward)": "#c7c7c7", "compute (backward)": "#8c8c8c",
            "all-gather (forward)": "#4c72b0", "all-gather (backward)": "#8172b3",
            "reduce-scatter": "#dd8452"}  # fmt: skip


def plot_comm_timeline(events, measured_on=None, title="What FSDP sends, and when (rank 0)",
                       ax=None):  # fmt: skip
    """events: helpers.parallel.sharded.fsdp.CommEvent list -> one row per layer: its compute (grey)
    and its collectives (coloured; hatched: an all-gather issued ahead, a prefetch)."""
    layers = list(dict.fromkeys(e.layer for e in events))
    fig = None
    if ax is None:
        fig, (ax,) = new_figure(title, measured_on, width=9)
    seen = set()
    for e in events:
        compute = e.kind.startswith("compute")
        y = layers.index(e.layer) + (0.0 if compute else 0.18)
        label = None if e.kind in seen else e.kind
        seen.add(e.kind)
        ax.barh(y, e.end - e.start, left=e.start, color=TIMELINE[e.kind], label=label,
                height=0.34 if compute else 0.3, hatch="///" if e.prefetched else None,
                edgecolor="white" if e.prefetched else None, lw=0)  # fmt: skip
    if any(e.prefetched for e in events):
        ax.barh(
            [0], [0], color="white", edgecolor="k", hatch="///", label="issued ahead (prefetch)"
        )
    ax.set_yticks(range(len(layers)), [f"layer {name or 'root'}" for name in layers])
    ax.invert_yaxis()
    ax.set_xlabel("time since the step started (ms)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: bars stay visible
    if fig is not None:
        fig.subplots_adjust(bottom=0.18, left=0.1, right=0.72)
    return fig or ax.figure


def plot_comm_timelines(runs: dict, measured_on=None, title="What FSDP sends, and when"):
    """runs: {panel title: CommEvent list} -> one timeline panel per run, stacked."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9.5, 2.9 * len(runs)), squeeze=False)
    fig.suptitle(title)
    for ax, (name, events) in zip(axes[:, 0], runs.items(), strict=True):
        plot_comm_timeline(events, ax=ax)
        ax.set_title(name, fontsize=9, loc="left")
    if measured_on:
        fig.text(0.99, 0.005, f"measured on {measured_on}", ha="right", va="bottom", fontsize=8,
                 color="0.4")  # fmt: skip
    fig.subplots_adjust(left=0.1, right=0.72, hspace=0.55, bottom=0.1)
    return fig


def plot_stages(rows: list[dict], measured_on=None, unit: float = 1e6, unit_name="MB"):
    """rows: {"label", "sent" (in units of the model's bytes x (N-1)/N), "paper" (the ZeRO
    paper's figure, or None), "rest" and "peak" (bytes)} per stage -> two panels."""
    fig, (left, right) = new_figure("ZeRO stages: what a rank sends per step, and what it holds",
                                    measured_on, ncols=2, width=5.2)  # fmt: skip
    labels = [r["label"] for r in rows]
    x = range(len(rows))
    left.bar(x, [r["sent"] for r in rows], color="#4c72b0", label="counted")
    for i, r in enumerate(rows):
        if r.get("paper") is not None:
            left.plot([i - 0.4, i + 0.4], [r["paper"]] * 2, "k-", lw=2,
                      label="ZeRO paper" if i == 0 else None)  # fmt: skip
    left.set_ylabel("sent per rank and step, in (N-1)/N x model bytes")
    left.legend(fontsize=8)
    right.bar([i - 0.2 for i in x], [r["rest"] / unit for r in rows], width=0.4,
              color="#55a868", label="at rest (between steps)")  # fmt: skip
    right.bar([i + 0.2 for i in x], [r["peak"] / unit for r in rows], width=0.4,
              color="#c44e52", label="peak (during the step)")  # fmt: skip
    right.set_ylabel(f"{unit_name} per rank")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xticks(list(x), labels, fontsize=8)
    fig.subplots_adjust(bottom=0.25, wspace=0.35)
    return fig


def llama_memory(name: str, dp: int, stage: int, precision: str = "mixed", checkpoint=False,
                 micro_batch: int = 1, seq: int = 4096, offload=False, eager=False) -> dict:  # fmt: skip
    """{part: bytes} per GPU for a Llama 2 shape (helpers.models.llama2.CONFIGS[name]).
    ``eager``: attention that stores its s x s probabilities (not flash attention)."""
    from helpers.models import llama2
    from helpers.parallel.sharded import memory

    args = llama2.CONFIGS[name]
    n = llama2.param_count(args)
    states = memory.estimate(n, dp, stage, precision, offload=offload and stage > 0,
                             largest=memory.llama_largest_unit(args))  # fmt: skip
    # SwiGLU keeps four ffn-wide tensors where a GELU MLP keeps two: ffn = 2 x ffn_hidden
    acts = memory.activations(micro_batch, seq, args.dim, args.n_heads, args.n_layers,
                              checkpoint=checkpoint, bytes_per_value=2 if precision == "mixed"
                              else 4, ffn=2 * args.ffn_hidden, eager=eager)  # fmt: skip
    return {**states.as_dict(), "activations": acts.peak}


def explorer(budget: float = 80e9):
    """Pick a Llama 2 size, DP degree, precision, checkpointing: bars for ZeRO stages 0-3."""
    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    wide = {"style": {"description_width": "initial"}}  # labels in full, not cut at 80 px
    small = {"layout": W.Layout(width="180px"), **wide}
    model = W.Dropdown(options=["7B", "13B", "70B"], value="7B", description="Llama 2", **small)
    dp = W.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128], value=8, description="DP degree",
                    **small)  # fmt: skip
    seq = W.Dropdown(options=[1024, 2048, 4096], value=4096, description="sequence", **small)
    precision = W.ToggleButtons(options=["mixed", "fp32"], description="precision", **wide)
    mb = W.IntSlider(value=1, min=1, max=16, description="micro-batch", **wide)
    ckpt = W.Checkbox(value=False, description="activation checkpointing", indent=False)
    offload = W.Checkbox(value=False, description="CPU offload (stages 1-3)", indent=False)
    eager = W.Checkbox(value=False, description="eager attention (keeps the s x s scores)",
                       indent=False)  # fmt: skip
    verdict = W.HTML()

    def draw(model, dp, precision, ckpt, offload, mb, seq, eager):
        bars = {f"ZeRO-{s}" + (" (DDP)" if s == 0 else " (FSDP)" if s == 3 else ""):
                llama_memory(model, dp, s, precision, ckpt, mb, seq, offload, eager)
                for s in range(4)}  # fmt: skip
        plot_memory_bars(bars, budget, title=f"Llama 2 {model}, {dp} GPUs, seq {seq}, mb {mb}")
        plt.show()
        fits = [k for k, v in bars.items() if sum(v.values()) <= budget]
        verdict.value = (f"<b>fits in {budget / 1e9:g} GB:</b> {', '.join(fits)}"
                         if fits else "<b>nothing fits</b>: raise the DP degree, turn on "
                         "checkpointing or offload, or shorten the micro-batch")  # fmt: skip

    controls = dict(model=model, dp=dp, precision=precision, ckpt=ckpt, offload=offload, mb=mb,
                    seq=seq, eager=eager)  # fmt: skip
    out = W.interactive_output(draw, controls)
    rows = [W.HBox([model, dp, seq]), W.HBox([precision, mb]), W.HBox([ckpt, offload, eager])]
    box = W.VBox([*rows, verdict, out])
    display(box)
    return box
