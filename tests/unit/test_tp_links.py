"""The links notebooks 06 and 09 time TP and the ring over (helpers.course.bench.tp.LINKS) are
the sites' own: an 8-GPU NVSwitch figure only for Jean Zay's 8-GPU A100 nodes, labelled with the
nccl-tests issue that published it (measured on NVIDIA's system, not at the site: issue 40 n3),
the line rate (labelled so) for the 4-GPU direct meshes that have no published all-reduce
figure, and every figure the one of notebook 02's table (issue 40, m6)."""

from __future__ import annotations

import re

from helpers.course.bench.tp import LINKS
from helpers.parallel.collectives import published_comm as pub


def test_every_gpu_link_is_labelled_with_its_source_or_line_rate_from_notebook_02s_table():
    rows = {r["link"]: r for r in pub.LINKS}
    gpu_links = [label for label in LINKS if not label.startswith("network")]
    assert len(gpu_links) == 4
    for label in gpu_links:
        kind = label.rsplit(", ", 1)[1]
        assert kind == "line rate" or re.fullmatch(r"nccl-tests#\d+", kind), label
        published = [
            r for r in rows.values() if LINKS[label] / 1e9 in (r["busbw_GBps"], r["spec_GBps"])
        ]
        assert published, f"{label}: {LINKS[label] / 1e9} GB/s is in no row of notebook 02's table"
        if kind == "line rate":  # only where nothing was measured
            assert any(
                r["busbw_GBps"] is None and r["spec_GBps"] * 1e9 == LINKS[label] for r in published
            ), label
        else:  # the issue that measured it, from the row's own source
            assert any(
                kind in r["measured"] and r["busbw_GBps"] * 1e9 == LINKS[label] for r in published
            )


def test_four_gpu_sites_get_their_mesh_and_only_jean_zay_a100_an_nvswitch_figure():
    by_site = {label.split("(")[1].split(")")[0]: label for label in LINKS if "(" in label}
    assert set(by_site) == {"Jean Zay A100", "Perlmutter", "Jean Zay H100", "Engaging L40S"}
    for site in ("Perlmutter", "Jean Zay H100"):
        assert (
            "mesh" in by_site[site]
            and "NVSwitch" not in by_site[site]
            and by_site[site].endswith("line rate")
        )
    assert "NVSwitch" in by_site["Jean Zay A100"] and by_site["Jean Zay A100"].endswith("#175")
    assert all(bw < 480e9 for bw in LINKS.values()), (
        "an NVLink SHARP (8-GPU NVSwitch) figure crept in"
    )
