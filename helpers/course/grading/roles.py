"""Learners see learner tools; instructors see everything (nbgrader in JupyterLab).

nbgrader's JupyterLab extension has one plugin per tool. A learner needs two of
them: the assignment list (fetch, submit, fetch feedback) and the Validate
button. The instructor tools (the "Create Assignment" sidebar, the formgrader and
the course list) only confuse a learner, so the learner role disables them, and
the matching server extensions, for that user only (``~/.jupyter``, or
``$JUPYTER_CONFIG_DIR``). The Nbgrader menu stays: it lists only the tools that are
on, so a learner's shows "Assignment List", the one way to open it::

    python -m helpers.course.grading.roles learner       # each learner, once
    python -m helpers.course.grading.roles instructor    # the instructor: everything back on
    python -m helpers.course.grading.roles show          # what this user gets

Nothing here changes what other users see.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

INSTRUCTOR_PLUGINS = (
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:course-list",
)
# The menu: without it nothing opens the assignment list (no palette entry either).
LEARNER_PLUGINS = (
    "@jupyter/nbgrader:assignment-list",
    "@jupyter/nbgrader:validate-assignment",
    "@jupyter/nbgrader:menu",
)
INSTRUCTOR_SERVER_EXTENSIONS = (
    "nbgrader.server_extensions.formgrader",
    "nbgrader.server_extensions.course_list",
)


def apply(role: str) -> None:
    """Configure this user's JupyterLab for ``role`` ("learner" or "instructor").

    The same as ``jupyter labextension disable --level=user PLUGIN`` and
    ``jupyter server extension disable --user EXT`` for each instructor tool
    (``enable`` for the instructor), called through their Python APIs.
    """
    from jupyter_server.extension.serverextension import toggle_server_extension_python
    from jupyterlab.commands import disable_extension, enable_extension

    if role not in ("learner", "instructor"):
        raise ValueError(f"role must be 'learner' or 'instructor', got {role!r}")
    hide = role == "learner"
    for plugin in INSTRUCTOR_PLUGINS:
        (disable_extension if hide else enable_extension)(plugin, level="user")
    for plugin in LEARNER_PLUGINS:  # always on
        enable_extension(plugin, level="user")
    for ext in INSTRUCTOR_SERVER_EXTENSIONS:
        toggle_server_extension_python(ext, enabled=not hide, user=True)


def disabled_plugins() -> set[str]:
    """The nbgrader lab plugins this user's JupyterLab will not load."""
    from jupyter_core.paths import jupyter_config_path
    from jupyterlab.labapp import LabApp  # noqa: F401  (ensures jupyterlab is importable)
    from jupyterlab_server.config import get_page_config

    labconfig = [str(Path(p) / "labconfig") for p in jupyter_config_path()]
    config = get_page_config(labconfig, "lab")
    off = config.get("disabledExtensions", {})
    names = off if isinstance(off, list) else [k for k, v in off.items() if v]
    return {n for n in names if n.startswith("@jupyter/nbgrader")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.course.grading.roles")
    ap.add_argument("role", choices=("learner", "instructor", "show"))
    args = ap.parse_args(argv)
    if args.role != "show":
        apply(args.role)
    off = disabled_plugins()
    role = "learner" if set(INSTRUCTOR_PLUGINS) <= off else "instructor"
    print(f"nbgrader tools for this user: {role}")
    for plugin in (*LEARNER_PLUGINS, *INSTRUCTOR_PLUGINS):
        print(f"  {'off' if plugin in off else 'on ':3} {plugin}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
