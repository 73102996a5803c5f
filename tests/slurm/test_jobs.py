"""Real jobs on the local Slurm cluster (slurm/local/start.sh --nodes 2).

Every test submits to a real slurmctld and its two slurmd nodes; the programs
are real torch.distributed programs on gloo. Job names carry a random suffix
because the controller remembers finished jobs across test sessions.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cluster.job import Job
from helpers.cluster.slurmcli import job_state
from helpers.notebook.sbatch_cell import sbatch_magic
from helpers.runs import list_runs, read_metrics

pytestmark = pytest.mark.slurm

ALLREDUCE = """
import os
import sys

import torch
import torch.distributed as tdist

from helpers import dist
from helpers.runs import write_metrics


def main():
    d = dist.init()
    t = torch.tensor([float(d.rank + 1)])
    node = os.environ.get("SLURMD_NODENAME", "?")
    nodes = [node]
    if d.world_size > 1:
        tdist.all_reduce(t)  # every rank ends with 1 + 2 + ... + world_size
        nodes = [None] * d.world_size
        tdist.all_gather_object(nodes, node)
    print(f"[rank{d.rank}] sum={t.item()} on {node}", flush=True)
    write_metrics({"world_size": d.world_size, "sum": t.item(), "nodes": nodes,
                   "argv": sys.argv[1:]})
    dist.cleanup()


if __name__ == "__main__":
    main()
"""

SLEEP = 'import time\nprint("started", flush=True)\ntime.sleep(600)\n'


def unique(name: str) -> str:
    return f"{name}-{secrets.token_hex(3)}"


@pytest.fixture
def allreduce(tmp_path) -> Path:
    p = tmp_path / "allreduce.py"
    p.write_text(ALLREDUCE)
    return p


def test_test_only_accepts_generated_scripts_and_rejects_bad_ones(cluster, allreduce):
    for nodes, gpus in [(1, 1), (1, 2), (1, 4), (2, 1), (2, 4)]:
        job = Job(unique("testonly"), allreduce, nodes=nodes, gpus_per_node=gpus)
        out = job.check()
        assert out.returncode == 0, f"{nodes}x{gpus}: {out.stderr}"
    script = job.script.read_text()
    bad = {
        "--time=00:10:00": ("--time=ten-minutes", 255),  # unparseable: an sbatch usage error
        "--partition=workbook": ("--partition=nosuchpartition", 1),  # unknown partition
        "--gres=gpu:h200:4": ("--gres=gpu:h200:9", 1),  # more GPUs than a node has
    }
    for good, (worse, code) in bad.items():
        assert good in script
        job.script.write_text(script.replace(good, worse))
        out = job.check()
        assert out.returncode == code, (worse, out.returncode, out.stderr)
        assert out.stderr.strip()  # Slurm says why


def test_single_node_torchrun_allreduce_returns_metrics(cluster, allreduce, tmp_path, monkeypatch):
    # A run directory with a space in it: every path in the script must be quoted.
    monkeypatch.setenv("WORKBOOK_RUNS", str(tmp_path / "runs with space"))
    job = Job(unique("ar1node"), allreduce, nodes=1, gpus_per_node=2)
    assert job.submit() is not None
    metrics = job.result(timeout=300)
    assert metrics["world_size"] == 2 and metrics["sum"] == 3.0
    assert "[rank0] sum=3.0" in job.logs(rank=0) and "[rank1]" not in job.logs(rank=0)
    assert job.status() == "COMPLETED"


def test_two_node_job_spreads_ranks_over_both_nodes(cluster, allreduce):
    job = Job(unique("ar2nodes"), allreduce, nodes=2, gpus_per_node=1)
    job.submit()
    metrics = job.result(timeout=300)
    assert metrics["world_size"] == 2 and metrics["sum"] == 3.0
    assert sorted(metrics["nodes"]) == ["node1", "node2"], job.logs()
    # The launch line, near the top: a torchrun agent's exit noise can fill the default tail.
    assert "rendezvous at" in job.logs(tail=10_000)


def test_cancel_leaves_a_running_job_cancelled(cluster, tmp_path):
    prog = tmp_path / "sleep.py"
    prog.write_text(SLEEP)
    job = Job(unique("sleeper"), prog)
    job.submit()
    deadline = time.monotonic() + 60
    while job.status() != "RUNNING":
        assert time.monotonic() < deadline, f"never started: {job.status()}"
        time.sleep(0.3)
    assert job.cancel() == "CANCELLED"
    assert job_state(job.job_id).startswith("CANCELLED")
    with pytest.raises(RuntimeError, match="ended CANCELLED"):
        job.result()


def test_rerunning_the_cell_reattaches_and_a_changed_cell_resubmits(
    cluster, tmp_path, monkeypatch, capsys
):
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.chdir(tmp_path)  # programs/NAME.py lands here, not in the checkout
    shell = InteractiveShell.instance()
    name = unique("cell")
    cell = "from helpers.runs import write_metrics\nwrite_metrics({'version': %d})\n"
    first = sbatch_magic(f"{name} --profile local", cell % 1, shell)
    assert shell.user_ns["job"] is first and first.job_id
    again = sbatch_magic(f"{name} --profile local", cell % 1, shell)
    assert "re-attached to job" in capsys.readouterr().out
    assert again.job_id == first.job_id and again.run_dir == first.run_dir
    ids = subprocess.run(
        ["squeue", "-h", "-t", "all", "-n", name, "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    assert ids == [first.job_id]  # one job, not two
    assert len(list_runs(name)) == 1
    assert again.result(timeout=120) == {"version": 1}

    changed = sbatch_magic(f"{name} --profile local --as job2", cell % 2, shell)
    assert changed.job_id != first.job_id and shell.user_ns["job2"] is changed
    assert changed.result(timeout=120) == {"version": 2}
    assert len(list_runs(name)) == 2  # the first run's files are still there


def test_hostile_arguments_reach_the_program_literally(cluster, allreduce, tmp_path):
    marker = tmp_path / "pwned"
    args = [f"$(touch {marker})", f"; touch {marker}", "it's", "`touch x`"]
    job = Job(unique("hostile"), allreduce, args=args)
    job.submit()
    assert job.result(timeout=120)["argv"] == args
    assert not marker.exists()


def test_written_program_runs_under_srun_without_torchrun(cluster, tmp_path, monkeypatch):
    """`srun -n 2 python prog.py`: helpers.dist reads SLURM_PROCID/SLURM_NTASKS itself.

    The program is written by the same writer as %%torchrun and %%sbatch cells.
    """
    from helpers.notebook.program import write_program

    monkeypatch.chdir(tmp_path)
    prog = write_program("srun_allreduce", ALLREDUCE)
    env = {
        **os.environ,
        "WORKBOOK_METRICS": str(tmp_path / "metrics.json"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    out = subprocess.run(
        ["srun", "--nodes=2", "--ntasks=2", "--time=00:05:00", "python", str(prog)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    metrics = read_metrics(tmp_path / "metrics.json")
    assert metrics["world_size"] == 2 and metrics["sum"] == 3.0
    assert sorted(metrics["nodes"]) == ["node1", "node2"]


def test_a_job_slurm_has_forgotten_is_a_clear_error(cluster, allreduce):
    job = Job(unique("forgotten"), allreduce)
    job.write()
    job.job_id = "999999"  # as if the record outlived a reset cluster
    with pytest.raises(RuntimeError, match="no longer knows job 999999.*resubmit"):
        job.wait(poll=0.05, progress=False)


def test_a_job_imports_the_learners_program_cell(cluster, tmp_path, monkeypatch):
    """A lab's pattern: %%program writes the learner's cell, %%sbatch's job imports it."""
    from IPython.core.interactiveshell import InteractiveShell

    from helpers.notebook.program import program_magic

    monkeypatch.chdir(tmp_path)
    shell = InteractiveShell.instance()
    program_magic("learner_sum", "def total(xs):\n    return sum(xs) + 0.5\n", shell)
    assert shell.user_ns["total"]([1, 2]) == 3.5  # the cell also ran in the kernel
    driver = (
        "from helpers.runs import write_metrics\n"
        "from learner_sum import total\n"
        "write_metrics({'total': total([1, 2, 3])})\n"
    )
    job = sbatch_magic(f"{unique('driver')} --profile local", driver, shell)
    assert job.result(timeout=120) == {"total": 6.5}
    assert (job.run_dir / "learner_sum.py").is_file()  # the code that ran is kept with the run
