"""Slurm jobs from a notebook: write, submit, follow, and collect results.

    from helpers.cluster import Job
    job = Job("allreduce", "programs/allreduce.py", nodes=2, gpus_per_node=4,
              profile="perlmutter", values={"account": "m1234_g"})
    job.submit()          # sbatch, or re-attach to the job this exact cell already submitted
    job.wait()            # live progress: PENDING -> RUNNING -> COMPLETED, elapsed time
    job.logs(tail=20)     # the end of slurm-<id>.out
    job.result()          # the metrics.json rank 0 wrote with helpers.runs.write_metrics

Each job gets a run directory (``runs/NAME/<id>/``: program.py, the modules
beside it that it imports, job.sh, job.json, command.txt, slurm-<jobid>.out, metrics.json).
The script names its files relative to that directory, so the directory is the job: copy
it to a cluster and ``sbatch job.sh`` there. ``job.json`` describes the job (profile,
resources, arguments, the GPU it asks for); ``helpers.course.dryrun`` checks every job a
notebook wrote from it. The job id is recorded in
``runs/NAME/slurm/<key>.json`` where key hashes the program, the resources and
the rendered script, so re-running a notebook re-attaches instead of
resubmitting, and a changed program is a new job.

Without a reachable Slurm (no sbatch, or the controller is down) ``submit()``
writes the job, prints how to run the same program locally, and returns None:
notebooks run anywhere. ``%%sbatch`` (helpers.notebook.sbatch_cell) wraps all of this.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from helpers.cluster.following import Following
from helpers.cluster.jobscript import PORT_BASE, JobSpec, check_job_name, render, sbatch_value
from helpers.cluster.modules import sibling_imports
from helpers.cluster.profiles import ProfileError, load_profile
from helpers.cluster.slurmcli import (
    TERMINAL,
    job_state,
    run,
    slurm_available,
)
from helpers.launch import torchrun_command
from helpers.runs import new_run_dir, runs_root

__all__ = ["Job", "slurm_available", "job_state", "TERMINAL", "ProfileError"]


@dataclass
class Job(Following):
    """A program, its resources and a cluster profile, submitted as one Slurm job."""

    name: str
    program: str | os.PathLike
    nodes: int = 1
    gpus_per_node: int = 1
    profile: str = "local"
    time: str = "00:10:00"
    args: Sequence[str] = ()
    values: dict = field(default_factory=dict)  # profile fields: account, env, ...
    nsys: bool = False
    nccl_debug: bool = False
    signal: str = ""  # e.g. "USR1@90": a warning signal before the time limit
    requeue: bool = False  # back to the queue when preempted or stopped by the signal
    launcher: str = "torchrun"  # or "deepspeed": DeepSpeed's launcher on a single node
    files: Sequence[str | os.PathLike] = ()  # more files the program reads (a config): copied
    # the fewest GPUs its layout runs on (tp=2, 2 pipeline stages): 0 = any; make gpu-check
    # reports the job as "needs N GPUs" on a node with fewer, without starting it
    min_gpus: int = 0
    job_id: str | None = field(default=None, init=False)
    _run_dir: Path | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        check_job_name(self.name)
        self.args = tuple(str(a) for a in self.args)
        self._profile = load_profile(self.profile)
        self._values = self._profile.values(self.values)
        path = Path(self.program)
        if not path.is_file():
            raise FileNotFoundError(f"program {str(path)!r} not found (cwd {Path.cwd()})")
        self._source = path.read_text()
        self._modules = sibling_imports(path)  # e.g. programs/ring.py for `from ring import`
        for extra in self.files:  # shipped beside the program, read by it at run time
            extra = Path(extra)
            if not extra.is_file():
                raise FileNotFoundError(f"file {str(extra)!r} for job {self.name!r} not found")
            self._modules[extra.name] = extra.read_text()
        # Key: the program, the files beside it, and the script (resources, profile,
        # options, the templates themselves).
        parts = [self._source, *(f"{k}\0{v}" for k, v in sorted(self._modules.items()))]
        blob = "\0".join([*parts, self._render()])
        self.key = hashlib.sha256(blob.encode()).hexdigest()[:16]
        self._state = "NOT_SUBMITTED"
        rec = self._load_record()
        if rec:  # this exact job was written (and maybe submitted) before: re-attach
            self._run_dir = Path(rec["run_dir"])
            self.job_id = rec.get("job_id")
            self._state = rec.get("state", "UNKNOWN") if self.job_id else "NOT_SUBMITTED"

    # ------------------------------------------------------------------ files
    def _render(self) -> str:
        """The script: paths relative to the run directory, which sbatch runs it from."""
        return render(self._spec())

    def _spec(self) -> JobSpec:
        return JobSpec(
            name=self.name,
            profile=self._profile,
            values=self._values,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            time=self.time,
            program="program.py",
            args=self.args,
            run_dir=".",
            nsys=self.nsys,
            nccl_debug=self.nccl_debug,
            signal=self.signal,
            requeue=self.requeue,
            launcher=self.launcher,
        )

    @property
    def _record_path(self) -> Path:
        return runs_root() / self.name / "slurm" / f"{self.key}.json"

    def _load_record(self) -> dict:
        p = self._record_path
        return json.loads(p.read_text()) if p.is_file() else {}

    def _save_record(self, **extra) -> None:
        rec = {
            **self._load_record(),
            "name": self.name,
            "profile": self.profile,
            "run_dir": str(self._run_dir),
            "job_id": self.job_id,
            "state": self._state,
            **extra,
        }
        p = self._record_path
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=2))
        tmp.replace(p)

    @property
    def run_dir(self) -> Path:
        """The job's run directory (program.py, job.sh, command.txt), written on first use: a
        notebook that prints it before ``text()`` prints the path, not None."""
        if self._run_dir is None:
            self.write()
        return self._run_dir

    @run_dir.setter
    def run_dir(self, path: Path | None) -> None:
        self._run_dir = path

    @property
    def script(self) -> Path | None:
        """job.sh, or None while the job is not written."""
        return self._run_dir / "job.sh" if self._run_dir else None

    def write(self) -> Path:
        """Write program.py, job.sh and command.txt into a fresh run directory."""
        if self._run_dir and self.script.is_file():
            return self.script
        self._run_dir = new_run_dir(self.name)
        (self.run_dir / "program.py").write_text(self._source)
        for file_name, source in self._modules.items():  # beside program.py: imports work
            (self.run_dir / file_name).write_text(source)
        self.script.write_text(self._render())
        self.script.chmod(0o755)
        (self.run_dir / "job.json").write_text(json.dumps(self.manifest(), indent=2) + "\n")
        (self.run_dir / "command.txt").write_text(
            f"cd {shlex.quote(str(self.run_dir))} && sbatch job.sh\n"
        )
        self._save_record()
        return self.script

    def text(self) -> str:
        """The job script (written on first use), to read or to print in a notebook."""
        return self.write().read_text()

    def manifest(self) -> dict:
        """What a checker needs to know of this job, without parsing its script."""
        facts = self._profile.facts(self._values)
        mem = sbatch_value(self._spec(), "--mem")
        return {
            "name": self.name, "profile": self.profile, "values": self._values,
            "nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "time": self.time,
            "program": "program.py", "args": list(self.args), "launcher": self.launcher,
            "files": sorted(self._modules), "gpu": facts["gpu"], "mem": mem,
            "host_mem_per_gpu_gb": facts["host_mem_per_gpu_gb"], "key": self.key,
            "written_by": os.environ.get("WORKBOOK_NOTEBOOK", ""),
            **({"min_gpus": self.min_gpus} if self.min_gpus else {}),
        }  # fmt: skip

    def local_command(self) -> str:
        """How to run the same program on this machine, without Slurm."""
        n = self.nodes * self.gpus_per_node
        prog = str(self._run_dir / "program.py") if self._run_dir else str(self.program)
        if n == 1:
            return shlex.join(["python", prog, *self.args])
        return shlex.join(
            torchrun_command(prog, n, rdzv_endpoint=f"localhost:{PORT_BASE}", args=self.args)
        )

    # ------------------------------------------------------------- slurm side
    def submit(self, force: bool = False) -> str | None:
        """sbatch the job (or re-attach to it); None in write-only mode."""
        if self.job_id and not force:
            print(
                f"re-attached to job {self.job_id} ({self.name}, {self.status()}); "
                "pass force=True (or --resubmit) to run it again"
            )
            return self.job_id
        if force and self.job_id:
            self._run_dir, self.job_id = None, None  # a new run directory: never overwrite logs
        script = self.write()
        ok, why = slurm_available()
        if not ok:
            n = self.nodes * self.gpus_per_node
            print(
                f"write-only mode: {why}.\n  job script: {script}\n"
                f"  run it on this machine instead:\n"
                f"    helpers.launch.run({str(self.run_dir / 'program.py')!r}, nproc={n}, name={self.name!r})\n"
                f"    or in a shell: {self.local_command()}\n"
                f"  or on a cluster: copy the run directory and run: sbatch job.sh"
            )
            return None
        out = run(["sbatch", "--parsable", script.name], cwd=self.run_dir)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch rejected {script}:\n{out.stderr.strip()}")
        self.job_id = out.stdout.strip().split(";")[0]
        self._state = "PENDING"
        self._save_record(submitted=time.time())
        print(
            f"submitted job {self.job_id} ({self.name}: {self.nodes} node(s) x "
            f"{self.gpus_per_node} GPU(s), profile {self.profile}); logs in {self.run_dir}"
        )
        return self.job_id

    def check(self) -> subprocess.CompletedProcess:
        """``sbatch --test-only job.sh``: would Slurm accept this job? (nothing is queued)"""
        script = self.write()
        return run(["sbatch", "--test-only", script.name], cwd=self.run_dir)

    def __repr__(self) -> str:
        where = f"job {self.job_id}" if self.job_id else "not submitted"
        return (
            f"Job({self.name!r}, {self.nodes} node(s) x {self.gpus_per_node} GPU(s), "
            f"profile={self.profile!r}, {where}, {self._state}, run_dir={self._run_dir})"
        )
