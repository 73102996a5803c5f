"""make gpu-check: without a GPU it says where to run it; on a stand-in GPU its whole plan runs.

No GPU is lent to CI: the check runs on 2 CPU ranks posing as GPUs (``--standin``), which
proves the check itself: a job whose layout needs more ranks than the node has is "needs N
GPUs", not a failure; a program past its limit is killed with everything it started, and the
next one still runs; the record is on disk after every program. The figures a stand-in run
records are not GPU figures and say so. ``show`` reads the committed H100 record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers.course import gpucheck
from helpers.course.gpucheck import report as gc_report

ROOT = Path(__file__).resolve().parents[2]
TRAIN = """
import sys
import torch
from helpers import dist
d = dist.init()
m = torch.nn.Linear(4, 4).to(d.device)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    m(torch.ones(2, 4, device=d.device)).sum().backward()
    opt.step()
"""
LAYOUT = """
from helpers import dist
from helpers.parallel.composed.mesh import ParallelDims
d = dist.init()
ParallelDims(dp=-1, tp=4, world_size=d.world_size)  # tp=4: a layout for 4 GPUs
"""
STUCK = """
import subprocess, sys, threading
from helpers import dist
d = dist.init()
child = subprocess.Popen(["sleep", "300"])  # a process of its own, like a compiler
open(sys.argv[1] + f".{d.rank}", "w").write(str(child.pid))
print("waiting for a peer that never comes", flush=True)
threading.Event().wait(300)
"""


def _job(runs: Path, name: str, source: str, args: list[str], gpus: int, time: str = "00:10:00"):
    folder = runs / name / "1"
    folder.mkdir(parents=True)
    (folder / "program.py").write_text(textwrap.dedent(source))
    spec = {"name": name, "program": "program.py", "args": args, "nodes": 1,
            "gpus_per_node": gpus, "time": time, "files": [], "written_by": "the test"}  # fmt: skip
    (folder / "job.json").write_text(json.dumps(spec))


def test_without_a_gpu_it_exits_2_and_says_where_to_run_it(tmp_path):
    out = subprocess.run([sys.executable, "-m", "helpers.course.gpucheck", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no NVIDIA GPU is visible" in out.stdout and "docs/instructors.md" in out.stdout


def test_layouts_too_big_need_gpus_a_stuck_program_is_killed_and_each_row_is_written(
    tmp_path, monkeypatch
):
    runs, pids = tmp_path / "runs", tmp_path / "stuck-pid"
    _job(runs, "b-tp4", LAYOUT, [], gpus=4)  # the node (2 stand-in GPUs) has too few
    _job(runs, "c-declared", TRAIN, ["1"], gpus=8)
    spec = json.loads((runs / "c-declared/1/job.json").read_text())
    (runs / "c-declared/1/job.json").write_text(json.dumps({**spec, "min_gpus": 8}))
    _job(runs, "d-stuck", STUCK, [str(pids)], gpus=2, time="00:00:15")  # its own limit: 15 s
    _job(runs, "e-after", TRAIN, ["3"], gpus=2)
    on_disk, write = [], gc_report.write

    def spy(report, path, final=False):  # what a reader finds on disk after each program
        code = write(report, path, final)
        on_disk.append([j["job"] for j in json.loads(path.read_text())["jobs"]])
        return code

    monkeypatch.setattr(gc_report, "write", spy)
    start = time.monotonic()
    code = gpucheck.main(["--standin", "--skip-measurements", "--jobs", str(runs),
                          "--out", str(tmp_path / "out")])  # fmt: skip
    took = time.monotonic() - start
    rec = json.loads((tmp_path / "out" / "standin-test.json").read_text())
    jobs = {j["job"]: j for j in rec["jobs"]}
    assert on_disk[:4] == [["b-tp4"], ["b-tp4", "c-declared"], ["b-tp4", "c-declared", "d-stuck"],
                           ["b-tp4", "c-declared", "d-stuck", "e-after"]]  # fmt: skip
    assert jobs["e-after"]["verdict"] == "ok"  # the program after the stuck one ran
    assert jobs["b-tp4"]["verdict"] == "needs 4 GPUs", jobs["b-tp4"]
    assert "does not divide world_size=2" in jobs["b-tp4"]["error"]
    assert jobs["b-tp4"]["where"].startswith("program.py:5: ParallelDims(")
    assert jobs["c-declared"]["verdict"] == "needs 8 GPUs"  # declared: not even started
    stuck = jobs["d-stuck"]
    assert stuck["verdict"] == "timed out" and stuck["wall"] < 15 + 5, stuck
    assert stuck["error"].startswith("timed out after 15 s, last reached: the process group")
    assert "waiting for a peer that never comes" in stuck["error"]
    for pid_file in tmp_path.glob("stuck-pid.*"):  # what the stuck ranks started died with them
        assert not Path(f"/proc/{pid_file.read_text()}").exists()
    assert code == 1  # the time-out counts as a failure; the two that need GPUs do not
    phases = jobs["e-after"]["phases"]
    assert {"start_up", "process_group", "to_first_forward", "first_step"} <= set(phases)
    table = (tmp_path / "out" / "standin-test.md").read_text()
    assert "| b-tp4 | job | needs 4 GPUs | 2 of 4 |" in table
    print(f"4 jobs checked in {took:.1f} s")


def test_the_plan_names_what_the_node_lacks_and_how_to_carry_it(tmp_path):
    from helpers.course.gpucheck.plan import plan

    runs = tmp_path / "runs"
    _job(runs, "ds", "import deepspeed\n", [], gpus=1)
    no_ds = lambda name: None if name in ("deepspeed", "papermill") else object()  # noqa: E731
    items = {i.name: i for i in plan(runs, 1, {"job": 60, "deepspeed": 300, "notebook": 900},
                                     find=no_ds)}  # fmt: skip
    assert items["ds"].skip == "needs deepspeed" and items["notebook 01"].skip == "needs papermill"
    assert items["all-reduce"].skip.startswith("needs 2 GPUs")
    lines = gpucheck.needs.carry_lines(["papermill", "deepspeed"], ROOT)
    assert any(x.startswith("python -m pip download") and "papermill==2.7.0" in x for x in lines)
    assert any("pip wheel --no-deps" in x and "deepspeed==0.19.8" in x for x in lines)
    assert not any(" torch" in x.split("#")[0] for x in lines)  # the site's torch stays
    # The check itself imports none of what a site's PyTorch module lacks: --plan with them gone.
    blocked = {
        "papermill",
        "ipykernel",
        "deepspeed",
        "nbformat",
        "nbclient",
        "jinja2",
        "matplotlib",
    }
    script = textwrap.dedent(f"""
        import importlib.util, runpy, sys
        BLOCKED = {blocked!r}
        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Blocker())
        find = importlib.util.find_spec
        importlib.util.find_spec = lambda n, *a: None if n in BLOCKED else find(n, *a)
        sys.argv = ["gpucheck", "--plan", "--gpus", "1", "--jobs", {str(runs)!r}]
        runpy.run_module("helpers.course.gpucheck", run_name="__main__")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "needs papermill, ipykernel" in out.stdout and "needs deepspeed" in out.stdout
    assert "python -m pip download" in out.stdout and "deepspeed==0.19.8" in out.stdout


def test_a_job_declares_the_fewest_gpus_its_layout_runs_on(tmp_path, monkeypatch):
    from helpers.cluster.job import Job

    monkeypatch.setenv("WORKBOOK_RUNS", str(tmp_path / "runs"))
    (tmp_path / "p.py").write_text("print(1)\n")
    plain = Job("plain", tmp_path / "p.py", gpus_per_node=4)
    tp2 = Job("tp2", tmp_path / "p.py", gpus_per_node=4, min_gpus=2)
    assert "min_gpus" not in plain.manifest() and tp2.manifest()["min_gpus"] == 2
    assert plain.key == Job("plain", tmp_path / "p.py", gpus_per_node=4, min_gpus=2).key


def test_deepspeeds_requirements_are_the_ones_carried():
    """The list carried for DeepSpeed is its own metadata's, less torch (the site's)."""
    import importlib.metadata
    import re

    required = {re.split(r"[ ;<>=!~]", r)[0].lower() for r in
                importlib.metadata.requires("deepspeed") if "extra ==" not in r}  # fmt: skip
    carried = {re.split(r"[<>=]", r)[0] for r in gpucheck.needs.DEEPSPEED_DEPS}
    assert carried == required - {"torch"}


def test_the_h100_records_failures_at_start_read_as_needs_2_gpus():
    """4 of the H100's 22 programs failed at start on one GPU with their layout's error: each
    is 'needs 2 GPUs' now; the crashes (lab 2's missing API, lab 7's OOM, TP's foreach) stay."""
    rec = json.loads((ROOT / "notebooks/data/gpu/h100-2026-11-27.json").read_text())
    bad = [j for j in rec["jobs"] if j.get("ok") is False]
    got = {j["job"]: gpucheck.needs.needs_gpus(j, ran_on=1, wants=8) for j in bad}
    assert got == {"07_fsdp_tp-job": 2, "fsdp-tp-llama2": 2, "lab5_bench": 2,
                   "pipeline-deepspeed": 2, "lab2_bench": None, "lab7_bench": None,
                   "tp-decoder-1n": None}  # fmt: skip


def test_show_prints_the_committed_h100_record_labelled():
    where = "measured on 1 x NVIDIA H100 80GB HBM3 (2026-11-27, torch 2.11.0+cu130, CUDA 13.0)"
    cnn = gpucheck.show("cnn")
    assert cnn.startswith(where + ": ") and "fp32 8,127 samples/s, bf16 6,636" in cnn
    assert "bf16 at 0.82x" in cnn
    llama = gpucheck.show("llama")
    assert "68,677 tokens/s, MFU 42.0 % of 989 TFLOP/s" in llama and llama.startswith(where)
    allreduce = gpucheck.show("allreduce")
    assert "one GPU, so no all-reduce was measured" in allreduce and "make gpu-check" in allreduce
    assert round(gpucheck.figure("cnn bf16", "samples_per_s")) == 6636
    assert gpucheck.figure("notebook 01", "test_accuracy") is None  # it stopped before its end
    assert gpucheck.label() == where


def test_the_whole_plan_runs_on_a_stand_in_gpu_and_records_its_figures(tmp_path):
    before = dict(os.environ)
    code = gpucheck.main(["--standin", "--jobs", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert code == 0
    assert dict(os.environ) == before  # the stand-in data switch does not leak to the caller
    report = json.loads((tmp_path / "standin-test.json").read_text())
    assert "not GPU figures" in report["hardware"]["gpu"]
    m = report["measurements"]
    assert set(m) == {"cnn fp32", "cnn bf16", "all-reduce", "llama mfu"}
    assert all(r["ok"] for r in m.values()), {k: r.get("error") for k, r in m.items()}
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
    assert "all_reduce bus bandwidth on 2 GPUs" in gpucheck.show("allreduce", root=tmp_path)
