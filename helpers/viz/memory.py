"""Memory per GPU (notebook 04): stacked bars against a budget, estimate vs measurement, the
all-gather / reduce-scatter timeline of FSDP, and an ipywidgets explorer for Llama 2 shapes."""

from __future__ import annotations

from helpers.viz.common import new_figure

__all__ = ["PARTS", "plot_memory_bars", "plot_estimate_vs_measured", "plot_comm_timeline",
           "llama_memory", "explorer"]  # fmt: skip

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
    if budget:
        ax.axhline(budget / unit, color="k", ls="--", lw=1)
        ax.text(len(labels) - 0.5, budget / unit, f" {budget / unit:g} {unit_name}", va="bottom",
                ha="right", fontsize=8)  # fmt: skip
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


def plot_comm_timeline(events, measured_on=None, title="What FSDP sends, and when (rank 0)"):
    """events: helpers.parallel.fsdp.CommEvent list -> one row per layer, coloured by kind."""
    colours = {"all-gather (forward)": "#4c72b0", "all-gather (backward)": "#8172b3",
               "reduce-scatter": "#dd8452"}  # fmt: skip
    layers = list(dict.fromkeys(e.layer for e in events))
    fig, (ax,) = new_figure(title, measured_on, width=9)
    seen = set()
    for e in events:
        y = layers.index(e.layer)
        label = None if e.kind in seen else e.kind
        seen.add(e.kind)
        ax.barh(y, e.end - e.start, left=e.start, color=colours[e.kind], label=label, height=0.6)
    ax.set_yticks(range(len(layers)), [f"layer {name or 'root'}" for name in layers])
    ax.invert_yaxis()
    ax.set_xlabel("time since the step started (ms)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: bars stay visible
    fig.subplots_adjust(bottom=0.18, left=0.1, right=0.75)
    return fig


def llama_memory(name: str, dp: int, stage: int, precision: str = "mixed", checkpoint=False,
                 micro_batch: int = 1, seq: int = 4096, offload=False) -> dict:  # fmt: skip
    """{part: bytes} per GPU for a Llama 2 shape (helpers.models.llama2.CONFIGS[name])."""
    from helpers.models import llama2
    from helpers.parallel import memory

    args = llama2.CONFIGS[name]
    n = llama2.param_count(args)
    # FSDP gathers one unit at a time: a whole block, or the embedding / output matrix
    block = (n - 2 * args.vocab_size * args.dim - args.dim) // args.n_layers
    largest = max(block, args.vocab_size * args.dim)
    states = memory.estimate(n, dp, stage, precision, offload=offload and stage > 0,
                             largest=largest)  # fmt: skip
    # SwiGLU keeps four ffn-wide tensors where a GELU MLP keeps two: ffn = 2 x ffn_hidden
    acts = memory.activations(micro_batch, seq, args.dim, args.n_heads, args.n_layers,
                              checkpoint=checkpoint, bytes_per_value=2 if precision == "mixed"
                              else 4, ffn=2 * args.ffn_hidden)  # fmt: skip
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
    verdict = W.HTML()

    def draw(model, dp, precision, ckpt, offload, mb, seq):
        bars = {f"ZeRO-{s}" + (" (DDP)" if s == 0 else " (FSDP)" if s == 3 else ""):
                llama_memory(model, dp, s, precision, ckpt, mb, seq, offload)
                for s in range(4)}  # fmt: skip
        plot_memory_bars(bars, budget, title=f"Llama 2 {model}, {dp} GPUs, seq {seq}, mb {mb}")
        plt.show()
        fits = [k for k, v in bars.items() if sum(v.values()) <= budget]
        verdict.value = (f"<b>fits in {budget / 1e9:g} GB:</b> {', '.join(fits)}"
                         if fits else "<b>nothing fits</b>: raise the DP degree, turn on "
                         "checkpointing or offload, or shorten the micro-batch")  # fmt: skip

    controls = dict(model=model, dp=dp, precision=precision, ckpt=ckpt, offload=offload, mb=mb,
                    seq=seq)  # fmt: skip
    out = W.interactive_output(draw, controls)
    rows = [W.HBox([model, dp, seq]), W.HBox([precision, mb]), W.HBox([ckpt, offload])]
    box = W.VBox([*rows, verdict, out])
    display(box)
    return box
