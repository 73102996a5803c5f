"""``make gpu-check``: the workbook's GPU world, run on real GPUs, with its figures recorded.

    python -m helpers.course.gpucheck [--jobs build/dryrun/runs] [--out build/gpu-check]

For an instructor, on one GPU node of the site, before a workshop (docs/instructors.md shows
the one-node job). With NCCL on every visible GPU it runs:

1. every job program the notebooks write (the directories ``make dryrun`` leaves in
   build/dryrun/runs), at the job's own arguments, stopped after 20 optimizer steps;
2. notebook 01 on CUDA (full mode, executed into the output folder);
3. the figures notebooks 01, 02 and 07 show beside their CPU ones: the CNN's samples/s in
   fp32 and bf16, all-reduce bus bandwidth by message size, Llama 2 tokens/s and MFU.

Everything lands in ``<out>/<gpu>.json`` (and .md), labelled with the GPU, its count, the
driver, CUDA and torch versions. Commit the json as ``notebooks/data/gpu/<gpu>.json`` and the
notebooks show it. Without a GPU it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from helpers.course.dryrun.check import find_jobs
from helpers.course.dryrun.runner import run_ranks
from helpers.runs import workbook_root

__all__ = ["main", "hardware", "recorded", "MEASUREMENTS"]

STEPS = 20
TOP = workbook_root(Path(__file__).parent) or Path.cwd()
PROGRAMS = TOP / "helpers" / "programs"
# (name, program, arguments, world: "all" GPUs or 1); each writes its figures with write_metrics
MEASUREMENTS = [
    ("cnn fp32", PROGRAMS / "train_cnn.py", ["--epochs", "1", "--amp", "none", "--offline", "true"], 1),
    ("cnn bf16", PROGRAMS / "train_cnn.py", ["--epochs", "1", "--amp", "bf16", "--offline", "true"], 1),
    ("all-reduce", PROGRAMS / "busbw.py", [], "all"),
    ("llama mfu", PROGRAMS / "train_llama.py",
     ["--model", "7B", "--n-layers", "4", "--tp", "1", "--seq-len", "2048", "--batch-size", "8",
      "--steps", "8"], "all"),
]  # fmt: skip


def hardware() -> dict:
    """What the figures were measured on."""
    n = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0) if n else "no GPU"
    return {"gpu": name, "gpus": n, "torch": torch.__version__, "cuda": torch.version.cuda,
            "driver": _driver(), "host": platform.node(), "date": time.strftime("%Y-%m-%d")}  # fmt: skip


def _driver() -> str:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "?"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def _run(program: Path, args: list[str], world: int, mode: str = "gpu", steps: int = STEPS) -> dict:
    results = run_ranks(program, args, mode, world, gpus_per_node=world, timeout=1800,
                        max_steps=steps, small=mode == "strict")  # fmt: skip
    first = results[0]
    return {"ok": all(r["ok"] for r in results), "reached": first.get("reached"),
            "seconds": first.get("seconds"), "error": next((r.get("error") for r in results
                                                           if not r["ok"]), None),
            "metrics": first.get("metrics"), "peak_gib": (first.get("peak_bytes") or {}).get("gpu", 0) / 2**30}  # fmt: skip


def _notebook_01(out: Path) -> dict:
    from helpers.course import book

    res = book.execute(Path("notebooks/01_single_gpu_cnn.ipynb"), out / "01_single_gpu_cnn.ipynb",
                       root=TOP, kernel_name="python3")  # fmt: skip
    return {
        "ok": res.ok,
        "seconds": res.seconds,
        "output": str(res.output),
        "error": res.error[-2000:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.course.gpucheck", description=__doc__)
    ap.add_argument("--jobs", type=Path, default=TOP / "build" / "dryrun" / "runs")
    ap.add_argument("--out", type=Path, default=TOP / "build" / "gpu-check")
    ap.add_argument("--skip-notebook", action="store_true", help="leave notebook 01 out")
    ap.add_argument(
        "--standin",
        action="store_true",
        help="test the check itself on 2 CPU ranks posing as GPUs (no GPU figures)",
    )
    args = ap.parse_args(argv)
    hw = hardware()
    if args.standin:
        hw.update(gpu="stand-in h100 (2 CPU ranks: not GPU figures)", gpus=2)
    if not hw["gpus"]:
        print("gpu-check: no NVIDIA GPU is visible here (torch.cuda.device_count() == 0). Run it "
              "on a GPU node of your site: see docs/instructors.md, 'Check the GPU world'.")  # fmt: skip
        return 2
    import os
    from unittest import mock

    # Compute nodes have no internet: the jobs' data falls back to its stand-in, for this
    # check only (the caller's environment is left as it was).
    with mock.patch.dict(os.environ, {"WORKBOOK_ALLOW_STANDIN_DATA": "1"}):
        report = _check(args, hw)
    return _write(report, args.out, "standin-test" if args.standin else None)


def _check(args, hw: dict) -> dict:
    mode = "strict" if args.standin else "gpu"
    n, report = hw["gpus"], {"hardware": hw, "jobs": [], "measurements": {}}
    for job in find_jobs(args.jobs) if args.jobs.is_dir() else []:
        row = _run(job.program, [str(a) for a in job.spec["args"]], n, mode)
        report["jobs"].append({"job": job.spec["name"], "written_by": job.spec.get("written_by"),
                               "ranks": n, **row})  # fmt: skip
    for name, program, prog_args, world in MEASUREMENTS:
        if world == "all" and n == 1 and name == "all-reduce":
            continue  # one GPU: nothing to all-reduce with
        world = n if world == "all" else 1  # measurements run to their end: no step limit
        report["measurements"][name] = _run(program, prog_args, world, mode, steps=10**9)
    if not args.skip_notebook and not args.standin:
        report["notebook_01"] = _notebook_01(args.out)
    return report


def _write(report: dict, out: Path, key: str | None = None) -> int:
    from helpers import gpus

    out.mkdir(parents=True, exist_ok=True)
    try:
        gpu = gpus.lookup(report["hardware"]["gpu"])
        key = key or next(k for k, g in gpus.GPUS.items() if g is gpu)
    except KeyError:
        key = key or "unknown-gpu"
    path = out / f"{key}.json"
    path.write_text(json.dumps(report, indent=1))
    bad = [j["job"] for j in report["jobs"] if not j["ok"]]
    bad += [m for m, r in report["measurements"].items() if not r["ok"]]
    print(
        f"gpu-check on {report['hardware']['gpus']} x {report['hardware']['gpu']}: "
        f"{len(report['jobs'])} job(s), {len(report['measurements'])} measurement(s); "
        f"failed: {bad or 'none'}; results in {path}"
    )
    return 1 if bad else 0


def recorded(root: Path | None = None) -> list[dict]:
    """Figures recorded on GPUs (notebooks/data/gpu/*.json), for the notebooks to show."""
    folder = (root or TOP) / "notebooks" / "data" / "gpu"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


if __name__ == "__main__":
    sys.exit(main())


def show(kind: str, root: Path | None = None) -> str:
    """The recorded GPU figures of one kind ("cnn", "allreduce", "llama"), as text lines."""
    found = recorded(root)
    if not found:
        return ("No GPU figures recorded yet (notebooks/data/gpu/ is empty): an instructor "
                "records them with `make gpu-check` on a GPU node (docs/instructors.md).")  # fmt: skip
    return "\n".join(_line(kind, r) for r in found)


def _line(kind: str, report: dict) -> str:
    hw, m = report["hardware"], report["measurements"]
    where = f"measured on {hw['gpus']} x {hw['gpu']} ({hw['date']}, torch {hw['torch']}, CUDA {hw['cuda']})"
    metrics = {k: (v.get("metrics") or {}) for k, v in m.items()}
    if kind == "cnn":
        fp32, bf16 = (metrics.get(f"cnn {p}", {}).get("samples_per_s") for p in ("fp32", "bf16"))
        if fp32 and bf16:
            return f"{where}: fp32 {fp32:,.0f} samples/s, bf16 {bf16:,.0f} ({bf16 / fp32:.2f}x)"
    if kind == "allreduce" and metrics.get("all-reduce"):
        rows = [r for r in metrics["all-reduce"]["rows"] if r["algo"] == "builtin"]
        return f"{where}: all_reduce bus bandwidth " + ", ".join(
            f"{r['bytes'] / 2**20:g} MiB {r['busbw_GBps']:.0f} GB/s" for r in rows)  # fmt: skip
    if kind == "llama" and metrics.get("llama mfu"):
        r = metrics["llama mfu"]
        return (f"{where}: {r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.1f} % of "
                f"{r['peak_source']}")  # fmt: skip
    return f"{where}: no {kind} figure in this record"
