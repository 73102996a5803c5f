"""Run directories: every launch keeps its program, command, logs and metrics.

Layout::

    runs/
      NAME/
        20261122-101502.123456-3f9a/   one directory per launch, never reused;
                                  names sort in the order the launches started
          program.py              the exact file that ran
          command.txt             the exact command line
          logs/rank0.log ...      per-rank output
          metrics.json            what rank 0 wrote with write_metrics()
        slurm/                    (helpers.cluster.job) job ids keyed by a hash

The root is ``$WORKBOOK_RUNS`` if set, otherwise ``runs/`` at the top of the
workbook checkout (found by walking up from the current directory), otherwise
``./runs``. Notebooks run from ``notebooks/`` therefore share the same root as
scripts run from the top.

Programs report results with ``write_metrics({...})``; the launcher tells
them where through ``$WORKBOOK_METRICS``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

METRICS_ENV = "WORKBOOK_METRICS"
RUNS_ENV = "WORKBOOK_RUNS"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: str) -> str:
    """Run and job names become directory names and Slurm job names: keep them plain."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise ValueError(
            f"invalid run name {name!r}: use 1-64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit (no spaces, quotes, '$' or '/')"
        )
    return name


def workbook_root(start: Path | None = None) -> Path | None:
    """The checkout's top directory (holding pyproject.toml and helpers/), if any."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "helpers").is_dir():
            return d
    return None


def runs_root() -> Path:
    if os.environ.get(RUNS_ENV):
        return Path(os.environ[RUNS_ENV]).expanduser().resolve()
    top = workbook_root()
    return (top / "runs") if top else (Path.cwd() / "runs").resolve()


def _run_id() -> str:
    """Local time to the microsecond, then a random suffix: names sort by start time."""
    now = time.time_ns()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now // 10**9))
    return f"{stamp}.{now // 1000 % 10**6:06d}-{secrets.token_hex(2)}"


def new_run_dir(name: str, root: Path | None = None) -> Path:
    """Create ``runs/NAME/<time>-<random>/``; an existing directory is never reused.

    The new name sorts after every earlier launch of NAME (list_runs relies on it),
    even when two launches start within the same second.
    """
    base = (root or runs_root()) / check_name(name)
    base.mkdir(parents=True, exist_ok=True)
    latest = max((p.name for p in _run_dirs(base)), default="")
    for _ in range(1000):
        run_id = _run_id()
        if run_id[:22] <= latest[:22]:  # same microsecond, or the clock stepped back
            time.sleep(1e-5)
            continue
        path = base / run_id
        try:
            path.mkdir()  # exist_ok=False: this is the no-overwrite guarantee
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a fresh run directory under {base}")


def _run_dirs(base: Path) -> list[Path]:
    return [p for p in base.iterdir() if p.is_dir() and p.name[:1].isdigit()]


def list_runs(name: str, root: Path | None = None) -> list[Path]:
    """Earlier launches of NAME, oldest first."""
    base = (root or runs_root()) / check_name(name)
    if not base.is_dir():
        return []
    return sorted(_run_dirs(base), key=lambda p: p.name)


def write_metrics(metrics: dict, path: str | os.PathLike | None = None) -> Path | None:
    """Rank 0 writes a small JSON of results; other ranks do nothing.

    The file is ``$WORKBOOK_METRICS`` when a launcher set it, else ``metrics.json``
    in the current directory. Values must be JSON-serialisable (numbers, strings,
    lists, dicts); tensors are converted with .tolist().
    """
    from helpers import dist  # the one module that knows ranks

    if not dist.is_main():
        return None
    target = Path(path or os.environ.get(METRICS_ENV) or "metrics.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(_jsonable(metrics), indent=2, sort_keys=True))
    tmp.replace(target)  # atomic: a reader never sees half a file
    return target


def read_metrics(path: str | os.PathLike) -> dict:
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else {}


def _jsonable(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
