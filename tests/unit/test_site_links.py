"""Notebook 02's link table matches the sites' nodes, and the nccl-tests job fills its gaps.

Issue 33: the table set a PCIe 5.0 measurement (28 GB/s) against a PCIe 4.0 peak (31 GB/s), which
is where "a ring reaches 70-95 % of the link" came from, and quoted 8-GPU NVSwitch figures for
sites whose nodes hold 4 GPUs joined directly (Perlmutter's A100s, Jean Zay's H100s).
"""

from __future__ import annotations

import pytest

from helpers.cluster import nccl_tests
from helpers.cluster.profiles import load_profile
from helpers.parallel.collectives import published_comm as pub

# The sites' 4-GPU nodes, as the table names them, and the profile values that select them.
FOUR_GPU_NODES = {"Perlmutter": ("perlmutter", {"account": "x"}),
                  "Jean Zay H100": ("jean-zay", {"project": "x", "arch": "h100"}),
                  "Engaging H200": ("engaging", {"env": "x", "gpu_type": "h200"})}  # fmt: skip


def test_four_gpu_sites_get_no_eight_gpu_figures():
    for label, (profile, values) in FOUR_GPU_NODES.items():
        prof = load_profile(profile)
        assert prof.node_facts(prof.values(values))[0] == 4, f"{profile}: not a 4-GPU node?"
        for row in pub.LINKS:
            if "on 8" in row["measured"]:
                assert label not in row["sites"], f"{label} quoted with {row['measured']!r}"
        assert any(label in r["sites"] and "direct mesh" in r["link"] for r in pub.LINKS), label


def test_each_share_is_of_the_link_it_was_measured_on():
    shares = pub.link_shares()
    assert "PCIe 4.0 x16" not in shares, "no PCIe 4.0 measurement was published"
    assert shares["PCIe 5.0 x16"] == pytest.approx(28 / 63)
    fast = [s for link, s in shares.items() if "NVSwitch" in link or "InfiniBand" in link]
    assert 0.75 < min(fast) and max(fast) < 1
    for row in pub.LINKS:
        gen = row["link"].split(" x16")[0]
        if row["link"].startswith("PCIe") and row["busbw_GBps"]:
            assert gen in row["measured"], f"{row['link']}: measured on another PCIe generation?"


@pytest.mark.parametrize("profile", ["perlmutter", "jean-zay", "engaging"])
def test_the_nccl_tests_job_runs_one_process_per_gpu_with_ring_and_tree(profile):
    prof = load_profile(profile)
    values = {k: "x" for k, spec in prof.fields.items() if not {"default", "auto"} & set(spec)}
    gpus = prof.node_facts(prof.values(values))[0]
    text = nccl_tests.script(profile, nodes=2, values=values)
    assert "#SBATCH --nodes=2" in text and f"--ntasks-per-node={gpus}" in text
    assert "--ntasks-per-node=1 " not in text and "helpers.compat" not in text
    assert "for algo in Ring Tree" in text and "NCCL_ALGO=$algo srun" in text
    assert text.count('"$TESTS/all_reduce_perf"') == 2 and "-b 8 -e 8G" in text
