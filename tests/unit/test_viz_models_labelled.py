"""Computed panels say they are models; published data never claims to be measured here."""

import matplotlib

matplotlib.use("Agg")

from helpers import viz  # noqa: E402
from helpers.parallel.collectives.costmodel import AlphaBeta  # noqa: E402


def _texts(fig) -> str:
    parts = [t.get_text() for t in fig.texts]
    parts += [ax.get_title() for ax in fig.axes]
    return " | ".join(parts)


ROWS = [
    dict(algo=a, bytes=b, world=w, seconds=1e-3 * w * (1 + b / 1e6), lo=5e-4, hi=2e-2)
    for a in ("ring", "ps", "builtin")
    for b in (4096, 1 << 20)
    for w in (2, 4)
]


def test_ps_vs_ring_labels_the_counted_panel_as_a_model():
    text = _texts(viz.plot_ps_vs_ring(1 << 20, ROWS, "test machine"))
    assert "MODEL" in text and "MEASURED" in text
    assert "left panel is counted" in text


def test_prediction_and_bus_bandwidth_mark_model_lines():
    ab = AlphaBeta(alpha=5e-5, beta=4e-10)
    pp = [dict(bytes=b, seconds=ab.alpha + b * ab.beta, lo=0, hi=1e-2) for b in (4096, 1 << 20)]
    assert "computed, not measured" in _texts(viz.plot_prediction(pp, ab, ROWS, "test machine"))
    bus = viz.plot_bus_bandwidth(ROWS, ab, "test machine")
    assert any("(model)" in t.get_text() for ax in bus.axes for t in ax.texts)


def test_megatron_plot_is_published_data_not_a_local_measurement():
    table = [dict(gpus=g, params_b=p, tflops_per_gpu=t, peak_pct=44, pflops=g * t / 1000)
             for g, p, t in ((32, 1.7, 137), (3072, 1008.0, 163))]  # fmt: skip
    text = _texts(viz.plot_megatron_weak_scaling(table))
    assert "published data" in text and "Narayanan" in text
    assert "measured on" not in text


def test_published_ddp_scaling_names_its_sources_and_is_not_measured_here():
    eff = {"ResNet-50, PyTorch DDP benchmark": {1: 1.0, 16: 0.93}, "Goyal": {8: 1.0, 352: 0.89}}
    text = _texts(viz.plot_published_ddp_scaling(eff))
    assert "published data" in text and "Goyal et al. 2017" in text and "#17159" in text
    assert "measured on" not in text
