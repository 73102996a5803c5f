"""The workshop hub: JupyterHub on the cluster, each learner's JupyterLab a Slurm job.

``make hub`` (slurm/hub/start.sh) runs JupyterHub with ``slurm/hub/jupyterhub_config.py``,
which reads everything it needs from here:

    settings_from_env()   where the hub keeps its state, the class list, the profile,
                          the address, the course, and what each JupyterLab job asks for
    read_class(path)      the class list: one Unix user a line, ``learner`` or ``instructor``
    job_script(...)       the sbatch script of one JupyterLab (a batchspawner template)
    write_configs(...)    the Jupyter configuration every hub server reads, and the one
                          that leaves learners the learner tools only

``python -m helpers.course.hub check`` says what would stop a class from working.
What runs inside a learner's job is in helpers.course.hub.job.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from helpers.cluster.jobscript import check_time
from helpers.cluster.profiles import load_profile
from helpers.course.grading.roles import INSTRUCTOR_PLUGINS, INSTRUCTOR_SERVER_EXTENSIONS

ROLES = ("learner", "instructor")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_MEM = re.compile(r"\d+[KMGT]?")


@dataclass(frozen=True)
class HubSettings:
    """What ``make hub`` is asked for (environment variables; see docs/instructors.md)."""

    state: Path  # WORKBOOK_HUB_STATE: database, cookie secret, logs, pid files
    class_list: Path  # HUB_CLASS
    profile: str = "local"  # HUB_PROFILE: the cluster profile the JupyterLab jobs use
    url: str = "http://127.0.0.1:8000"  # HUB_URL: where learners sign in
    api_address: str = "127.0.0.1"  # HUB_API_ADDRESS: where jobs reach the hub
    course: str = "pdl-workbook"  # HUB_COURSE: the nbgrader course id
    course_dir: str = ""  # HUB_COURSE_DIR: default ~<first instructor>/pdl-course
    exchange: str = "/srv/nbgrader/exchange"  # NBGRADER_EXCHANGE
    cpus: int = 1  # HUB_CPUS per JupyterLab
    memory: str = ""  # HUB_MEM per JupyterLab (Slurm's --mem, e.g. 8G); "" = the default
    time: str = "01:30:00"  # HUB_TIME: a JupyterLab's wall-clock limit
    reservation: str = ""  # HUB_RESERVATION: a Slurm reservation for the workshop

    def check(self) -> HubSettings:
        """Raise ValueError, naming the variable to change, for a value Slurm would reject."""
        try:
            check_time(self.time)
        except ValueError as e:
            raise ValueError(f"HUB_TIME: {e}") from None
        if self.cpus < 1:
            raise ValueError(f"HUB_CPUS must be at least 1, got {self.cpus}")
        if self.memory and not _MEM.fullmatch(self.memory):
            raise ValueError(f"HUB_MEM={self.memory!r}: use Slurm's form, e.g. 4G or 4000M")
        if self.reservation and not re.fullmatch(r"[A-Za-z0-9_.-]+", self.reservation):
            raise ValueError(f"HUB_RESERVATION={self.reservation!r} is not a reservation name")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.course):
            raise ValueError(f"HUB_COURSE={self.course!r}: letters, digits, _ . - only")
        if urlparse(self.url).scheme not in ("http", "https"):
            raise ValueError(f"HUB_URL={self.url!r}: give http://ADDRESS:PORT")
        return self


def settings_from_env(env=None) -> HubSettings:
    env = os.environ if env is None else env
    if not env.get("HUB_CLASS"):
        raise ValueError(
            "no class list: set HUB_CLASS=/path/to/class.txt (one user a line, "
            "'NAME learner' or 'NAME instructor'; see slurm/hub/class.example.txt)"
        )
    d = HubSettings(Path("."), Path("."))
    return HubSettings(
        state=Path(env.get("WORKBOOK_HUB_STATE", "/var/lib/workbook-hub")),
        class_list=Path(env["HUB_CLASS"]),
        profile=env.get("HUB_PROFILE", d.profile),
        url=env.get("HUB_URL", d.url),
        api_address=env.get("HUB_API_ADDRESS", d.api_address),
        course=env.get("HUB_COURSE", d.course),
        course_dir=env.get("HUB_COURSE_DIR", ""),
        exchange=env.get("NBGRADER_EXCHANGE", d.exchange),
        cpus=int(env.get("HUB_CPUS", d.cpus)),
        memory=env.get("HUB_MEM", d.memory),
        time=env.get("HUB_TIME", d.time),
        reservation=env.get("HUB_RESERVATION", d.reservation),
    ).check()


def read_class(path: Path) -> dict[str, list[str]]:
    """{"learner": [...], "instructor": [...]} from a class list; every name a Unix user."""
    roles: dict[str, list[str]] = {r: [] for r in ROLES}
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        name, role = line[0], (line[1] if len(line) > 1 else "learner")
        where = f"{path}, line {n}"
        if not _USER.fullmatch(name) or role not in ROLES or len(line) > 2:
            raise ValueError(f"{where}: {raw.strip()!r}; write 'NAME learner' or 'NAME instructor'")
        try:
            pwd.getpwnam(name)
        except KeyError:
            raise ValueError(
                f"{where}: no Unix user {name!r}: create it (useradd -m {name})"
            ) from None
        roles[role].append(name)
    if not roles["instructor"]:
        raise ValueError(f"{path}: name at least one instructor (the formgrader runs as the first)")
    return roles


def course_dir(settings: HubSettings, instructor: str) -> str:
    return settings.course_dir or str(Path(pwd.getpwnam(instructor).pw_dir) / "pdl-course")


def job_script(settings: HubSettings, hub_id: str, venv_bin: str) -> str:
    """The sbatch script of one JupyterLab, as a batchspawner (Jinja) template.

    batchspawner fills ``{{homedir}}``, ``{{keepvars}}`` (the variables the hub passes:
    its API URL and the server's token) and ``{{cmd}}`` (``hub_job serve`` and
    jupyterhub-singleuser: the JupyterLab, which tells the hub its port once it
    listens). The profile adds its own ``#SBATCH`` lines (partition, account, ...)
    and its software set-up. The released labs are fetched beside it, at low priority.
    """
    profile = load_profile(settings.profile)
    values = profile.values()
    lines = [
        "--job-name=jupyterlab",
        f"--comment=pdl-hub-{hub_id}",  # make hub-down cancels the jobs that carry it
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={settings.cpus}",
        f"--time={settings.time}",
        "--chdir={{homedir}}",
        "--output={{homedir}}/.jupyterlab-%j.log",
        "--export={{keepvars}}",
    ]
    lines += [f"--mem={settings.memory}"] * bool(settings.memory)
    lines += [f"--reservation={settings.reservation}"] * bool(settings.reservation)
    for d in profile.directives:
        value = profile.fill(d.value, values, quote=False)
        lines.append(f"{d.flag}={value}" if value else d.flag)
    setup = [profile.fill(line, values, quote=True) for line in profile.setup]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# A learner's JupyterLab on the {profile.name!r} cluster, started by the",
            "# workbook's JupyterHub (slurm/hub/jupyterhub_config.py).",
            *(f"#SBATCH {line}" for line in lines),
            f"export PATH={venv_bin}:/usr/local/bin:/usr/bin:/bin",
            *setup,
            "set -euo pipefail",
            f"nice python -m helpers.course.hub.job prepare --course {settings.course} &",
            "exec {{cmd}}",
            "",
        ]
    )


def write_configs(settings: HubSettings, instructor: str) -> dict[str, Path]:
    """Jupyter config directories under the state directory, readable by every user.

    ``all``: every hub server's nbgrader configuration (the course, the exchange, and
    JupyterHub groups deciding who takes which course). ``learner``: the same with the
    instructor tools switched off, as ``python -m helpers.course.grading.roles learner`` does.
    """
    top = settings.state / "jupyter"
    dirs = {"all": top / "all", "learner": top / "learner"}
    nbgrader = "\n".join(
        [
            "from nbgrader.auth import JupyterHubAuthPlugin",
            "c = get_config()  # noqa: F821",
            f"c.CourseDirectory.course_id = {settings.course!r}",
            f"c.Exchange.root = {settings.exchange!r}",
            "c.Exchange.path_includes_course = True",
            "c.Authenticator.plugin_class = JupyterHubAuthPlugin",
            "from helpers.course.grading.grader.preprocessor import configure  # Validate grades as autograde",
            "configure(c)",
            "",
        ]
    )
    off = {"disabledExtensions": {p: True for p in INSTRUCTOR_PLUGINS}}
    # Not needed on the hub, and slow to load: language servers (none is installed)
    # and the Notebook 7 interface (the hub opens JupyterLab).
    unused = {"jupyter_lsp": False, "notebook": False}
    learner = dict.fromkeys(INSTRUCTOR_SERVER_EXTENSIONS, False)
    for name, path in dirs.items():
        (path / "labconfig").mkdir(parents=True, exist_ok=True)
        (path / "nbgrader_config.py").write_text(nbgrader)
        extensions = {**unused, **learner} if name == "learner" else {"jupyter_lsp": False}
        server = {"ServerApp": {"jpserver_extensions": extensions}}
        (path / "jupyter_server_config.json").write_text(json.dumps(server, indent=1))
        if name == "learner":
            (path / "labconfig" / "page_config.json").write_text(json.dumps(off, indent=1))
    for p in [top, *top.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dirs


def preflight(settings: HubSettings, python: str) -> list[str]:
    """What would stop a class from working, each with what to change (empty: ready)."""
    try:
        people = read_class(settings.class_list)
    except (OSError, ValueError) as e:
        return [str(e)]
    problems = []
    someone = (people["learner"] or people["instructor"])[0]
    probe = "import jupyterhub, batchspawner, nbgrader, helpers.course.hub.workshop"
    ran = subprocess.run(["runuser", "-u", someone, "--", python, "-c", probe],
                         capture_output=True, text=True, cwd="/")  # fmt: skip
    if ran.returncode != 0:
        closed = [p for p in Path(python).parents if not os.stat(p).st_mode & 0o001]
        problems.append(
            f"the JupyterLab jobs run {python} as each learner, and {someone} cannot: "
            f"{(ran.stderr.strip().splitlines() or ['no output'])[-1]}"
            + (f" ({closed[-1]} is closed to other users)" if closed else "")
            + ". Clone the workbook where everyone can read it (e.g. /opt/pdl-workbook) and "
            "build its venv from a Python every user can run: make setup PYTHON=/usr/bin/python3"
        )
    partition = next((d.value for d in load_profile(settings.profile).directives
                      if d.flag == "--partition"), None)  # fmt: skip
    sinfo = subprocess.run(["sinfo", "-h", *(["-p", partition] if partition else [])],
                           capture_output=True, text=True)  # fmt: skip
    if sinfo.returncode != 0 or not sinfo.stdout.strip():
        where = f"partition {partition!r}" if partition else "the cluster"
        problems.append(f"Slurm does not answer for {where}: start it (make slurm-up) "
                        f"or set HUB_PROFILE to your site's profile ({sinfo.stderr.strip()})")  # fmt: skip
    course = Path(course_dir(settings, people["instructor"][0]))
    if not (course / "nbgrader_config.py").is_file():
        problems.append(f"no course in {course}: create it first as {people['instructor'][0]} "
                        "(docs/instructors.md, section 2), or set HUB_COURSE_DIR")  # fmt: skip
    if not Path(settings.exchange).is_dir():
        problems.append(f"no exchange at {settings.exchange}: create it (docs/instructors.md, "
                        "section 1) or set NBGRADER_EXCHANGE")  # fmt: skip
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.course.hub")
    ap.add_argument("command", choices=["check"], help="check: is everything ready for a class?")
    ap.add_argument("--python", default=sys.executable, help="the Python the jobs will run")
    args = ap.parse_args(argv)
    try:
        problems = preflight(settings_from_env(), args.python)
    except ValueError as e:
        problems = [str(e)]
    for p in problems:
        print(f"hub: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
