"""Drawings of a 3D layout and of the planner's ranking.

plot_rank_grid(dims): one box per node, one square per GPU, coloured by pipeline stage,
labelled with its rank and (dp, tp) coordinates; TP pairs share a bracket (inside a node).
plot_layouts(layouts, cluster): the planner's estimated step time (compute and each overhead,
from 0) and memory; plot_validation(rows, measured_on): predicted against measured.
"""

from __future__ import annotations

import matplotlib.patches as mpatches
import matplotlib.pyplot as plt

__all__ = ["plot_rank_grid", "plot_layouts", "plot_validation"]

STAGE_COLOURS = plt.get_cmap("tab10").colors


def plot_rank_grid(dims, title: str | None = None):
    """Seed 000's picture for any ParallelDims (needs gpus_per_node)."""
    per_node = dims.gpus_per_node or dims.world_size
    nodes = dims.world_size // per_node
    cols = min(per_node, 8)
    rows_per_node = -(-per_node // cols)
    units_high = nodes * (rows_per_node + 0.5) + 0.6  # what the axes show, in boxes
    inch = 0.8 * (cols + 2.5) / (cols + 0.7)  # inches per box: the axes take ~80 % of the width
    fig, ax = plt.subplots(figsize=(cols + 2.5, units_high * inch + 0.7))
    for rank in range(dims.world_size):
        node, slot = divmod(rank, per_node)
        row, col = divmod(slot, cols)
        y = -(node * (rows_per_node + 0.5) + row)
        c = dims.coords(rank)
        ax.add_patch(
            mpatches.FancyBboxPatch(
                (col + 0.08, y + 0.08),
                0.84,
                0.84,
                boxstyle="round,pad=0.02",
                color=STAGE_COLOURS[c["pp"] % 10],
                alpha=0.75,
            )
        )
        ax.text(
            col + 0.5, y + 0.62, f"{rank}", ha="center", va="center", fontsize=11, weight="bold"
        )
        ax.text(
            col + 0.5, y + 0.3, f"dp{c['dp']} tp{c['tp']}", ha="center", va="center", fontsize=7
        )
        if c["tp"] == 0 and dims.tp > 1:  # bracket under a TP group
            ax.plot([col + 0.1, col + dims.tp - 0.1], [y + 0.02, y + 0.02], color="k", lw=2)
    for node in range(nodes):
        y = -(node * (rows_per_node + 0.5) + rows_per_node - 1)
        ax.add_patch(
            mpatches.Rectangle(
                (-0.05, y - 0.05), cols + 0.1, rows_per_node + 0.1, fill=False, ls="--", color="0.4"
            )
        )
        ax.text(-0.15, y + rows_per_node / 2, f"node {node}", rotation=90, ha="right", va="center")
    handles = [
        mpatches.Patch(color=STAGE_COLOURS[s % 10], alpha=0.75, label=f"pp stage {s}")
        for s in range(dims.pp)
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_xlim(-0.6, cols + 0.1)
    bottom = -((nodes - 1) * (rows_per_node + 0.5) + rows_per_node - 1)  # the last row's floor
    ax.set_ylim(bottom - 0.15, 1.1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(
        title
        or f"{dims.world_size} GPUs: pp={dims.pp} x dp={dims.dp} x tp={dims.tp}"
        " (black bar = one TP group)"
    )
    fig.tight_layout()
    return fig


OVERHEADS = ("bubble", "tp", "pp", "dp", "optimizer")


def plot_layouts(layouts, cluster, top: int = 8, title: str = "", tie: float = 0.05):
    """Left: each layout's estimated step time, compute (grey) and what each overhead adds,
    from 0, with the band of layouts the model cannot tell from the fastest (``tie``);
    right: estimated memory per GPU against what the GPU can hold."""
    layouts = layouts[:top]
    names = [f"{lay.name}\nm={lay.micro_batches} x {lay.micro_batch}, {lay.recompute}"
             for lay in layouts]  # fmt: skip
    height = 0.55 * len(names) + 1.8
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, height), sharey=True,
                                     gridspec_kw={"width_ratios": [3, 2]})  # fmt: skip
    left = [lay.time["compute"] for lay in layouts]
    ax_t.barh(names, left, color="0.75", label="compute")
    colours = plt.get_cmap("Set2").colors
    for i, kind in enumerate(OVERHEADS):
        vals = [lay.time.get(kind, 0.0) for lay in layouts]
        if any(vals):
            ax_t.barh(names, vals, left=left, label=kind, color=colours[i])
            left = [a + b for a, b in zip(left, vals, strict=True)]
    if layouts:
        fastest = min(lay.step_time for lay in layouts)
        ax_t.axvspan(fastest, fastest * (1 + tie), color="k", alpha=0.12,
                     label=f"tie: within {tie:.0%} of the fastest")  # fmt: skip
        for y, lay in enumerate(layouts):
            over = 1 - lay.time["compute"] / lay.step_time
            ax_t.text(lay.step_time, y, f" {lay.step_time:.3g} s ({over:.0%} overhead)",
                      va="center", fontsize=8)  # fmt: skip
        ax_t.set_xlim(0, 1.3 * max(lay.step_time for lay in layouts))
    ax_t.invert_yaxis()
    ax_t.set_xlabel("estimated seconds per step (compute included)")
    handles, labels = ax_t.get_legend_handles_labels()
    ax_m.barh(names, [lay.memory_gb for lay in layouts], color="0.6")
    ax_m.axvline(cluster.usable_gb, color="r", ls="--",
                 label=f"usable: {cluster.usable_gb:.1f} of {cluster.gpu_memory_gb:.1f} GB "
                       f"({cluster.gpu_memory_gib:g} GiB)")  # fmt: skip
    ax_m.set_xlabel("estimated GB per GPU")
    more, words = ax_m.get_legend_handles_labels()
    fig.suptitle(title or "Planner: fastest layouts first (estimates, not measurements)")
    fig.legend(handles + more, labels + words, loc="upper center", ncol=4, fontsize=8,
               bbox_to_anchor=(0.5, 0.955), frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def plot_validation(rows, measured_on: str, title: str = ""):
    """Predicted against measured: step time (median and quartiles over rounds) and peak
    memory per rank, one point per layout, the diagonal where they would agree."""
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 5.2))
    colours = plt.get_cmap("tab10").colors
    for i, r in enumerate(rows):
        ms = 1e3 * r["measured_s"]
        ax_t.errorbar(1e3 * r["predicted_s"], ms, yerr=[[ms - 1e3 * r["q1"]],
                      [1e3 * r["q3"] - ms]], fmt="o", color=colours[i % 10], capsize=3,
                      label=r["name"])  # fmt: skip
        ax_m.plot(r["predicted_mb"], r["measured_mb"], "o", color=colours[i % 10])
    for ax, key_p, key_m, scale in ((ax_t, "predicted_s", "q3", 1e3),
                                    (ax_m, "predicted_mb", "measured_mb", 1)):  # fmt: skip
        top = 1.1 * max(max(scale * r[key_p], scale * r[key_m]) for r in rows)
        ax.plot([0, top], [0, top], color="0.5", ls="--", lw=1, label="predicted = measured")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_aspect("equal")
    ax_t.set_xlabel("predicted ms per step")
    ax_t.set_ylabel("measured ms per step (median, quartiles)")
    ax_m.set_xlabel("predicted MB per rank (fullest rank)")
    ax_m.set_ylabel("measured peak MB per rank (CPU allocator)")
    ax_t.legend(fontsize=7, loc="upper left")
    fig.suptitle(title or "The planner against 4 CPU ranks")
    fig.text(0.99, 0.01, f"measured on {measured_on}", ha="right", fontsize=8, color="0.4")
    fig.tight_layout()
    return fig
