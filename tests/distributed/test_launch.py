"""helpers.launch and helpers.notebook.magics on real processes: torchrun, gloo, a real IPython shell.

Every bound on elapsed time below is a correctness bound (a failure must not
hang), not a speed target: speed is measured by ``python -m helpers.course.bench launch``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import launch, runs
from helpers.launch import RankFailure
from helpers.notebook import magics

ALLREDUCE = textwrap.dedent(
    """
    import torch
    import torch.distributed as tdist

    from helpers import dist, runs


    def main():
        d = dist.init()
        t = torch.tensor([float(d.rank + 1)])
        tdist.all_reduce(t)
        print(f"sum={t.item():g}")
        runs.write_metrics({"sum": t.item(), "world_size": d.world_size})
        dist.cleanup()


    if __name__ == "__main__":
        main()
    """
)

# Rank 2 raises; ranks 0 and 1 wait in an all-reduce that needs rank 2; rank 3 is
# stuck somewhere that never notices (a long sleep) and ignores SIGTERM, so torchrun
# alone would wait 30 s before killing it. All must be stopped sooner.
RANK2_FAILS = textwrap.dedent(
    """
    import signal
    import sys
    import time

    import torch
    import torch.distributed as tdist

    from helpers import dist


    def main():
        d = dist.init()
        tdist.barrier()
        if d.rank == 2:
            open(sys.argv[1], "w").write(str(time.time()))  # when the failure happened
            raise ValueError("boom on rank 2")
        if d.rank == 3:  # stuck, and deaf to torchrun's SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
        tdist.all_reduce(torch.ones(1))


    if __name__ == "__main__":
        main()
    """
)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _child_env() -> dict:
    return {**os.environ, "PYTHONPATH": launch.workbook_pythonpath(os.environ.get("PYTHONPATH"))}


# --------------------------------------------------------------------------- run()


def test_run_two_ranks_returns_metrics_logs_and_keeps_every_run(tmp_path):
    prog = _write(tmp_path, "allreduce.py", ALLREDUCE)
    first = launch.run(prog, nproc=2, name="allreduce", timeout=300)
    assert first.ok, first.traceback
    assert first.returncode == 0 and first.failed_rank is None
    assert first.metrics == {"sum": 3.0, "world_size": 2}  # 1 + 2
    assert first.logs[0].strip() == "sum=3" and first.logs[1].strip() == "sum=3"
    for f in ("program.py", "command.txt", "logs/rank0.log", "logs/rank1.log", "metrics.json"):
        assert (first.run_dir / f).is_file(), f
    assert (first.run_dir / "program.py").read_text() == ALLREDUCE
    assert "--rdzv-backend=c10d" in (first.run_dir / "command.txt").read_text()

    second = launch.run(prog, nproc=1, name="allreduce", timeout=300, stream=False)
    assert second.ok and second.metrics == {"sum": 1.0, "world_size": 1}
    assert second.run_dir != first.run_dir and second.run_dir.parent == first.run_dir.parent
    assert runs.read_metrics(first.run_dir / "metrics.json")["world_size"] == 2


def test_run_failure_names_the_rank_and_stops_the_others(tmp_path):
    prog = _write(tmp_path, "rank2_fails.py", RANK2_FAILS)
    stamp = tmp_path / "failed_at"
    res = launch.run(prog, nproc=4, args=[stamp], timeout=300)
    # Measured from the moment rank 2 raised, so a slow start-up does not count.
    elapsed = time.time() - float(stamp.read_text())
    assert elapsed < 30, f"a failing rank must end the run promptly, took {elapsed:.0f} s"
    assert not res.ok and not res.timed_out
    assert res.failed_rank == 2
    assert "ValueError: boom on rank 2" in res.traceback
    assert res.traceback.startswith("Traceback")
    with pytest.raises(RankFailure, match="rank 2") as info:
        res.raise_for_status()
    assert "boom on rank 2" in str(info.value)


def test_run_timeout_kills_every_process(tmp_path):
    pidfile = tmp_path / "pid"
    # No torch import: the rank is up within a second of torchrun, well inside the timeout.
    prog = _write(
        tmp_path,
        "sleeper.py",
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "print('sleeping', flush=True)\ntime.sleep(600)\n",
    )
    res = launch.run(prog, nproc=1, timeout=15, stream=False)
    assert res.timed_out and not res.ok
    with pytest.raises(RankFailure, match="timed out"):
        res.raise_for_status()
    assert pidfile.exists(), "the program never started: raise the timeout for this machine"
    pid = int(pidfile.read_text())
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_run_rejects_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no program file"):
        launch.run(tmp_path / "missing.py", nproc=2)
    prog = _write(tmp_path, "p.py", "print(1)\n")
    with pytest.raises(ValueError, match="nproc"):
        launch.run(prog, nproc=0)
    with pytest.raises(ValueError, match="invalid run name"):
        launch.run(prog, nproc=1, name="has space")


# --------------------------------------------------------------------------- magics

HELLO_CELL = textwrap.dedent(
    """
    import torch
    import torch.distributed as tdist

    from helpers import dist, runs
    from helpers.config import parse
    from dataclasses import dataclass


    @dataclass
    class Cfg:
        value: float = 1.0


    def main():
        cfg = parse(Cfg)
        d = dist.init()
        t = torch.tensor([cfg.value])
        if d.world_size > 1:  # a single process (python prog.py) has no group to reduce over
            tdist.all_reduce(t)
        print(f"rank {d.rank} of {d.world_size}: {t.item():g}")
        runs.write_metrics({"sum": t.item()})
        dist.cleanup()


    if __name__ == "__main__":
        main()
    """
)


def test_torchrun_magic_writes_a_standalone_program(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    import helpers

    monkeypatch.chdir(tmp_path)
    shell = InteractiveShell.instance()
    helpers.load_ipython_extension(shell)
    res = shell.run_cell_magic("torchrun", "-n 2 hello --out hello_run -- --value 2", HELLO_CELL)
    assert res.ok and res.metrics == {"sum": 4.0}
    assert shell.user_ns["hello_run"] is res and shell.user_ns["_torchrun"] is res
    prog = tmp_path / "programs" / "hello.py"
    assert prog.read_text() == HELLO_CELL

    # The same file by hand: one process ...
    single = subprocess.run(
        [sys.executable, str(prog), "--value", "5"],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=120,
    )
    assert single.returncode == 0, single.stderr
    assert "rank 0 of 1: 5" in single.stdout
    # ... and torchrun with 2 ranks.
    cmd = launch.torchrun_command(
        prog,
        2,
        rdzv_endpoint=f"localhost:{launch.free_port()}",
        exe=[sys.executable, "-m", "torch.distributed.run"],
    )
    both = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(), timeout=180)
    assert both.returncode == 0, both.stderr
    assert both.stdout.count("of 2: 2") == 2


def test_torchrun_magic_raises_on_failure_and_bad_lines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="required: name"):
        magics.parse_line("-n 2")
    with pytest.raises(ValueError, match="invalid run name"):
        magics.parse_line("-n 2 'two words'")
    opts = magics.parse_line("-n 3 demo --timeout 9 -- --epochs 2")
    assert (opts.nproc, opts.name, opts.timeout, opts.prog_args) == (
        3,
        "demo",
        9.0,
        ["--epochs", "2"],
    )
    ns: dict = {}
    with pytest.raises(RankFailure, match="rank 0"):
        magics.torchrun_magic("-n 1 broken", "raise SystemError('nope')\n", ns)
    assert not ns["_torchrun"].ok
