"""Figures of notebook 09 (context parallelism): who computes which part of the causal
attention matrix, a ring's timeline (transfers beside compute), and memory per rank."""

from __future__ import annotations

from matplotlib.patches import Rectangle

from helpers.parallel.context.context_layout import sub_blocks
from helpers.viz.common import new_figure

RANK_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
                "tab:pink", "tab:olive"]  # fmt: skip
LAYOUT_COLOURS = ["0.35", "tab:purple", "tab:cyan"]  # bars of the work panel (not rank colours)


def _mask_grid(ax, positions, seq_len: int, title: str, tile: int) -> None:
    """The S x S causal matrix: each computed part coloured by the rank that computes it
    (pale: a tile across the diagonal, computed with a mask; blank: skipped)."""
    for r, q_pos in enumerate(positions):
        colour = RANK_COLOURS[r % len(RANK_COLOURS)]
        for k_pos in positions:
            for qs, ks, mask in sub_blocks(q_pos, k_pos, causal=True, tile=tile):
                q_run, k_run = q_pos[qs], k_pos[ks]
                box = Rectangle((int(k_run[0]), int(q_run[0])), len(k_run), len(q_run),
                                facecolor=colour, alpha=0.35 if mask is not None else 0.8,
                                edgecolor="k", linewidth=0.4)  # fmt: skip
                ax.add_patch(box)
    ax.plot([0, seq_len], [0, seq_len], color="k", lw=0.8, ls="--")
    ax.set_xlim(0, seq_len)
    ax.set_ylim(seq_len, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(title, fontsize=9)


def plot_causal_layouts(
    layouts: dict, seq_len: int, work: dict, work_seq: int, measured_on: str, tile: int = 4
):
    """Left: one mask grid per layout (diagonal blocks cut into tile x tile tiles). Right: per rank, the score entries it computes
    (counted) and the CPU seconds its compute took (measured).

    layouts: {name: positions per rank} drawn for seq_len tokens; work: {name: (pairs per rank,
    seconds per rank)} measured on a sequence of work_seq tokens.
    """
    n = len(layouts)
    fig, axes = new_figure("causal attention split over ranks (colour = rank; pale: masked tile; blank: skipped)",
                           measured_on, ncols=n + 1, width=4.2)  # fmt: skip
    for ax, (name, pos) in zip(axes, layouts.items(), strict=False):
        _mask_grid(ax, pos, seq_len, name, tile)
    ax = axes[-1]
    world = len(next(iter(layouts.values())))
    width = 0.8 / (2 * n)
    for i, (name, (pairs, seconds)) in enumerate(work.items()):
        xs = [r + (2 * i - n + 0.5) * width for r in range(world)]
        colour = LAYOUT_COLOURS[i % len(LAYOUT_COLOURS)]
        ax.bar(xs, [p / max(pairs) for p in pairs], width, color=colour, alpha=0.4,
               label=f"{name}: entries computed (counted)")  # fmt: skip
        ax.bar([x + width for x in xs], [s / max(seconds) for s in seconds], width,
               color=colour, label=f"{name}: compute CPU time (measured)")  # fmt: skip
    ax.set_xticks(range(world), [f"rank {r}" for r in range(world)])
    ax.set_ylabel("share of the busiest rank")
    ax.set_ylim(0, 1.5)
    ax.legend(fontsize=7, loc="upper center", ncol=1)
    ax.set_title(f"work per rank, S = {work_seq:,}", fontsize=9)
    fig.tight_layout()
    return fig


def plot_ring_timelines(
    timelines: dict,
    measured_on: str,
    title: str = "ring steps: compute (blue) and the next K/V block in flight (orange)",
):
    """One panel per variant: per rank, compute spans (blue) and transfers in flight
    (orange, from posting isend/irecv until the rank's wait for the block returned), in ms.

    timelines: {variant: [per rank: [(post, arrived, compute_start, compute_end), ...]]}.
    """
    fig, axes = new_figure(title, measured_on, ncols=len(timelines), width=6)
    end = 0.0
    for ax, (name, ranks) in zip(axes, timelines.items(), strict=True):
        t0 = min(ev[0] for rank in ranks for ev in rank if ev[0] is not None)
        for r, events in enumerate(ranks):
            for post, arrived, c0, c1 in events:
                if post is not None:
                    ax.barh(r + 0.2, (arrived - post) * 1e3, left=(post - t0) * 1e3, height=0.35,
                            color="tab:orange", edgecolor="k", linewidth=0.4)  # fmt: skip
                ax.barh(r - 0.2, (c1 - c0) * 1e3, left=(c0 - t0) * 1e3, height=0.35,
                        color="tab:blue", edgecolor="k", linewidth=0.4)  # fmt: skip
                end = max(end, (c1 - t0) * 1e3, (arrived - t0) * 1e3 if arrived else 0)
        ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in range(len(ranks))])
        ax.set_ylim(len(ranks) - 0.5, -0.5)
        ax.set_xlabel("time (ms)")
        ax.set_title(name, fontsize=9)
    for ax in axes:
        ax.set_xlim(0, end * 1.02)
    fig.tight_layout()
    return fig


def plot_memory(seq_lens, peaks: dict, world: int, measured_on: str):
    """Peak bytes per rank against sequence length, log-log, one line per method; dashed:
    the first method's values divided by N and by N^2 (what the score matrices predict)."""
    fig, (ax,) = new_figure(f"attention's peak memory per rank ({world} ranks)", measured_on,
                            width=6.5)  # fmt: skip
    for i, (name, values) in enumerate(peaks.items()):
        ax.loglog(seq_lens, [v / 2**20 for v in values], "o-", color=f"C{i}", label=name)
    first = next(iter(peaks.values()))
    for i, (div, what) in enumerate(((world, "N"), (world**2, "N²")), start=1):
        ax.loglog(seq_lens, [v / div / 2**20 for v in first], "--", color=f"C{i}", lw=1,
                  label=f"one process / {what}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length S (tokens)")
    ax.set_ylabel("peak MiB per rank (measured)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
