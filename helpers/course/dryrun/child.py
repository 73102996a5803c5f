"""One rank of a checked job: ``python -m helpers.course.dryrun.child SPEC.json``.

The spec names the program, its arguments, the rank and world size, the mode (``fake``:
full size on fake tensors; ``strict``: real CPU ranks on the stand-in GPU) and where to
write the result: how far the program got, its peak bytes by device, and, if it failed,
the error with the program line and the workbook line it came from.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

import torch

from helpers.config import SMALL_ENV

__all__ = ["main", "locate", "locate_frames"]


def locate(exc: BaseException, program: Path) -> dict:
    """Where an exception came from: the program's own line, and the deepest workbook line."""
    return locate_frames(traceback.extract_tb(exc.__traceback__), program)


def locate_frames(frames: list, program: Path) -> dict:
    """The program's own line among ``frames``, and the deepest workbook line."""
    top = Path(__file__).resolve().parents[3]  # the checkout holding helpers/
    prog = [f for f in frames if Path(f.filename).resolve() == program.resolve()]
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(top / "helpers")
            and "/dryrun/" not in f.filename and "/standin/" not in f.filename]  # fmt: skip
    where = {}
    if prog:
        where["program_line"] = f"{program.name}:{prog[-1].lineno}: {prog[-1].line}"
    if ours and (not prog or ours[-1] is not prog[-1]):
        f = ours[-1]
        where["workbook_line"] = (
            f"{Path(f.filename).resolve().relative_to(top)}:{f.lineno}: {f.line}"
        )
    return where


class _Progress:
    """Milestones and the step limit for a strict run (a fake run has FakeRank's own)."""

    def __init__(self, max_steps: int):
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from helpers.course.dryrun.fake import StopDryRun

        self.reached, self.steps, self.max_steps = "started", 0, max_steps

        def forward(*_):
            if self.reached == "started":
                self.reached = "forward"

        def step(*_):
            self.steps += 1
            self.reached = "step"
            if self.steps >= self.max_steps:
                raise StopDryRun(f"stopped after {self.steps} optimizer step(s)")

        torch.nn.modules.module.register_module_forward_pre_hook(forward)
        register_optimizer_step_post_hook(step)


def _refuse_other_backends() -> None:
    """A process group made without helpers.dist.init() fails at once, naming the line: its
    tensors would never meet the stand-in GPU, and a rank alone would wait for its peers."""
    import torch.distributed as tdist

    original = tdist.init_process_group

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend", args[0] if args else None)
        if backend not in ("standin", "dryrun"):
            raise RuntimeError(
                f"the program joins a process group with backend {backend!r} itself, not through "
                "helpers.dist.init(), so the check cannot put it on the stand-in GPU: call "
                "d = dist.init() (a DeepSpeed program then passes d.backend to "
                "deepspeed.init_distributed, which reuses the group)")  # fmt: skip
        return original(*args, **kwargs)

    tdist.init_process_group = init_process_group


def _environment(spec: dict) -> None:
    os.environ.update({
        "RANK": str(spec["rank"]), "WORLD_SIZE": str(spec["world"]),
        "LOCAL_RANK": str(spec.get("local_rank", spec["rank"])),
        "LOCAL_WORLD_SIZE": str(spec.get("local_world", spec["world"])),
        "WORKBOOK_STANDIN_GPU": spec.get("gpu", "h100"),
        "WORKBOOK_METRICS": str(Path(spec["result"]).with_suffix(".metrics.json")),
    })  # fmt: skip
    if spec["mode"] in ("fake", "strict"):  # "gpu": the real device, for make gpu-check
        os.environ["WORKBOOK_DEVICE_CHECK"] = spec["mode"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(spec.get("port", 29500)))
    if spec.get("small"):
        os.environ[SMALL_ENV] = "1"
    else:  # full size: the sizes a GPU gets, even where the checking process asked for small
        os.environ.pop(SMALL_ENV, None)
    for key in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID"):
        os.environ.pop(key, None)  # the job's own ranks, not the Slurm job running the check


def _refuse_cuda_comparisons(program: Path, result: dict) -> bool:
    """A program that compares its device with "cuda" fails before it runs (source_rules)."""
    from helpers.course.dryrun.source_rules import ADVICE, cuda_comparisons

    found = cuda_comparisons(program)
    if found:
        result.update(ok=False, program_line=found[0], error=(
            f"DeviceTypeCheck: {found[0]} compares the device with 'cuda': {ADVICE}"
            + (f" (also {'; '.join(found[1:])})" if len(found) > 1 else "")))  # fmt: skip
    return bool(found)


def _run_program(program: Path, tracker, progress, result: dict, checked: bool = True) -> None:
    """The program as __main__, under the fake rank if there is one; its end in ``result``."""
    from helpers.course.dryrun.fake import StopDryRun

    if checked and _refuse_cuda_comparisons(program, result):  # on the stand-in, not a GPU
        return
    start = time.perf_counter()
    try:
        with tracker if tracker is not None else contextlib.nullcontext():
            runpy.run_path(str(program), run_name="__main__")
        result["ended"] = "the program's end"
        progress.reached = "end"
    except StopDryRun as stop:
        result["ended"] = str(stop)
    except SystemExit as e:
        result["ok"] = e.code in (None, 0)
        result["ended"] = f"sys.exit({e.code!r})"
    except BaseException as e:  # noqa: BLE001 - every failure is the report
        result.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000], **locate(e, program),
                      traceback="".join(traceback.format_tb(e.__traceback__))[-8000:])  # fmt: skip
    result["seconds"] = time.perf_counter() - start
    from helpers.standin.ordering import end_all

    # ranks still waiting for this one's operations: it will post no more; a rank that ended
    # well then waits for the others, whose checks use the store rank 0's process hosts
    end_all(wait=result.get("ok") is not False)


def _op_log(result: dict) -> None:
    """A fake rank's operations on its default group, in order, when it sent messages: the
    dry run checks them against NCCL's rules for the other ranks (check.py)."""
    from helpers import standin

    if standin.POINT_TO_POINT[0] and standin.OPS:
        result["ops"] = [op.__dict__ for op in standin.OPS[0].ops[:_MAX_OPS]]


_MAX_OPS = 5000


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    _environment(spec)
    if spec["mode"] != "gpu":
        real_sleep = time.sleep
        time.sleep = lambda seconds: real_sleep(min(seconds, 0.01))  # a check does not wait
    from helpers import standin
    from helpers.course.dryrun.fake import FakeRank

    if spec["mode"] != "gpu":
        standin.install(spec.get("gpu"))
        # a DataLoader's workers fork from the rank, as under srun on Linux (cuda_rules)
        multiprocessing.set_start_method("fork", force=True)
    # fake mode logs every shape error it raises; the report carries the error once
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    program = Path(spec["program"]).resolve()
    os.chdir(spec.get("cwd") or program.parent)
    sys.argv = [str(program), *spec.get("argv", [])]
    sys.path.insert(0, str(program.parent))
    result: dict = {"rank": spec["rank"], "mode": spec["mode"], "ok": True}
    limits = {"cpu": spec["host_limit"]} if spec.get("host_limit") else None
    tracker = (FakeRank(spec.get("max_steps", 2), limits, spec.get("gpu_marks") or ())
               if spec["mode"] == "fake" else None)  # fmt: skip
    progress = _Progress(spec.get("max_steps", 2)) if tracker is None else tracker
    if spec["mode"] != "gpu":
        _refuse_other_backends()
    _run_program(program, tracker, progress, result, checked=spec["mode"] != "gpu")
    result.update(reached=progress.reached, steps=progress.steps,
                  point_to_point=standin.POINT_TO_POINT[0])  # fmt: skip
    if spec["mode"] == "fake":
        _op_log(result)
    metrics = Path(os.environ["WORKBOOK_METRICS"])
    if metrics.is_file():  # what rank 0 wrote with helpers.runs.write_metrics
        result["metrics"] = json.loads(metrics.read_text())
    if tracker is not None:
        result["peak_bytes"] = tracker.peaks()
        result["gpu_passed"] = {str(mark): locate_frames(stack, program)
                                for mark, stack in tracker.crossings().items()}  # fmt: skip
    elif spec["mode"] == "gpu" and torch.cuda.is_available():
        result["peak_bytes"] = {"gpu": torch.cuda.max_memory_allocated()}
    Path(spec["result"]).write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
