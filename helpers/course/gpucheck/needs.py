"""What a program needs that this node may lack: more GPUs, or a package (and how to carry it).

Two ways to know a job needs more GPUs than the node has:

* declared: ``min_gpus`` in its job.json (``Job(..., min_gpus=2)``): the check does not start it;
* recognised: run at the GPUs here, it fails before its first forward with a layout error
  ("tp=2 must divide world_size=1", "num_stages (2) must divide distributed world size (1)",
  "pingpong needs at least 2 ranks", ...): "needs N GPUs", N read from the message (else the
  job's own world size). Such a job is not counted as failed: this node cannot run it.

A missing package is named the same way ("needs deepspeed"), and ``carry_lines`` prints the
``pip download`` commands that fetch exactly its wheels for this node's Python and platform,
to be installed there without a package index.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import sys
import sysconfig
from pathlib import Path

__all__ = ["needs_gpus", "needs_module", "imports_of", "missing", "carry_lines", "PACKAGES"]

# Errors a program raises when its layout needs more ranks than it got; group 1 is that need.
_LAYOUT = [
    r"(\d+)\)? (?:does not|must|do not) divide (?:the )?(?:distributed )?world[ _]size",
    r"--pp (\d+) must be >= \d+ and divide",
    r"needs at least (\d+) (?:ranks|GPUs|processes)",
    r"Mesh should not be bigger than default world size \d+, but found (\d+) ranks",
]
# import name -> (distribution, what needs it); pins come from the workbook's pyproject.toml
PACKAGES = {
    "deepspeed": ("deepspeed", "the DeepSpeed jobs of notebooks 04 and 05"),
    "papermill": ("papermill", "running notebook 01"),
    "ipykernel": ("ipykernel", "running notebook 01"),
    "torchvision": ("torchvision", "the CIFAR-10 and MNIST data"),
}
# DeepSpeed's own requirements (its metadata, 0.19.8), less torch: the site's torch stays
DEEPSPEED_DEPS = ["einops", "hjson", "msgpack", "ninja", "numpy", "packaging>=20.0", "psutil",
                  "py-cpuinfo", "pydantic>=2.0.0", "tqdm"]  # fmt: skip
_MATCHED_TO_TORCH = {"torchvision"}  # its version must be the one built for the site's torch


def needs_gpus(result: dict, ran_on: int, wants: int) -> int | None:
    """The GPUs a failed run needs, if it failed at start on a layout larger than ``ran_on``."""
    if result.get("ok") or result.get("reached") not in ("started", None) or ran_on >= wants:
        return None
    error = result.get("error") or ""
    for pattern in _LAYOUT:
        m = re.search(pattern, error)
        if m:
            return max(int(m.group(1)), ran_on + 1)
    return None


def needs_module(result: dict) -> str | None:
    """'deepspeed' for a run that failed with "No module named 'deepspeed'" (top-level name)."""
    m = re.search(r"No module named '([\w.]+)'", result.get("error") or "")
    if not m or not (result.get("error") or "").startswith("ModuleNotFoundError"):
        return None
    return m.group(1).split(".")[0]


def imports_of(*sources: Path) -> set[str]:
    """Top-level names of the modules a program's files import."""
    names = set()
    for path in sources:
        try:
            tree = ast.parse(Path(path).read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def missing(modules, find=importlib.util.find_spec) -> list[str]:
    """The modules of ``modules`` this Python cannot import, in the order given."""
    return [m for m in dict.fromkeys(modules) if find(m) is None]


def _pins(top: Path) -> dict[str, str]:
    """distribution -> 'name==version' from pyproject.toml (every dependency group)."""
    try:
        import tomllib

        project = tomllib.loads((top / "pyproject.toml").read_text())["project"]
    except (ImportError, OSError, KeyError, ValueError):
        return {}
    specs = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        specs += group
    return {re.split(r"[=<>!~ ]", s, maxsplit=1)[0].lower(): s for s in specs}


def _platforms() -> list[str]:
    plat = sysconfig.get_platform()  # 'linux-x86_64', 'linux-aarch64'
    if plat.startswith("linux-"):
        arch = plat.split("-", 1)[1]
        return [f"manylinux_2_28_{arch}", f"manylinux2014_{arch}", f"linux_{arch}"]
    return [plat.replace("-", "_").replace(".", "_")]


def carry_lines(modules: list[str], top: Path, folder: str = "gpucheck-wheels") -> list[str]:
    """Shell lines that fetch the wheels for ``modules`` (import names) on a machine with
    internet, and install them on this node without an index. The site's torch is kept."""
    if not modules:
        return []
    pins = _pins(top)
    dists = [PACKAGES.get(m, (m, ""))[0] for m in modules]
    pinned = [pins.get(d, d) for d in dists]
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    where = " ".join(f"--platform {p}" for p in _platforms())
    get = (
        f"python -m pip download --dest {folder} --only-binary=:all: --python-version {py} {where}"
    )
    lines = [f"# on a machine with internet (wheels for this node: Python {py}, "
             f"{sysconfig.get_platform()}), then copy {folder}/ here:"]  # fmt: skip
    plain = [p for d, p in zip(dists, pinned, strict=True)
             if d not in ("deepspeed", *_MATCHED_TO_TORCH)]  # fmt: skip
    deps = [shlex.quote(d) for d in DEEPSPEED_DEPS] if "deepspeed" in dists else []
    if plain or deps:
        lines.append(f"{get} {' '.join(plain + deps)}")
    if "deepspeed" in dists:  # a source release only: build its wheel here, without torch
        lines.append(
            f"python -m pip wheel --no-deps --wheel-dir {folder} {pins.get('deepspeed', 'deepspeed')}"
        )
    matched = [d for d in dists if d in _MATCHED_TO_TORCH]
    for d in matched:
        lines.append(f"{get} --no-deps {d}  # the release built for this node's torch "
                     f"{_torch_version()} (pytorch.org's table)")  # fmt: skip
    install = f"python -m pip install --no-index --find-links {folder}"
    lines.append("# then, on this node (what is already installed stays as it is):")
    if plain or deps:
        lines.append(f"{install} {' '.join(plain + deps)}")
    rest = [pins.get(d, d) for d in dists if d == "deepspeed"] + matched
    if rest:
        lines.append(f"{install} --no-deps {' '.join(rest)}")
    return lines


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:  # pragma: no cover - the check needs torch itself
        return "?"
