"""The workshop hub, end to end: real Unix users, PAM, Slurm jobs, Chromium, nbgrader.

docs/instructors.md section 7 is run block by block, as written (blocks marked
``<!-- run as: admin (hub) -->``), after sections 1 and 2 (the exchange, the course
with lab 0 released). Then two learners sign in at once, each in their own Chromium:
each gets a JupyterLab that is a Slurm job of theirs in the ``workbook`` partition,
opens lab 0, runs its first cells, presses Validate (one has typed the answers,
one has not) and submits from the Assignment List. One learner's requests to the
other's server are refused. The instructor opens the formgrader through the hub,
collects, autogrades, and reads full marks for one and zero for the other. Last,
``make hub-down``: no hub process and no hub job is left, and the learners' work is.

Users are ``hub{role}{tag}`` (test_classroom's are ``pdl...``); the hub's state, the
exchange and the class list live in /tmp/pdl-hub-<tag>, removed afterwards. Times
from sign-in to a ready JupyterLab are printed (run with -s to see them).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil
import pytest
import requests
from test_validate_button import SUCCESS, _type_answers, _validate
from unixusers import searchable

ROOT = Path(__file__).resolve().parents[2]
BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
BLOCK = re.compile(r"<!-- run as: ([a-z, ]+) -->\s*\n```bash\n(.*?)```", re.S)
HUB_BLOCK = re.compile(r"<!-- run as: admin \(hub\) -->\s*\n```bash\n(.*?)```", re.S)
COURSE = "pdl-workbook"
CHROMIUM = "/usr/bin/chromium"  # as in conftest.py (each learner's thread starts its own)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users and runs a hub: run as root"),
]


def _run(user: str | None, commands: str, env: dict) -> str:
    """A guide's block, as written, as root (user None) or as a fresh login of ``user``."""
    script = "set -euo pipefail\n" + commands
    if user is None:
        cmd, run_env = ["bash", "-c", script], {**os.environ, **env}
    else:
        home = f"/home/{user}"
        cmd = ["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", f"USER={user}",
               "PATH=/usr/local/bin:/usr/bin:/bin", *(f"{k}={v}" for k, v in env.items()),
               "bash", "-c", f"cd {home}\n{script}"]  # fmt: skip
        run_env = None
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=run_env)
    assert done.returncode == 0, f"as {user or 'root'}:\n{commands}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass
class Hub:
    url: str
    env: dict
    names: dict  # role -> Unix name
    passwords: dict  # Unix name -> password
    state: Path
    down_block: str

    def tag(self) -> str:
        return "pdl-hub-" + (self.state / "hub-id").read_text().strip()

    def jobs(self) -> list[list[str]]:
        """[job id, user, partition, state] of every queued or running job of this hub."""
        out = subprocess.run(["squeue", "-h", "-o", "%i %u %P %T %k"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        return [ln.split()[:4] for ln in out.splitlines() if ln.split()[4:] == [self.tag()]]


@pytest.fixture(scope="module")
def hub():
    tag = secrets.token_hex(2)
    top = Path(f"/tmp/pdl-hub-{tag}")
    top.mkdir(mode=0o755)
    names = {role: f"hub{role}{tag}" for role in ("teach", "ann", "ben")}
    passwords = {n: secrets.token_urlsafe(12) for n in names.values()}
    with searchable(BASE_PYTHON, Path(sys.prefix)):
        try:
            for name, password in passwords.items():
                subprocess.run(["useradd", "-m", "-K", "HOME_MODE=0700", "-s", "/bin/bash", name],
                               check=True)  # fmt: skip
                subprocess.run(["chpasswd"], input=f"{name}:{password}", text=True, check=True)
            (top / "class.txt").write_text(
                f"{names['teach']} instructor\n{names['ann']} learner\n{names['ben']}  # a learner\n"
            )
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = {
                "WORKBOOK": str(ROOT),
                "NBGRADER_EXCHANGE": str(top / "exchange"),
                "HUB_CLASS": str(top / "class.txt"),
                "WORKBOOK_HUB_STATE": str(top / "state"),
                "HUB_URL": f"http://127.0.0.1:{port}",
            }
            guide = (ROOT / "docs" / "instructors.md").read_text()
            inst = BLOCK.findall(guide)
            up, down = HUB_BLOCK.findall(guide)
            _run(None, inst[0][1], env)  # section 1: the exchange
            _run(names["teach"], inst[1][1], env)  # section 2: the course, lab 0 released
            t0 = time.monotonic()
            print(_run(None, up, env))  # section 7: make hub
            print(f"hub up in {time.monotonic() - t0:.1f} s")
            yield Hub(env["HUB_URL"], env, names, passwords, top / "state", down)
        finally:
            subprocess.run(["bash", "-c", "cd $WORKBOOK && make hub-down"], env={**os.environ, **env},
                           capture_output=True)  # fmt: skip
            for name in names.values():
                subprocess.run(["pkill", "-KILL", "-u", name], check=False)
                subprocess.run(["userdel", "-r", name], check=False, capture_output=True)
            shutil.rmtree(top, ignore_errors=True)


def _sign_in(page, hub: Hub, name: str, next_url: str = "") -> float:
    page.goto(f"{hub.url}/hub/login" + (f"?next={next_url}" if next_url else ""))
    page.fill("#username_input", name)
    page.fill("#password_input", hub.passwords[name])
    t0 = time.monotonic()
    page.click("#login_submit")
    return t0


def _learner(hub: Hub, name: str, answer: bool) -> dict:
    """One learner in a Chromium of their own (Playwright's sync API: one per thread)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        t0 = _sign_in(page, hub, name)
        page.wait_for_selector(".jp-LauncherCard, .jp-DirListing-item", timeout=120_000)
        ready = time.monotonic() - t0
        lab = f"{COURSE}/lab0/lab0.ipynb"  # fetched beside the server (hub_job prepare)
        deadline, home = time.monotonic() + 60, Path("/home") / name
        while "fetched: lab0" not in "".join(p.read_text() for p in home.glob(".jupyterlab-*.log")):
            assert time.monotonic() < deadline, f"lab 0 never reached {name}'s home"
            time.sleep(0.2)
        assert (home / lab).is_file()
        fetched = time.monotonic() - t0
        page.goto(f"{hub.url}/user/{name}/lab/tree/{lab}")
        try:
            return {"ready": ready, "fetched": fetched, **_work_on_lab0(page, answer)}
        except Exception:
            (ROOT / "build" / "test-artefacts").mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ROOT / "build" / "test-artefacts" / f"hub-{name}-failed.png"))
            raise
        finally:
            browser.close()


def _work_on_lab0(page, answer: bool) -> dict:
    """Run the first cells, answer (or not), Validate, and submit from the Assignment List."""
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    # The kernel's name and "Idle" in the status bar: connected (the indicator alone can be
    # idle before a kernel exists; a cell run then asks which kernel to start).
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle")).first.wait_for(
        timeout=120_000
    )
    no_news = page.get_by_role("button", name="No", exact=True)
    if no_news.count():
        no_news.first.click()
    cells = page.locator(".jp-Notebook .jp-Cell")
    for i, count in ((2, "[1]"), (3, "[2]")):  # the parameters, then the set-up (torch, ranks)
        cells.nth(i).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+Enter")
        cells.nth(i).locator(".jp-InputArea-prompt", has_text=count).wait_for(timeout=120_000)
    released = nbformat.read(ROOT / "labs" / "lab0" / "lab0.ipynb", as_version=4)
    solution = nbformat.read(ROOT / "solutions" / "lab0" / "lab0.ipynb", as_version=4)
    if answer:
        _type_answers(page, released, solution)
    verdict = _validate(page)  # Validate saves the notebook first (a second save would race it)
    _close_dialogs(page)
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Assignment List").first.click()
    submit = page.locator("#fetched_assignments_list button", has_text="Submit").first
    submit.wait_for(timeout=60_000)
    _close_dialogs(page)
    submit.click()
    # nbgrader validates what it submits and shows the failures (it submits all the same).
    done = page.locator("#submitted_assignments_list .list_item").first
    dialog = page.locator(".jp-Dialog").first
    done.or_(dialog).wait_for(timeout=120_000)
    _close_dialogs(page)
    done.wait_for(timeout=60_000)
    return {"verdict": verdict, "menus": page.locator(".lm-MenuBar-itemLabel").all_text_contents()}


def _close_dialogs(page) -> None:
    """Close every JupyterLab dialog on screen (nbgrader's results and successes)."""
    for _ in range(5):
        dialog = page.locator(".jp-Dialog")
        if not dialog.count():
            return
        dialog.first.locator(".jp-Dialog-button").last.click()
        time.sleep(0.3)


def _server_token(name: str) -> str:
    for p in psutil.process_iter(["username", "cmdline"]):
        if p.info["username"] == name and "jupyterhub-singleuser" in " ".join(p.info["cmdline"]):
            return p.environ()["JUPYTERHUB_API_TOKEN"]
    raise AssertionError(f"no JupyterLab process of {name}")


def _check_isolation(hub: Hub, ann: str, ben: str) -> None:
    """Each server listens where the proxy reaches it only, and serves its owner only."""
    learners = {ann, ben}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid:
            owner = psutil.Process(conn.pid).username()
            if owner in learners:
                assert conn.laddr.ip == "127.0.0.1", f"{owner}'s process listens on {conn.laddr}"
    token = _server_token(ann)
    api = f"{hub.url}/hub/api"
    # Ann's server token reaches Ben's server neither directly nor through the hub's API.
    r = requests.get(
        f"{hub.url}/user/{ben}/api/status", headers={"Authorization": f"token {token}"}
    )
    assert r.status_code == 403, (r.status_code, r.text[:200])
    r = requests.get(f"{api}/users/{ben}", headers={"Authorization": f"token {token}"})
    assert r.status_code in (403, 404), (r.status_code, r.text[:200])
    # batchspawner's callback takes the port, never a spawner setting (hub_spawner).
    bad = {"port": 1234, "exec_prefix": ""}
    r = requests.post(f"{api}/batchspawner", json=bad, headers={"Authorization": f"token {token}"})
    assert r.status_code == 400, (r.status_code, r.text[:200])


def _grade(page, hub: Hub) -> dict[str, str]:
    """The instructor: formgrader (a hub service), collect, autograde; {learner: score}."""
    base = f"/services/{COURSE}/formgrader"
    _sign_in(page, hub, hub.names["teach"], next_url=f"{base}/manage_assignments")
    page.locator("td.collect a").first.click()
    page.locator(".modal-dialog", has_text="Successfully collected").wait_for(timeout=60_000)
    page.goto(f"{hub.url}{base}/manage_submissions/lab0")
    rows = page.locator("#main-table tr:has(td.autograde)")
    rows.first.wait_for(timeout=30_000)
    for i in range(rows.count()):
        rows.nth(i).locator("td.autograde a").click()
        page.locator(".modal-dialog", has_text="Successfully autograded").wait_for(timeout=240_000)
        page.locator(".modal-dialog button", has_text="OK").first.click()
    page.reload()
    page.locator("td.score", has_text="/").nth(rows.count() - 1).wait_for(timeout=30_000)
    return {
        rows.nth(i).locator("td.student-id").inner_text(): rows.nth(i)
        .locator("td.score")
        .inner_text()
        for i in range(rows.count())
    }


def test_two_learners_each_a_slurm_job_and_the_instructor_grades(hub, page):
    ann, ben = hub.names["ann"], hub.names["ben"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {
            ann: pool.submit(_learner, hub, ann, True),
            ben: pool.submit(_learner, hub, ben, False),
        }
        jobs_while_working = None
        while not all(f.done() for f in runs.values()):
            jobs = hub.jobs()
            if len(jobs) == 2 and all(state == "RUNNING" for *_, state in jobs):
                jobs_while_working = jobs
            time.sleep(0.5)
        got = {name: f.result() for name, f in runs.items()}
    for name, run in got.items():
        print(f"{name}: sign-in to a ready JupyterLab {run['ready']:.1f} s, lab 0 in the home "
              f"at {run['fetched']:.1f} s")  # fmt: skip
        assert run["ready"] < 60, f"{name} waited {run['ready']:.0f} s for JupyterLab"
        assert "Nbgrader" in run["menus"], run["menus"]
    assert SUCCESS in got[ann]["verdict"], got[ann]["verdict"]
    assert SUCCESS not in got[ben]["verdict"], got[ben]["verdict"]
    # Each learner's JupyterLab was a running job of theirs, in the workbook partition.
    assert jobs_while_working is not None, "never saw both JupyterLab jobs in the queue"
    assert sorted((u, p, s) for _, u, p, s in jobs_while_working) == [
        (ann, "workbook", "RUNNING"),
        (ben, "workbook", "RUNNING"),
    ]
    _check_isolation(hub, ann, ben)
    scores = _grade(page, hub)
    print(f"formgrader scores: {scores}")
    full, out_of = scores[ann].split(" / ")
    assert float(full) == float(out_of) > 0, scores
    assert float(scores[ben].split(" / ")[0]) == 0, scores


def test_hub_down_stops_every_hub_process_and_job(hub):
    ben = hub.names["ben"]
    if not hub.jobs():  # run alone: sign Ben in by script (the _xsrf cookie, OAuth redirects)
        s = requests.Session()
        s.get(f"{hub.url}/hub/login").raise_for_status()
        form = {"username": ben, "password": hub.passwords[ben], "_xsrf": s.cookies["_xsrf"]}
        s.post(f"{hub.url}/hub/login", data=form).raise_for_status()
        deadline = time.monotonic() + 120
        while s.get(f"{hub.url}/user/{ben}/lab").url.rstrip("/").endswith("/lab") is False:
            assert time.monotonic() < deadline, "Ben's JupyterLab did not start"
            time.sleep(1)
    assert hub.jobs(), "no hub job to stop"
    users = set(hub.names.values())
    hub_pid = int((hub.state / "run" / "jupyterhub.pid").read_text())
    tree = [hub_pid, *(c.pid for c in psutil.Process(hub_pid).children(recursive=True))]
    assert len(tree) >= 3, "expected the hub, its proxy and its formgrader service"
    t0 = time.monotonic()
    print(_run(None, hub.down_block, hub.env))
    print(f"make hub-down: {time.monotonic() - t0:.1f} s")
    assert hub.jobs() == [], hub.jobs()
    left = [p for p in psutil.process_iter(["username", "cmdline"]) if p.info["username"] in users]
    assert not left, [(p.pid, p.info["username"], p.info["cmdline"]) for p in left]
    alive = [pid for pid in tree if psutil.pid_exists(pid)]
    assert not alive, [psutil.Process(pid).cmdline() for pid in alive]
    assert not (hub.state / "run" / "jupyterhub.pid").exists()
    assert (Path("/home") / ben / COURSE / "lab0" / "lab0.ipynb").is_file(), "Ben's lab is gone"
