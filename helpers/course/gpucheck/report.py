"""The check's record: ``<gpu>-<date>.json`` and a Markdown table beside it, rewritten after
every program (written to a temporary file, then renamed: a reader never sees half a file)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["write", "rows", "table"]

_FAILED = ("failed", "timed out")


def rows(report: dict) -> list[tuple[str, str, dict]]:
    """(kind, name, row) for every item recorded so far (same-as rows left out)."""
    out = [("job", j["job"], j) for j in report["jobs"] if "same_as" not in j]
    out += [("measurement", name, r) for name, r in report["measurements"].items()]
    if "notebook_01" in report:
        out.append(("notebook", "notebook 01", report["notebook_01"]))
    return out


def _phases(row: dict) -> str:
    p = row.get("phases") or {}
    parts = [f"{label} {p[key]:.1f}" for key, label in
             (("start_up", "start"), ("imports_and_setup", "imports"), ("process_group", "group"),
              ("to_first_forward", "to 1st fwd"), ("first_step", "1st step"),
              ("steady_step", "step")) if key in p]  # fmt: skip
    parts += [f"{op} compile+load {s:.0f}" for op, s in (p.get("deepspeed_ops") or {}).items()]
    return ", ".join(parts)


def table(report: dict) -> str:
    hw = report["hardware"]
    lines = [f"# gpu-check on {hw['gpus']} x {hw['gpu']}",
             "", f"{hw['date']}, torch {hw['torch']}, CUDA {hw['cuda']}, driver {hw['driver']}, "
             f"Python {hw.get('python', '?')}. Times in seconds.", "",
             "| item | kind | verdict | ranks | wall | where the time went | error |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind, name, r in rows(report):
        error = " ".join((r.get("error") or "").split())[:160].replace("|", "/")
        where = f" at {r['where']}" if r.get("where") else ""
        ranks = f"{r.get('ranks', 0)}" + (
            f" of {r['wants']}" if r.get("wants", 0) > r.get("ranks", 0) else ""
        )
        lines.append(f"| {name} | {kind} | {r['verdict']} | {ranks} | {r.get('wall', '')} | "
                     f"{_phases(r)} | {error}{where.replace('|', '/')} |")  # fmt: skip
    if report.get("carry"):
        lines += ["", "Missing packages, to carry here:", "", "```", *report["carry"], "```"]
    return "\n".join(lines) + "\n"


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write(report: dict, path: Path, final: bool = False) -> int:
    """Write the JSON and the table; at the end, print the summary and return the exit code
    (1 if an item failed or timed out; an item that needs more GPUs or a package is not)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic(path, json.dumps(report, indent=1, default=str))
    _atomic(path.with_suffix(".md"), table(report))
    if not final:
        return 0
    done = rows(report)
    bad = [n for _, n, r in done if r["verdict"] in _FAILED]
    needs = [f"{n} ({r['verdict']})" for _, n, r in done if r["verdict"].startswith("needs")]
    hw = report["hardware"]
    print(f"gpu-check on {hw['gpus']} x {hw['gpu']}: {len(done)} item(s), "
          f"{sum(r['verdict'] == 'ok' for _, _, r in done)} ok; "
          f"not run here: {', '.join(needs) or 'none'}; failed: {', '.join(bad) or 'none'}; "
          f"results in {path} (and .md)")  # fmt: skip
    return 1 if bad else 0
