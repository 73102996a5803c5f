"""No rank outlives its launcher: SIGKILL of the launching process, and a Ctrl-C.

The launcher is a separate Python process here (as a Jupyter kernel is), so the
test can kill it the way a kernel restart or a crash does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    from helpers import dist
    d = dist.init()
    open(os.path.join(sys.argv[1], f"rank{d.rank}.pid"), "w").write(str(os.getpid()))
    time.sleep(600)
    """
)

RUN_LAUNCHER = textwrap.dedent(
    """
    import sys
    from helpers import launch
    launch.run(sys.argv[1], nproc=2, args=[sys.argv[2]], timeout=600, stream=False)
    """
)

SPAWN_LAUNCHER = textwrap.dedent(
    """
    import os, sys, time
    from helpers import launch

    def sleeper(d, where):
        open(os.path.join(where, f"rank{d.rank}.pid"), "w").write(str(os.getpid()))
        time.sleep(600)

    launch.spawn(sleeper, world_size=2, args=(sys.argv[1],), timeout=600)
    """
)


def _env(tmp_path: Path) -> dict:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root, "WORKBOOK_RUNS": str(tmp_path / "runs")}


def _wait_for_pids(where: Path, n: int, timeout: float = 90) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        files = sorted(where.glob("rank*.pid"))
        if len(files) == n and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not start within {timeout} s")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_all_gone(pids: list[int], within: float = 10.0) -> None:
    end = time.monotonic() + within
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.2)
    survivors = [p for p in pids if _alive(p)]
    assert not survivors, f"ranks {survivors} outlived their launcher by {within:g} s"


@pytest.mark.parametrize("how", ["run", "spawn"])
def test_sigkill_of_the_launcher_leaves_no_rank_alive(how, tmp_path):
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    if how == "run":
        prog = tmp_path / "sleeper.py"
        prog.write_text(SLEEPER)
        args = ["-c", RUN_LAUNCHER, str(prog), str(pids_dir)]
    else:
        args = ["-c", SPAWN_LAUNCHER, str(pids_dir)]
    launcher = subprocess.Popen([sys.executable, *args], env=_env(tmp_path), cwd=tmp_path)
    try:
        pids = _wait_for_pids(pids_dir, 2)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        _assert_all_gone(pids)
    finally:
        launcher.kill()


INTERRUPTED_SPAWN = textwrap.dedent(
    """
    import os, signal, threading, time
    from helpers import launch

    # Ctrl-C raises KeyboardInterrupt, as in a terminal or a kernel, even when this test runs
    # under a shell that started it in the background (which leaves SIGINT ignored, and a
    # Python started that way never raises it: the spawn below then waited its 600 s).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def sleeper(d):
        open(f"running{d.rank}", "w").close()
        time.sleep(600)

    def healthy(d):
        return d.rank

    def interrupt_once_running():
        while not (os.path.exists("running0") and os.path.exists("running1")):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    launch.warm_up()
    # Ctrl-C arrives while the ranks are running (however long a busy machine takes to start them).
    threading.Thread(target=interrupt_once_running, daemon=True).start()
    try:
        launch.spawn(sleeper, world_size=2, timeout=600)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    # The next call must not be blamed for the interrupted call's exits.
    for _ in range(3):
        assert launch.spawn(healthy, world_size=2) == [0, 1]
    print("next calls fine", flush=True)
    """
)


def _script(source: str, tmp_path, timeout: float) -> str:
    """Run ``source`` in a fresh python in ``tmp_path``; its stdout (it must exit 0)."""
    out = subprocess.run(
        [sys.executable, "-c", source],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_an_interrupted_spawn_does_not_blame_the_next_call(tmp_path):
    stdout = _script(INTERRUPTED_SPAWN, tmp_path, timeout=180)
    assert "interrupted" in stdout and "next calls fine" in stdout


CUT_MESSAGE = textwrap.dedent(
    """
    import time
    from helpers import launch
    from helpers.launch import framing, pool

    def sleeper(d):
        time.sleep(600)

    def healthy(d):
        return d.rank

    real_recv, cut = framing.recv, []

    def recv_cut_once(fd):
        # A Ctrl-C that lands after a zygote message's length was read, before its body.
        if not cut:
            cut.append(framing._read_exact(fd, framing._FRAME.size))
            raise KeyboardInterrupt
        return real_recv(fd)

    launch.warm_up()
    pool.recv = recv_cut_once  # the pool reads the zygote's stream through this name
    try:
        launch.spawn(sleeper, world_size=2, timeout=600)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    pool.recv = real_recv
    assert launch.spawn(healthy, world_size=2) == [0, 1]
    print("next call fine", flush=True)
    """
)


def test_an_interrupt_between_a_message_length_and_its_body_does_not_hang_the_next_call(tmp_path):
    # Before the pool closed its zygote on an interrupt, the clean-up read the rest of the
    # cut message as a new length and blocked for ever.
    stdout = _script(CUT_MESSAGE, tmp_path, timeout=60)
    assert "interrupted" in stdout and "next call fine" in stdout
