"""Inside a learner's JupyterLab job (the hub's sbatch script, helpers.course.hub.workshop.job_script).

    python -m helpers.course.hub.job serve jupyterhub-singleuser
        start the JupyterLab on a free port of the address this node reaches the hub
        from, and tell the hub that port once the server listens;
    python -m helpers.course.hub.job prepare --course COURSE
        fetch every released lab the learner has not fetched yet (nbgrader).

``serve`` replaces batchspawner-singleuser, which listens on every interface
(0.0.0.0) and reports its port before the server has even imported: the hub then
polls an empty port with growing back-offs (0.2, 0.4, ... 3.2 s) and may notice a
ready JupyterLab seconds late. Here the server listens only on the interface that
faces the hub (the one its proxy connects to), and the hub hears of it when it answers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse, urlunparse


def facing_address(url: str) -> str:
    """The local address this host uses to reach ``url``'s host (no packet is sent)."""
    host = urlparse(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def report_port_when_listening(address: str, port: int, server_pid: int, env: dict) -> None:
    """Wait until ``address:port`` accepts connections, then tell the hub the port."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except OSError:
            return  # the server died: the hub sees the job end
        try:
            socket.create_connection((address, port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    request = urllib.request.Request(
        env["JUPYTERHUB_API_URL"].rstrip("/") + "/batchspawner",
        data=json.dumps({"port": port}).encode(),
        headers={"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=30).close()


def serve(command: list[str]) -> None:
    """Exec ``command`` (jupyterhub-singleuser) as this process; a child reports its port."""
    env = os.environ
    address = facing_address(env["JUPYTERHUB_API_URL"])
    port = free_port(address)
    url = urlparse(env["JUPYTERHUB_SERVICE_URL"])
    env["JUPYTERHUB_SERVICE_URL"] = urlunparse(url._replace(netloc=f"{address}:{port}"))
    server_pid = os.getpid()
    if os.fork() == 0:  # the reporter; the server keeps this process's pid
        try:
            report_port_when_listening(address, port, server_pid, dict(env))
        finally:
            os._exit(0)
    os.execvp(command[0], command)


def prepare(course: str, exchange: str) -> list[str]:
    """Fetch every lab released in ``course`` that this learner has not fetched yet.

    The released labs are the folders of the exchange's outbound/ (readable by all);
    ``nbgrader fetch_assignment`` checks that the learner takes the course.
    """
    outbound = Path(exchange) / course / "outbound"
    fetched = []
    for lab in sorted(p.name for p in outbound.glob("*") if p.is_dir()):
        if not Path(course, lab).exists():
            cmd = [sys.executable, "-m", "nbgrader", "fetch_assignment", lab]
            if subprocess.run(cmd, capture_output=True).returncode == 0:
                fetched.append(lab)
    return fetched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.course.hub.job")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve").add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("prepare").add_argument("--course", default="pdl-workbook")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        serve(args.command)  # does not return
    exchange = os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")
    print("fetched:", " ".join(prepare(args.course, exchange)) or "nothing new")
    return 0


if __name__ == "__main__":
    sys.exit(main())
