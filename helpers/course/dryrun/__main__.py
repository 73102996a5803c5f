"""``python -m helpers.course.dryrun [--execute] [--only NAME] [DIR ...]`` (``make dryrun``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from helpers.course.dryrun.check import check_jobs, find_jobs
from helpers.course.dryrun.report import table
from helpers.runs import workbook_root


def main(argv: list[str] | None = None) -> int:
    top = workbook_root() or Path.cwd()
    out = top / "build" / "dryrun"
    ap = argparse.ArgumentParser(prog="python -m helpers.course.dryrun", description=__doc__)
    ap.add_argument("dirs", nargs="*", type=Path,
                    help=f"where the jobs are (default {out / 'runs'})")  # fmt: skip
    ap.add_argument(
        "--execute",
        action="store_true",
        help="first run every notebook and lab solution (SMOKE) to write their jobs",
    )
    ap.add_argument("--only", help="with --execute: notebooks whose path contains this")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per check")
    args = ap.parse_args(argv)
    dirs = args.dirs or [out / "runs"]
    if args.execute:
        from helpers.course.book import runner as book

        os.environ["WORKBOOK_RUNS"] = str(out / "runs")
        notebooks = book.discover(top, solutions=True, only=args.only)
        results = book.run_all(notebooks, out / "executed", smoke=True, root=top)
        failed = [r for r in results if not r.ok]
        if failed:
            print(f"dryrun: {len(failed)} notebook(s) failed before their jobs could be checked")
            return 1
    jobs = find_jobs(*dirs)
    if not jobs:
        print(f"dryrun: no job.json under {', '.join(map(str, dirs))}; run with --execute")
        return 1
    rows = check_jobs(jobs, timeout=args.timeout)
    text = table(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(text)
    bad = [r for r in rows if not r.ok]
    print(f"dryrun: {len(rows) - len(bad)} of {len(rows)} rows ok; report in {out / 'report.md'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
