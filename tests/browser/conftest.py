"""A real JupyterLab and a real browser, for tests that click what a learner clicks.

Fixtures (reuse them for any notebook or lab, e.g. pressing nbgrader's Validate button):

    lab_server   session: JupyterLab from the venv on a free port with a random token,
                 serving a temporary root directory; ``lab_server.copy(src, params)``
                 copies a notebook there with its parameters cell changed (SMOKE=True).
    browser      session: Debian's /usr/bin/chromium driven by Python Playwright
                 (``playwright install`` cannot download browsers here).
    page         a fresh page that records console errors in ``page.console_errors``.
    lab          helpers bound to the page: ``lab.open(name)``, ``lab.run_all()``,
                 ``lab.wait_for_text(text)``, ``lab.screenshot(locator, name)``.

Screenshots go to build/test-artefacts/. Every test here is marked ``browser``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTEFACTS = REPO / "build" / "test-artefacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def pytest_configure(config):
    # also declared in pyproject.toml; repeated here so the marker exists in any checkout
    config.addinivalue_line("markers", "browser: drives JupyterLab in chromium (Playwright)")


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.browser)


@dataclass
class LabServer:
    url: str
    token: str
    root: Path
    log: Path

    def copy(self, src: str | Path, params: dict | None = None) -> str:
        """Copy a notebook into the server's root, setting parameters; returns its name."""
        import nbformat

        nb = nbformat.read(REPO / src, as_version=4)
        for cell in nb.cells:
            if "parameters" in cell.metadata.get("tags", []):
                for key, value in (params or {}).items():
                    cell.source += f"\n{key} = {value!r}  # set by the browser test"
        name = Path(src).name
        nbformat.write(nb, self.root / name)
        return name

    def page_url(self, name: str) -> str:
        # A fresh workspace for every page: JupyterLab restores the tabs a workspace had
        # open, so a notebook left open by an earlier test would sit (hidden) beside this
        # one and `.validate-button` could press *its* Validate.
        workspace = f"test-{secrets.token_hex(4)}"
        return f"{self.url}/lab/workspaces/{workspace}/tree/{name}?reset&token={self.token}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, token: str, proc: subprocess.Popen, log: Path, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                json.load(r)
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer in {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-root")
    port, token = _free_port(), secrets.token_hex(16)
    log = root.parent / f"jupyterlab-{port}.log"
    cmd = [
        str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser",
        f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}", "--LabApp.news_url=",
    ]  # fmt: skip
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    with open(log, "w") as out:
        # setsid: the server and its kernels form their own process group, stopped together below
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, token, proc, log)
        yield LabServer(url, token, root, log)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.console_errors = []
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
    pg.on("pageerror", lambda e: pg.console_errors.append(f"page error: {e}"))
    yield pg
    context.close()


class Lab:
    """What a learner does in JupyterLab, as Playwright steps."""

    def __init__(self, page, server: LabServer):
        self.page, self.server = page, server

    def open(self, name: str, timeout: float = 60_000) -> None:
        self.page.goto(self.server.page_url(name))
        self.page.wait_for_selector(".jp-Notebook", timeout=timeout)
        self.dismiss_news()
        self.wait_idle(timeout)

    def dismiss_news(self) -> None:
        no = self.page.get_by_role("button", name="No", exact=True)
        if no.count():
            no.first.click()

    def wait_idle(self, timeout: float = 60_000) -> None:
        self.page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=timeout
        )

    def menu(self, menu: str, command: str) -> None:
        self.page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
        self.page.locator(f".lm-Menu-item[data-command='{command}']").click()

    def run_all(self) -> None:
        self.menu("Run", "runmenu:run-all")

    def wait_for_text(self, text: str, timeout: float = 120_000):
        loc = self.page.locator(".jp-OutputArea-output", has_text=text).first
        loc.wait_for(timeout=timeout)
        return loc

    def kernel_status(self) -> str:
        indicator = self.page.locator(".jp-Notebook-ExecutionIndicator").first
        return indicator.get_attribute("data-status") if indicator.count() else "(no indicator)"

    def start_run_all(self, attempts: int = 3) -> None:
        """Run All, and check that the cells really started.

        Run All acts on the *current* notebook. Under load the tab can be on screen
        before JupyterLab has made it current; the menu command then does nothing and
        a test would wait for a run that never began. So: click into the notebook
        first, and retry if no prompt shows [*] or a number within 30 s.
        """
        started = """() => [...document.querySelectorAll('.jp-InputArea-prompt')]
                         .some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))"""
        for attempt in range(attempts):
            self.page.locator(".jp-Notebook .jp-Cell").first.click()
            self.run_all()
            try:
                self.page.wait_for_function(started, timeout=30_000)
                return
            except Exception:
                if attempt == attempts - 1:
                    raise

    def run_to_the_end(self, name: str, last_line: str, timeout: float = 300_000) -> None:
        """Open ``name``, Run All, and wait until an output shows ``last_line``.

        On a timeout or a cell that raised: a full-page screenshot in build/test-artefacts/, and the error
        names the last stderr outputs, the kernel's status and the console's last lines.
        """
        self.open(name)
        self.start_run_all()
        done = self.page.locator(".jp-OutputArea-output", has_text=last_line)
        # A cell that raised: no later cell runs, so stop waiting at once.
        raised = self.page.locator(
            ".jp-OutputArea-output[data-mime-type*='stderr']", has_text="Traceback"
        )
        try:
            done.or_(raised).first.wait_for(timeout=timeout)
            if not done.count():
                raise AssertionError("a cell raised")
        except Exception as e:
            shot = self.artefact(f"{Path(name).stem}_failed.png")
            self.page.screenshot(path=str(shot), full_page=True)
            stderr = self.page.locator(".jp-OutputArea-output[data-mime-type*='stderr']")
            errors = stderr.all_text_contents()
            console = getattr(self.page, "console_log", [])[-10:]
            raise AssertionError(
                f"{name} did not finish in the browser: {errors[-3:]}; kernel "
                f"{self.kernel_status()}; console: {console}; screenshot: {shot}"
            ) from e
        self.wait_idle()

    def artefact(self, name: str) -> Path:
        """A path in build/test-artefacts/, kept after the run for a person to look at."""
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        return ARTEFACTS / name

    def screenshot(self, locator, name: str) -> Path:
        path = self.artefact(name)
        locator.screenshot(path=str(path))
        return path


@pytest.fixture
def lab(page, lab_server):
    return Lab(page, lab_server)
