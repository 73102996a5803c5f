"""Execute the workbook's notebooks with papermill, like CI and `make run` do.

    python -m helpers.course.book run                       # every notebook in notebooks/
    python -m helpers.course.book run --smoke               # SMOKE=True: the fast CI variant
    python -m helpers.course.book run --solutions           # also solutions/*/*.ipynb
    python -m helpers.course.book run --only 03_ddp         # names containing 03_ddp (or a glob)

Each notebook runs top to bottom in a fresh kernel, the one its metadata names
(``pdl-workbook``, this checkout's venv, for notebooks/; ``python3``, the
interpreter running the book, for the labs), with the notebook's own folder as
working directory. The executed copy is written under
``build/executed/`` with the same relative path (``notebooks/03_ddp.ipynb`` ->
``build/executed/notebooks/03_ddp.ipynb``); the committed notebook is only
read. A table ``notebook, status, seconds`` follows, and the exit status is 1
if any notebook failed, with the failing cell's error.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.runs import workbook_root


@dataclass
class Executed:
    """The outcome of one notebook run."""

    notebook: str  # path relative to the checkout, e.g. "notebooks/00_getting_started.ipynb"
    ok: bool
    seconds: float
    output: Path
    error: str = ""  # the failing cell's error and traceback when not ok


def _root(root: Path | None) -> Path:
    top = root or workbook_root()
    if top is None:
        raise FileNotFoundError("not inside the workbook checkout: pass root= or cd into it")
    return Path(top)


def discover(
    root: Path | None = None, solutions: bool = False, only: str | None = None
) -> list[Path]:
    """Notebooks to execute, as paths relative to the checkout, in reading order.

    only: a glob matched against the relative path (``*03*``), or else a substring of it.
    """
    top = _root(root)
    found = sorted((top / "notebooks").glob("*.ipynb"))
    if solutions:
        found += sorted((top / "solutions").glob("*/*.ipynb"))
    rel = [p.relative_to(top) for p in found if ".ipynb_checkpoints" not in p.parts]
    if only:
        if any(ch in only for ch in "*?["):
            rel = [p for p in rel if fnmatch.fnmatch(str(p), only)]
        else:
            rel = [p for p in rel if only in str(p)]
    return rel


def _describe(exc: BaseException) -> str:
    """The failing cell's source and error, from papermill's exception."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        lines = [
            f"cell {exc.cell_index} (execution count {exc.exec_count}) raised "
            f"{exc.ename}: {exc.evalue}",
            "--- cell source ---",
            exc.source,
            "--- traceback ---",
            *exc.traceback,
        ]
        return _strip_ansi("\n".join(lines))
    return f"{type(exc).__name__}: {exc}"


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def ipc_kernel_manager():
    """A kernel manager whose kernels talk over Unix domain sockets, on POSIX; else None.

    Over the default TCP transport ipykernel warns, once per notebook, that the kernel "is
    running over TCP without encryption": true, and nothing a learner can act on. Over IPC
    no port is opened at all, so the warning has no cause left.
    """
    if os.name != "posix":
        return None
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IpcKernelManager(AsyncKernelManager):
        @default("transport")
        def _ipc(self) -> str:
            return "ipc"

    return IpcKernelManager


def execute(
    notebook: Path,
    output: Path,
    smoke: bool = False,
    cell_timeout: float = 1800,
    root: Path | None = None,
    kernel_name: str | None = None,
) -> Executed:
    """Run one notebook with papermill into ``output``; never raises for a failing cell.

    kernel_name: None runs the kernel the notebook's metadata names (``pdl-workbook``).

    notebook: relative to the checkout (or absolute); cwd of the kernel = its folder.
    cell_timeout: seconds one cell may run before it counts as failed.
    """
    import papermill

    from helpers.course.book import headless

    top = _root(root)
    src = notebook if Path(notebook).is_absolute() else top / notebook
    name = str(src.relative_to(top)) if src.is_relative_to(top) else str(src)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    before = os.environ.get("WORKBOOK_NOTEBOOK")
    os.environ["WORKBOOK_NOTEBOOK"] = name  # the kernel inherits it: jobs say who wrote them
    try:
        papermill.execute_notebook(
            str(src),
            str(output),
            parameters={"SMOKE": True} if smoke else {},
            kernel_name=kernel_name,  # None: the kernel the notebook's metadata names
            cwd=str(src.parent),
            progress_bar=False,
            execution_timeout=cell_timeout,
            engine_name=headless.register(),  # papermill's own engine, less its widget mimic
            **({"kernel_manager_class": km} if (km := ipc_kernel_manager()) else {}),
        )
    except Exception as exc:  # a failing cell is a result to report, not a crash
        return Executed(name, False, time.perf_counter() - start, output, _describe(exc))
    finally:
        if before is None:
            os.environ.pop("WORKBOOK_NOTEBOOK", None)
        else:
            os.environ["WORKBOOK_NOTEBOOK"] = before
    return Executed(name, True, time.perf_counter() - start, output)


def run_all(
    notebooks: list[Path],
    out_dir: Path,
    smoke: bool = False,
    root: Path | None = None,
    cell_timeout: float = 1800,
) -> list[Executed]:
    """Execute notebooks one after the other (they each start several ranks)."""
    results = []
    for nb in notebooks:
        res = execute(nb, Path(out_dir) / nb, smoke=smoke, cell_timeout=cell_timeout, root=root)
        print(f"{'ok  ' if res.ok else 'FAIL'} {res.seconds:7.1f} s  {res.notebook}", flush=True)
        results.append(res)
    return results


def table(results: list[Executed]) -> str:
    """notebook, status, seconds, as a fixed-width text table with a total line."""
    width = max([len("notebook"), *(len(r.notebook) for r in results)])
    lines = [f"{'notebook':<{width}}  status  seconds", "-" * (width + 17)]
    for r in results:
        lines.append(f"{r.notebook:<{width}}  {'ok' if r.ok else 'FAILED':<6}  {r.seconds:7.1f}")
    failed = sum(not r.ok for r in results)
    total = sum(r.seconds for r in results)
    lines.append("-" * (width + 17))
    lines.append(f"{f'{len(results)} notebooks, {failed} failed':<{width}}  {'':<6}  {total:7.1f}")
    return "\n".join(lines)


def can_start_local_cluster() -> tuple[bool, str]:
    """Whether slurm/local/start.sh can run here: root, and Slurm installed or installable."""
    import os
    import shutil

    if os.name != "posix" or os.geteuid() != 0:
        return False, "starting the local Slurm cluster needs root (sudo make slurm-up)"
    if shutil.which("sbatch") and shutil.which("slurmctld"):
        return True, "Slurm is installed"
    release = Path("/etc/os-release")
    distro = release.read_text() if release.is_file() else ""
    if any(f"ID={d}" in distro or f"ID_LIKE={d}" in distro for d in ("debian", "ubuntu")):
        return True, "root on Debian/Ubuntu: start.sh installs Slurm with apt-get"
    return False, "Slurm is not installed and this is not Debian/Ubuntu (see slurm/README.md)"


def ensure_local_cluster(top: Path) -> str:
    """Use the cluster that is up, else start the local one when possible; say which."""
    import subprocess

    from helpers.cluster import slurm_available

    up, why = slurm_available()
    if up:
        return f"Slurm is reachable ({why}): notebooks submit real jobs"
    ok, reason = can_start_local_cluster()
    if not ok:
        return f"no Slurm cluster ({reason}): notebooks write job scripts without submitting"
    print(f"starting the local Slurm cluster ({reason}) ...", flush=True)
    done = subprocess.run(["bash", str(top / "slurm" / "local" / "start.sh"), "--nodes", "2"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        return "could not start the local Slurm cluster: " + " | ".join(tail)
    return "started the local Slurm cluster (stop it with `make slurm-down`)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m helpers.course.book", description="Execute the workbook's notebooks."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="execute notebooks with papermill into build/executed/")
    run.add_argument("--smoke", action="store_true", help="set SMOKE=True (fast CI variant)")
    run.add_argument("--solutions", action="store_true", help="also run solutions/*/*.ipynb")
    run.add_argument("--only", metavar="PATTERN", help="glob or substring of the notebook path")
    run.add_argument("--out", type=Path, help="output folder (default: build/executed)")
    run.add_argument("--cell-timeout", type=float, default=1800, help="seconds per cell")
    run.add_argument(
        "--cluster",
        choices=("auto", "none"),
        default="auto",
        help="auto: use a reachable Slurm, or start the local cluster when root (default)",
    )
    args = ap.parse_args(argv)

    top = _root(None)
    notebooks = discover(top, solutions=args.solutions, only=args.only)
    if not notebooks:
        where = "notebooks/" + (" and solutions/" if args.solutions else "")
        ap.error(f"no notebook in {where} matches --only {args.only!r}")
    out_dir = args.out or top / "build" / "executed"
    mode = "SMOKE=True" if args.smoke else "full"
    if args.cluster == "auto":
        print(ensure_local_cluster(top), flush=True)
    print(f"executing {len(notebooks)} notebook(s), {mode}, into {out_dir}", flush=True)
    results = run_all(
        notebooks, out_dir, smoke=args.smoke, root=top, cell_timeout=args.cell_timeout
    )
    print()
    print(table(results))
    for r in results:
        if not r.ok:
            print(f"\n=== {r.notebook} failed (executed copy: {r.output}) ===\n{r.error}")
    return 1 if any(not r.ok for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
