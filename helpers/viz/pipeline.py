"""Pipeline figures (05): Gantt charts of simulated and measured timelines, and an explorer.

A timeline is helpers.parallel.pipeline.schedules.Timeline: events (stage, kind, mb, start, end,
chunk). One row per stage, stage 0 on top, as in the seeds' tables: forwards blue,
backwards orange (zero-bubble: input-gradient B orange, weight-gradient W green), the
micro-batch number in each box, and white where a stage waits (the bubble).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from helpers.parallel.pipeline.schedules import SCHEDULES, simulate
from helpers.viz.common import new_figure

COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
CHUNK_SHADE = (1.0, 0.6, 0.8, 0.45)  # alpha of virtual stage 0, 1, 2, ... (interleaved)


def draw_timeline(ax, tl, unit: str = "", label_boxes: bool = True) -> None:
    """Draw a Timeline on ax: one row per stage, a box per op, its micro-batch inside."""
    t0 = min(e.start for e in tl.events)
    scale = 1e3 if unit == "ms" else 1.0
    for e in tl.events:
        x, w = (e.start - t0) * scale, (e.end - e.start) * scale
        alpha = CHUNK_SHADE[e.chunk % len(CHUNK_SHADE)]
        ax.barh(e.stage, w, left=x, height=0.8, color=COLOURS[e.kind], alpha=alpha,
                edgecolor="black", linewidth=0.5)  # fmt: skip
        if label_boxes and w > 0:
            mb = "all" if tl.name == "naive" else str(e.mb)
            ax.text(x + w / 2, e.stage, mb + "'" * e.chunk, ha="center", va="center",
                    fontsize=7, clip_on=True)  # fmt: skip
    ax.set_yticks(range(tl.p), [f"stage {s}" for s in range(tl.p)])
    ax.set_ylim(tl.p - 0.5, -0.5)  # stage 0 on top
    ax.set_xlim(0, tl.makespan * scale)
    ax.set_xlabel(f"time ({unit})" if unit else "time (units of tf)")
    kinds = sorted({e.kind for e in tl.events}, key="FBW".index)
    names = {"F": "forward", "B": "backward" if "W" not in kinds else "input grad B",
             "W": "weight grad W"}  # fmt: skip
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in kinds]
    ax.legend(handles, [names[k] for k in kinds], loc="upper right", fontsize=7,
              bbox_to_anchor=(1.0, -0.18), ncol=len(kinds), frameon=False)  # fmt: skip


def _summary(tl, speedup: bool = True) -> str:
    peak = ", ".join(f"{a:g}" for a in tl.peak_activations) if tl.peak_activations else "-"
    gain = f", speedup {tl.speedup:.2f}x" if speedup else ""
    return f"bubble {tl.bubble:.1%}{gain}, peak act. [{peak}]"


def plot_timeline(tl, title: str | None = None, unit: str = "", measured_on: str | None = None):
    """A Gantt chart of one timeline; the title says bubble, speedup, peak activations."""
    fig, axes = new_figure(title or f"{tl.name}: p={tl.p}, m={tl.m}", measured_on, width=10)
    draw_timeline(axes[0], tl, unit)
    axes[0].set_title(_summary(tl), fontsize=9)
    fig.set_figheight(1.2 + 0.55 * tl.p)
    fig.tight_layout()
    return fig


def plot_measured_vs_simulated(pairs, measured_on: str):
    """Rows of (measured Timeline, simulated Timeline), drawn on the same time axis in ms."""
    fig, axes = plt.subplots(len(pairs), 2, figsize=(13, 1.6 + 1.3 * len(pairs) * pairs[0][0].p / 2),
                             squeeze=False)  # fmt: skip
    for row, (meas, sim) in zip(axes, pairs, strict=True):
        end = max(meas.makespan, sim.makespan) * 1e3
        for ax, tl, what in ((row[0], meas, "measured"), (row[1], sim, "simulated")):
            draw_timeline(ax, tl, "ms", label_boxes=tl.m <= 16)
            ax.set_xlim(0, end)
            # no speedup here: its "one device" would run at the speed of these ranks, which
            # share cores (4 ranks on 2 cores would claim more than 2x)
            ax.set_title(f"{tl.name.split()[0]} {what}: {_summary(tl, speedup=False)}", fontsize=8)
    fig.suptitle("measured timeline (left) and the simulation fed with its stage times (right)")
    fig.text(0.99, 0.005, f"measured on {measured_on}", ha="right", va="bottom", fontsize=7,
             color="gray")  # fmt: skip
    fig.tight_layout()
    return fig


def stage_times(p: int, tf: float, tb: float, slow: int, slowdown: float):
    """Per-stage forward and backward times: every stage tf, tb, stage ``slow`` ``slowdown``
    times as long (a stage past the last one, or slowdown 1, leaves all stages equal)."""
    factor = [slowdown if s == slow else 1.0 for s in range(p)]
    return [tf * f for f in factor], [tb * f for f in factor]


def explorer(schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2):
    """An ipywidgets explorer: pick a schedule and its numbers, see the chart and the figures.

    "slow stage" and "its slowdown" make one stage's forward and backward longer.

    Returns the widget (display it as the cell's last line). Without a browser (papermill)
    the first chart is still drawn into the output, so the cell runs headless.
    """
    import ipywidgets as W
    from IPython.display import display

    sl = {"continuous_update": False, "style": {"description_width": "initial"}}
    controls = {
        "schedule": W.Dropdown(options=SCHEDULES, value=schedule, description="schedule"),
        "p": W.IntSlider(value=p, min=1, max=8, description="stages p", **sl),
        "m": W.IntSlider(value=m, min=1, max=32, description="micro-batches m", **sl),
        "v": W.IntSlider(value=v, min=1, max=4, description="virtual stages v", **sl),
        "tf": W.FloatSlider(value=1.0, min=0.1, max=4, step=0.1, description="tf", **sl),
        "tb": W.FloatSlider(value=2.0, min=0.1, max=8, step=0.1, description="tb", **sl),
        "latency": W.FloatSlider(value=0.0, min=0, max=2, step=0.05, description="latency", **sl),
        "slow": W.IntSlider(value=0, min=0, max=7, description="slow stage", **sl),
        "slowdown": W.FloatSlider(
            value=1.0, min=1, max=4, step=0.25, description="its slowdown", **sl
        ),
    }
    out = W.Output()

    def redraw(_=None):
        vals = {k: c.value for k, c in controls.items()}
        out.clear_output(wait=True)
        with out:
            try:
                tf, tb = stage_times(
                    vals["p"], vals["tf"], vals["tb"], vals["slow"], vals["slowdown"]
                )
                tl = simulate(vals["schedule"], vals["p"], vals["m"], tf, tb, vals["latency"],
                              v=vals["v"])  # fmt: skip
            except ValueError as e:
                print(f"cannot simulate: {e}")
                return
            fig = plot_timeline(tl)
            display(fig)
            plt.close(fig)
            print(f"bubble fraction {tl.bubble:.3f} (idle / p x makespan), bubble overhead "
                  f"{tl.overhead:.3f} (idle / busy), speedup over one device {tl.speedup:.2f}x\n"
                  f"per stage: tf {tf}, tb {tb}; peak in-flight activations {tl.peak_activations}")  # fmt: skip

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    rows = list(controls.values())
    box = W.VBox([W.HBox(rows[:4]), W.HBox(rows[4:7]), W.HBox(rows[7:]), out])
    return box
