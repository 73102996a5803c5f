"""make gpu-check: without a GPU it says where to run it; on a stand-in GPU its whole plan runs.

No GPU is lent to CI: the plan (every measurement program on all "GPUs", the figures the
notebooks show) runs on 2 CPU ranks posing as GPUs, which proves the check itself; the
figures it records there are not GPU figures and say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.course import gpucheck


def test_without_a_gpu_it_exits_2_and_says_where_to_run_it(tmp_path):
    out = subprocess.run([sys.executable, "-m", "helpers.course.gpucheck", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no NVIDIA GPU is visible" in out.stdout and "docs/instructors.md" in out.stdout


def test_the_whole_plan_runs_on_a_stand_in_gpu_and_records_its_figures(tmp_path):
    before = dict(os.environ)
    code = gpucheck.main(["--standin", "--jobs", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert code == 0
    assert dict(os.environ) == before  # the stand-in data switch does not leak to the caller
    report = json.loads((tmp_path / "standin-test.json").read_text())
    assert "not GPU figures" in report["hardware"]["gpu"]
    m = report["measurements"]
    assert set(m) == {"cnn fp32", "cnn bf16", "all-reduce", "llama mfu"}
    assert all(r["ok"] for r in m.values()), {k: r["error"] for k, r in m.items()}
    assert m["llama mfu"]["metrics"]["dtype"] == "bfloat16"  # the stand-in H100: bf16 compute
    assert "H100-SXM5-80GB dense bf16" in m["llama mfu"]["metrics"]["peak_source"]
    rows = m["all-reduce"]["metrics"]["rows"]
    assert {r["algo"] for r in rows} == {"builtin", "ring"} and all(
        r["busbw_GBps"] > 0 for r in rows
    )
    folder = tmp_path / "notebooks" / "data" / "gpu"
    folder.mkdir(parents=True)
    (folder / "h100.json").write_text(json.dumps(report))
    assert "tokens/s, MFU" in gpucheck.show("llama", root=tmp_path)
    assert "all_reduce bus bandwidth" in gpucheck.show("allreduce", root=tmp_path)
