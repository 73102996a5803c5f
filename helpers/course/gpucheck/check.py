"""``make gpu-check``: run the plan on this node's GPUs, one program at a time, writing as it goes.

Each item runs in its own process session under its own limit (``supervise``) and gets a
verdict: ``ok``; ``needs N GPUs`` or ``needs <package>`` (this node cannot run it: not a
failure); ``timed out`` or ``failed``. The JSON and a Markdown table are rewritten after every
item, so a stuck program costs only its own limit and a killed check keeps what it had.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from helpers.course.gpucheck.needs import carry_lines, needs_gpus, needs_module
from helpers.course.gpucheck.plan import NOTEBOOK, STEPS, Item, plan
from helpers.course.gpucheck.record import FIGURES_ENV
from helpers.course.gpucheck.supervise import supervise
from helpers.runs import workbook_root

__all__ = ["main", "hardware", "verdict", "FIGURES_ENV"]

TOP = workbook_root(Path(__file__).parent) or Path.cwd()
_HOW = ("helpers.course.gpucheck: each program alone under its own time limit, jobs at "
        "min(their world size, the GPUs here) ranks through helpers.course.dryrun.runner."
        "run_ranks, stopped after {steps} optimizer steps; measurements to their end; "
        "notebook 01 in full mode (python3 kernel)")  # fmt: skip


def hardware() -> dict:
    """What the figures were measured on."""
    import torch

    n = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0) if n else "no GPU"
    return {"gpu": name, "gpus": n, "torch": torch.__version__, "cuda": torch.version.cuda,
            "driver": _driver(), "python": platform.python_version(), "host": platform.node(),
            "date": time.strftime("%Y-%m-%d")}  # fmt: skip


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "?"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def verdict(item: Item, result: dict) -> str:
    """'ok', 'needs N GPUs', 'needs <package>', 'timed out' or 'failed'."""
    if result.get("ok"):
        return "ok"
    if result.get("timed_out"):
        return "timed out"
    gpus = needs_gpus(result, item.world, item.wants)
    if gpus:
        return f"needs {gpus} GPUs"
    module = needs_module(result)
    return f"needs {module}" if module else "failed"


def _spec(item: Item, out: Path, mode: str) -> tuple[dict, dict]:
    """(the spec for ``one``, extra environment) of an item."""
    work = out / "work" / _slug(item.name)
    if item.kind == "notebook":
        spec = {"kind": "notebook", "notebook": str(NOTEBOOK), "root": str(TOP),
                "output": str(out / "01_single_gpu_cnn.ipynb"), "metrics": str(work / "figures.json")}  # fmt: skip
        return spec, {FIGURES_ENV: spec["metrics"]}
    spec = {"kind": "program", "program": str(item.program), "args": item.args, "world": item.world,
            "steps": item.steps, "mode": mode, "events": str(work / "events")}  # fmt: skip
    return spec, {}


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _row(item: Item, result: dict) -> dict:
    keep = ("reached", "steps", "seconds", "wall", "error", "where", "metrics", "peak_gib",
            "phases", "tail", "output")  # fmt: skip
    row = {"verdict": verdict(item, result), "ok": bool(result.get("ok")),
           "ranks": item.world, "wants": item.wants, "limit_s": item.limit}  # fmt: skip
    row.update({k: result[k] for k in keep if k in result})
    if item.world < item.wants and row["verdict"] == "ok":
        row["note"] = f"ran on {item.world} of its {item.wants} ranks (the GPUs here)"
    return row


def _run_item(item: Item, report: dict, out: Path, mode: str) -> None:
    if item.same_as:
        report["jobs"].append(
            {"job": item.name, "written_by": item.written_by, "same_as": item.same_as}
        )
        return
    if item.skip:
        row = {"verdict": item.skip, "ok": False, "ranks": 0, "wants": item.wants}
    else:
        spec, env = _spec(item, out, mode)
        row = _row(item, supervise(spec, item.limit, out / "work" / _slug(item.name), env))
    if item.kind == "job":
        args = " ".join(item.args)
        report["jobs"].append(
            {"job": item.name, "written_by": item.written_by, "args": args, **row}
        )
    elif item.kind == "measurement":
        report["measurements"][item.name] = row
    else:
        report["notebook_01"] = row


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m helpers.course.gpucheck", description=__doc__)
    ap.add_argument("--jobs", type=Path, default=TOP / "build" / "dryrun" / "runs",
                    help="the job directories `make dryrun` wrote (copy them to the node)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=TOP / "build" / "gpu-check")
    ap.add_argument("--limit", type=float, default=180, help="seconds per program (default 180)")
    ap.add_argument("--deepspeed-limit", type=float, default=480,
                    help="seconds per DeepSpeed program: it compiles CPU Adam first (default 480)")  # fmt: skip
    ap.add_argument("--notebook-limit", type=float, default=1500, help="seconds for notebook 01")
    ap.add_argument("--steps", type=int, default=STEPS, help="optimizer steps per job")
    ap.add_argument("--only", default="", help="run the items whose name contains this")
    ap.add_argument("--skip-notebook", action="store_true", help="leave notebook 01 out")
    ap.add_argument("--skip-measurements", action="store_true", help="run the jobs only")
    ap.add_argument("--plan", "--list", dest="plan", action="store_true",
                    help="print what would run (and what this node lacks), run nothing")  # fmt: skip
    ap.add_argument("--gpus", type=int, default=0,
                    help="plan for this many GPUs (--plan), or stand in with this many CPU ranks")  # fmt: skip
    ap.add_argument("--standin", action="store_true",
                    help="test the check itself on 2 CPU ranks posing as GPUs (no GPU figures)")  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    hw = hardware()
    if args.standin:
        n = args.gpus or 2
        hw.update(gpu=f"stand-in h100 ({n} CPU ranks: not GPU figures)", gpus=n)
    gpus = args.gpus or hw["gpus"]
    limits = {"job": args.limit, "deepspeed": args.deepspeed_limit, "notebook": args.notebook_limit}
    items = plan(
        args.jobs,
        max(gpus, 1),
        limits,
        notebook=not (args.skip_notebook or args.standin),
        measure=not args.skip_measurements,
    )
    for item in items:
        item.steps = args.steps if item.kind == "job" else item.steps
    items = [i for i in items if args.only in i.name]
    if args.plan:
        return _print_plan(items, max(gpus, 1), hw, args)
    if not hw["gpus"]:
        print("gpu-check: no NVIDIA GPU is visible here (torch.cuda.device_count() == 0). Run it "
              "on a GPU node of your site: see docs/instructors.md, 'Check the GPU world'; "
              "`--plan` shows what it would run.")  # fmt: skip
        return 2
    report = {"hardware": hw, "how": _HOW.format(steps=args.steps), "jobs": [], "measurements": {}}
    report["missing"] = sorted({m for i in items for m in i.missing})
    report["carry"] = carry_lines(report["missing"], TOP)
    _print_missing(report["carry"])
    if not (args.jobs.is_dir() and any(args.jobs.rglob("job.json"))):
        print(f"gpu-check: no job directories under {args.jobs}: run `make dryrun` where the "
              "workbook's venv is and copy build/dryrun/runs here; measuring only.")  # fmt: skip
    # Compute nodes have no internet: the jobs' data falls back to its stand-in, for this
    # check only (the caller's environment is left as it was).
    from unittest import mock

    from helpers.course.gpucheck.report import rows, write

    path = args.out / ("standin-test.json" if args.standin else f"{_key(hw)}.json")
    with mock.patch.dict(os.environ, {"WORKBOOK_ALLOW_STANDIN_DATA": "1"}):
        for n, item in enumerate(items, 1):
            print(f"[{n}/{len(items)}] {item.describe()}", flush=True)
            _run_item(item, report, args.out, "strict" if args.standin else "gpu")
            write(report, path)
    found = [r["verdict"].removeprefix("needs ") for _, _, r in rows(report)]
    found = [m for m in found if m.isidentifier()]  # a module a program could not import
    if set(found) - set(report["missing"]):
        report["missing"] = sorted(set(report["missing"]) | set(found))
        report["carry"] = carry_lines(report["missing"], TOP)
        _print_missing(report["carry"])
    return write(report, path, final=True)


def _key(hw: dict) -> str:
    from helpers import gpus

    gpu = gpus.find(hw["gpu"])
    key = next((k for k, g in gpus.GPUS.items() if g is gpu), None) or _slug(hw["gpu"]).lower()
    return f"{key}-{hw['date']}"


def _print_missing(lines: list[str]) -> None:
    if lines:
        print("gpu-check: this node lacks packages that some items need (they are reported as "
              "'needs ...'). To carry them here:\n  " + "\n  ".join(lines), flush=True)  # fmt: skip


def _print_plan(items: list[Item], gpus: int, hw: dict, args) -> int:
    print(f"gpu-check plan for {gpus} GPU(s) ({hw['gpus']} x {hw['gpu']} visible; torch "
          f"{hw['torch']}, Python {hw['python']}); jobs from {args.jobs}:")  # fmt: skip
    for item in items:
        print("  " + item.describe())
    _print_missing(carry_lines(sorted({m for i in items for m in i.missing}), TOP))
    return 0


if __name__ == "__main__":
    sys.exit(main())
