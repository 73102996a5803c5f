"""Drawings of a 3D layout and of the planner's ranking.

plot_rank_grid(dims): one box per node, one square per GPU, coloured by pipeline stage,
labelled with its rank and (dp, tp) coordinates; TP pairs share a bracket (inside a node).
plot_layouts(layouts): the planner's estimated step time (bars split by kind) and memory.
"""

from __future__ import annotations

import matplotlib.patches as mpatches
import matplotlib.pyplot as plt

__all__ = ["plot_rank_grid", "plot_layouts"]

STAGE_COLOURS = plt.get_cmap("tab10").colors


def plot_rank_grid(dims, title: str | None = None):
    """Seed 000's picture for any ParallelDims (needs gpus_per_node)."""
    per_node = dims.gpus_per_node or dims.world_size
    nodes = dims.world_size // per_node
    cols = min(per_node, 8)
    rows_per_node = -(-per_node // cols)
    fig, ax = plt.subplots(figsize=(1.0 * cols + 1.5, 1.25 * nodes * rows_per_node + 1.0))
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
    ax.set_ylim(-(nodes * (rows_per_node + 0.5)) + 0.3, 1.1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(
        title
        or f"{dims.world_size} GPUs: pp={dims.pp} x dp={dims.dp} x tp={dims.tp}"
        " (black bar = one TP group)"
    )
    fig.tight_layout()
    return fig


def plot_layouts(layouts, gpu_memory_gb: float, top: int = 8, title: str = ""):
    """Left: estimated overheads on top of the compute (stacked); right: memory per GPU."""
    layouts = layouts[:top]
    names = [f"pp{lay.pp} dp{lay.dp} tp{lay.tp}" for lay in layouts]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 0.45 * len(names) + 1.6), sharey=True)
    left = [0.0] * len(layouts)
    for i, kind in enumerate(("bubble", "tp", "pp", "dp")):
        vals = [lay.time.get(kind, 0.0) for lay in layouts]
        ax_t.barh(names, vals, left=left, label=kind, color=plt.get_cmap("Set2").colors[i])
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax_t.invert_yaxis()
    compute = layouts[0].time["compute"] if layouts else 0.0
    ax_t.set_xlabel(f"estimated seconds per step on top of {compute:.1f} s of compute")
    ax_t.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.25), ncol=4)
    ax_m.barh(names, [lay.memory_gb for lay in layouts], color="0.6")
    ax_m.axvline(gpu_memory_gb, color="r", ls="--", label=f"GPU: {gpu_memory_gb:g} GB")
    ax_m.set_xlabel("estimated GB per GPU")
    ax_m.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.25))
    fig.suptitle(title or "Planner: fastest layouts first (estimates, not measurements)")
    fig.tight_layout()
    return fig
