"""The instructor workflow end to end, with real Unix users on a shared filesystem.

An administrator, an instructor and two learners are created with useradd. The
command blocks of docs/instructors.md and docs/learners.md marked
``<!-- run as: ... -->`` are run as written, as those users, in the guides'
order: exchange set-up, release, fetch, submit (one correct notebook, one that is
not even JSON), collect, autograde, feedback, export. Then the grades, the
feedback and the permissions are checked.

The class installation ($WORKBOOK) is built here the way a site would: readable
by everyone, on an interpreter every user can run. This checkout's interpreter
may live under /root (pyenv): for the test, its ancestors get the search bit
(o+x, not o+r) and lose it again afterwards.
"""

from __future__ import annotations

import csv
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from unixusers import searchable

from helpers.course.grading import roundtrip as grading

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- run as: ([a-z, ]+) -->\s*\n```bash\n(.*?)```", re.S)
BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable)).resolve()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users: run as root (CI does)"),
]


def blocks(doc: str) -> list[tuple[str, str]]:
    """(who, commands) for every runnable block of a guide, in order."""
    return [(who.strip(), body) for who, body in BLOCK.findall((ROOT / doc).read_text())]


def _install(dest: Path) -> Path:
    """A class installation: the workbook's files and a venv on a system interpreter."""
    for part in ("helpers", "solutions", "labs", "slurm"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("nbgrader_config.py", "pyproject.toml"):
        shutil.copy(ROOT / f, dest / f)
    venv = dest / ".venv"
    subprocess.run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sys.prefix) / "lib" / "python3.11" / "site-packages"
    (venv / "lib" / "python3.11" / "site-packages" / "workbook.pth").write_text(f"{dest}\n{site}\n")
    # nbconvert's templates (generate_feedback) and kernel specs live in share/jupyter.
    (venv / "share").mkdir(exist_ok=True)
    (venv / "share" / "jupyter").symlink_to(Path(sys.prefix) / "share" / "jupyter")
    for tool, module in (("nbgrader", "nbgrader"), ("jupyter", "jupyter"), ("alembic", "alembic")):
        script = venv / "bin" / tool
        script.write_text(f'#!/bin/sh\nexec "{venv}/bin/python" -m {module} "$@"\n')
        script.chmod(0o755)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o555 if path.is_dir() else path.stat().st_mode | 0o444)
    return dest


class Users:
    def __init__(self, tag: str):
        self.names = {role: f"pdl{role[:5]}{tag}" for role in ("instructor", "alice", "bob")}
        self.made: list[str] = []

    def create(self) -> None:
        for name in self.names.values():
            subprocess.run(["useradd", "-m", "-K", "HOME_MODE=0700", "-s", "/bin/bash", name],
                           check=True)  # fmt: skip
            self.made.append(name)

    def remove(self) -> None:
        for name in self.made:
            subprocess.run(["pkill", "-KILL", "-u", name], check=False)
            subprocess.run(["userdel", "-r", name], check=False, capture_output=True)

    def home(self, role: str) -> Path:
        return Path("/home") / self.names[role]


def _run(user: str | None, commands: str, env: dict) -> subprocess.CompletedProcess:
    script = "set -euo pipefail\n" + commands
    run_env = None
    if user is None:  # the administrator: root
        cmd = ["bash", "-c", script]
        run_env = {**os.environ, **env}
    else:
        home = f"/home/{user}"
        cmd = ["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", f"USER={user}",
               "PATH=/usr/local/bin:/usr/bin:/bin", *(f"{k}={v}" for k, v in env.items()),
               "bash", "-c", f"cd {home}\n{script}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=run_env)
    assert done.returncode == 0, f"as {user or 'root'}:\n{commands}\n{done.stdout}\n{done.stderr}"
    return done


def _as(user: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True)


def test_release_fetch_submit_collect_autograde_feedback_export(tmp_path_factory):
    tag = secrets.token_hex(2)
    top = Path(f"/tmp/pdl-class-{tag}")
    top.mkdir(mode=0o755)
    users = Users(tag)
    with searchable(BASE_PYTHON, Path(sys.prefix)):
        _classroom(top, users)


def _classroom(top: Path, users: Users) -> None:
    try:
        install = _install(top / "workbook")
        env = {"WORKBOOK": str(install), "NBGRADER_EXCHANGE": str(top / "exchange")}
        users.create()
        teacher, learners = users.names["instructor"], [users.names["alice"], users.names["bob"]]
        inst, learn = blocks("docs/instructors.md"), blocks("docs/learners.md")
        assert [w for w, _ in inst] == ["admin", "instructor", "instructor"], inst
        assert [w for w, _ in learn] == ["learner", "learner", "learner", "learner, after grading"]

        _run(None, inst[0][1], env)  # the exchange
        _run(teacher, inst[1][1], env)  # course directory, generate, release
        for who in learners:
            _run(who, learn[0][1], env)  # config and learner tools
            _run(who, learn[1][1], env)  # fetch
        _answer(users, install)
        for who in learners:
            _run(who, learn[2][1], env)  # submit
        _run(teacher, inst[2][1], env)  # collect, autograde, feedback, export
        for who in learners:
            _run(who, learn[3][1], env)  # fetch feedback

        _check_grades(users)
        _check_feedback_hides_hidden_tests(users)
        _check_privacy(users, env)
        shown = _as(
            learners[0], f"{install}/.venv/bin/python", "-m", "helpers.course.grading.roles", "show"
        )
        assert "for this user: learner" in shown.stdout, shown.stdout + shown.stderr
    finally:
        users.remove()
        shutil.rmtree(top, ignore_errors=True)


def _answer(users: Users, install: Path) -> None:
    """Alice answers every cell as the solution does; Bob's notebook is not even JSON."""
    solution = nbformat.read(install / "solutions" / "lab0" / "lab0.ipynb", as_version=4)
    alice = users.home("alice") / "lab0" / "lab0.ipynb"
    released = nbformat.read(alice, as_version=4)
    nbformat.write(grading.fill_in(released, solution, {}), alice)
    bob = users.home("bob") / "lab0" / "lab0.ipynb"
    bob.write_text('{"cells": [ this is not a notebook')
    for who, path in (("alice", alice), ("bob", bob)):
        shutil.chown(path, users.names[who], users.names[who])


def _check_grades(users: Users) -> None:
    rows = list(csv.DictReader((users.home("instructor") / "pdl-course" / "grades.csv").open()))
    by = {r["student_id"]: r for r in rows if r["assignment"] == "lab0"}
    alice, bob = by[users.names["alice"]], by[users.names["bob"]]
    assert float(alice["max_score"]) > 0
    assert float(alice["score"]) == float(alice["max_score"]), alice
    assert float(bob["score"]) == 0.0, bob


def _check_feedback_hides_hidden_tests(users: Users) -> None:
    pages = list((users.home("alice") / "lab0" / "feedback").rglob("*.html"))
    assert pages, "Alice fetched no feedback"
    html = pages[0].read_text()
    solution = nbformat.read(ROOT / "solutions" / "lab0" / "lab0.ipynb", as_version=4)
    for cell in solution.cells:
        if "### BEGIN HIDDEN TESTS" in cell.source:
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            for line in (ln.strip() for ln in hidden.splitlines()):
                if len(line) > 25:
                    assert line not in html, f"a hidden test line reached the feedback: {line}"


def _check_privacy(users: Users, env: dict) -> None:
    alice = users.names["alice"]
    inbound = Path(env["NBGRADER_EXCHANGE"]) / "pdl-workbook" / "inbound"
    assert _as(alice, "ls", str(inbound)).returncode != 0, "a learner can list every submission"
    bob_work = users.home("bob") / "lab0" / "lab0.ipynb"
    assert _as(alice, "cat", str(bob_work)).returncode != 0, "a learner can read a classmate's lab"
    hidden = users.home("instructor") / "pdl-course" / "solutions" / "lab0" / "lab0.ipynb"
    assert _as(alice, "cat", str(hidden)).returncode != 0, "a learner can read the hidden tests"
