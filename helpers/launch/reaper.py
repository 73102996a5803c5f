"""A guard between a launcher and torchrun: no rank outlives the launcher.

    python -m helpers.launch.reaper -- torchrun ... prog.py

helpers.launch.run() starts torchrun through this small process, in a session
of its own, with a pipe on its stdin. The reaper starts the command (which
inherits stdout and stderr), then waits. It stops the command's whole process
tree (SIGTERM to torchrun, then SIGKILL to every rank) when

* its stdin reaches end-of-file: the launcher exited, crashed, was killed with
  SIGKILL, or its Jupyter kernel was restarted; the pipe closes in every case;
* it receives SIGTERM or SIGINT: the launcher asks it to stop (timeout, Ctrl-C).

On Linux it is also the ranks' "child subreaper", so ranks whose torchrun died
are re-parented to it and still found. It exits with the command's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from helpers.launch.procs import descendants, stop_tree

GRACE_S = 3.0  # seconds torchrun gets to stop its ranks after SIGTERM


def _become_subreaper() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv or not argv[argv.index("--") + 1 :]:
        raise SystemExit("usage: python -m helpers.launch.reaper -- COMMAND [ARGS...]")
    cmd = argv[argv.index("--") + 1 :]
    _become_subreaper()
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_stdin():
        # Unbuffered reads of fd 0: the launcher never writes, so EOF means it is gone.
        while os.read(0, 4096):
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    seen: dict[int, object] = {}
    while child.poll() is None and not stop.wait(0.25):
        seen.update({p.pid: p for p in descendants(child.pid)})  # ranks, while still attached
    if child.poll() is None:  # asked to stop: torchrun gets SIGTERM and stops its ranks
        child.terminate()
        try:
            child.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    # Whatever is left below us (ranks re-parented to this subreaper included) is killed.
    # The child itself is reaped by Popen, never by psutil, so its exit code is kept.
    left = [p for p in [*seen.values(), *descendants(os.getpid())] if p.pid != child.pid]
    stop_tree(child.pid, known=left, include_root=False)
    if child.poll() is None:
        child.kill()
    return child.wait()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the stdin watcher may still be blocked in read(): do not wait for it
