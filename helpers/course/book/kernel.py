"""The notebooks' Jupyter kernel: ``pdl-workbook``, installed inside the checkout's venv.

``make setup`` runs ``ipykernel install --sys-prefix --name pdl-workbook``, so the
kernel spec sits in ``.venv/share/jupyter/kernels/`` and only this venv's Jupyter
(``make lab``, ``make run``, the tests) sees it: two checkouts side by side each
run their own code. Earlier versions registered the kernel user-wide, where the
last checkout to register it won for every other one; ``--drop-user-wide``
removes such a leftover (a user-wide spec would shadow the venv's).

    python -m helpers.course.book.kernel --drop-user-wide pdl-workbook
    python -m helpers.course.book.kernel --where pdl-workbook    # which spec Jupyter would use
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

NAME = "pdl-workbook"


def spec_dir(name: str = NAME) -> Path | None:
    """The kernel spec directory Jupyter resolves for ``name`` (None if there is none)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return Path(KernelSpecManager().get_kernel_spec(name).resource_dir)
    except NoSuchKernel:
        return None


def user_wide_dir(name: str = NAME) -> Path:
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "kernels" / name


def drop_user_wide(name: str = NAME) -> bool:
    """Remove a user-wide spec of ``name``; True if there was one."""
    path = user_wide_dir(name)
    if not path.is_dir():
        return False
    shutil.rmtree(path)
    print(f"removed the user-wide kernel spec {path} (the venv's own spec is used instead)")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.course.book.kernel")
    ap.add_argument("--drop-user-wide", metavar="NAME")
    ap.add_argument("--where", metavar="NAME")
    args = ap.parse_args(argv)
    if args.drop_user_wide:
        drop_user_wide(args.drop_user_wide)
    if args.where:
        print(spec_dir(args.where) or f"no kernel named {args.where!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
