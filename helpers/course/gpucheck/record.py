"""The GPU figures recorded by ``make gpu-check`` (notebooks/data/gpu/*.json), for the notebooks.

Each record says what it was measured on; every line printed from it starts with that label,
e.g. "measured on 1 x NVIDIA H100 80GB HBM3 (2026-11-27, torch 2.11.0+cu130, CUDA 13.0)".

    show("cnn")                      # one line per record: fp32 and bf16 samples/s, their ratio
    figure("cnn fp32", "samples_per_s")   # 8127.02..., from the first record that has it
    figure("llama mfu", "mfu")       # 0.4197
    label()                          # "measured on 1 x NVIDIA H100 80GB HBM3 (2026-11-27, ...)"
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.runs import workbook_root

__all__ = ["recorded", "show", "figure", "label", "measured", "keep", "KINDS", "FIGURES_ENV"]

KINDS = ("cnn", "allreduce", "llama")
FIGURES_ENV = "WORKBOOK_GPUCHECK_FIGURES"  # set by the check while it runs notebook 01
_TOP = workbook_root(Path(__file__).parent) or Path.cwd()
_NONE_YET = ("No GPU figures recorded yet (notebooks/data/gpu/ is empty): an instructor records "
             "them with `make gpu-check` on a GPU node (docs/instructors.md).")  # fmt: skip


def recorded(root: Path | None = None) -> list[dict]:
    """Every record in ``<root>/notebooks/data/gpu/``, by file name."""
    folder = (root or _TOP) / "notebooks" / "data" / "gpu"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def label(record: dict | None = None, root: Path | None = None) -> str:
    """'measured on 1 x NVIDIA H100 80GB HBM3 (2026-11-27, torch 2.11.0+cu130, CUDA 13.0)'."""
    record = record if record is not None else _first(root)
    hw = record["hardware"]
    return (f"measured on {hw['gpus']} x {hw['gpu']} ({hw['date']}, torch {hw['torch']}, "
            f"CUDA {hw['cuda']})")  # fmt: skip


def measured(name: str, record: dict) -> dict:
    """The metrics a measurement or a job wrote ({} if the record lacks it or it failed)."""
    if name == "notebook 01":
        return (record.get("notebook_01") or {}).get("metrics") or {}
    row = record.get("measurements", {}).get(name)
    if row is None:
        row = next((j for j in record.get("jobs", []) if j.get("job") == name), None)
    if not row or not row.get("ok"):
        return {}
    return row.get("metrics") or {}


def figure(name: str, key: str, root: Path | None = None, gpu: str = "") -> float | None:
    """One figure: ``key`` of measurement ``name`` ("cnn fp32", "cnn bf16", "llama mfu",
    "all-reduce", a job's name, or "notebook 01"), from the first record (of a GPU whose name
    contains ``gpu``) that has it; None if none has. Label it with ``label()``."""
    for record in recorded(root):
        if gpu.lower() in record["hardware"]["gpu"].lower():
            value = measured(name, record).get(key)
            if value is not None:
                return value
    return None


def keep(figures: dict) -> bool:
    """For notebook 01: keep its measured figures in the check's record (``figure("notebook
    01", key)`` reads them back). Outside ``make gpu-check`` it does nothing (False)."""
    target = os.environ.get(FIGURES_ENV)
    if not target:
        return False
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**old, **figures}, indent=1, default=str))
    return True


def show(kind: str, root: Path | None = None) -> str:
    """The recorded GPU figures of one kind ("cnn", "allreduce", "llama"), a line per record."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    found = recorded(root)
    if not found:
        return _NONE_YET
    return "\n".join(f"{label(r)}: {_LINES[kind](r)}" for r in found)


def _cnn(record: dict) -> str:
    fp32, bf16 = (measured(f"cnn {p}", record).get("samples_per_s") for p in ("fp32", "bf16"))
    if not (fp32 and bf16):
        return "no CNN figure in this record"
    return (f"CNN fp32 {fp32:,.0f} samples/s, bf16 {bf16:,.0f} samples/s "
            f"(bf16 at {bf16 / fp32:.2f}x fp32)")  # fmt: skip


def _allreduce(record: dict) -> str:
    rows = measured("all-reduce", record).get("rows")
    if record["hardware"]["gpus"] < 2:
        return ("one GPU, so no all-reduce was measured; record one with `make gpu-check` on a "
                "node with 2 or more GPUs")  # fmt: skip
    if not rows:
        return "no all-reduce figure in this record"
    world = measured("all-reduce", record).get("world_size", record["hardware"]["gpus"])
    built = [r for r in rows if r["algo"] == "builtin"]
    return f"all_reduce bus bandwidth on {world} GPUs: " + ", ".join(
        f"{r['bytes'] / 2**20:g} MiB {r['busbw_GBps']:.0f} GB/s" for r in built
    )


def _llama(record: dict) -> str:
    m = measured("llama mfu", record)
    if not m:
        return "no Llama 2 figure in this record"
    cfg = m.get("config", {})
    shape = (f"Llama 2 {cfg.get('model', '?')} shapes, {cfg.get('n_layers', '?')} layers, "
             f"sequence {cfg.get('seq_len', '?'):,}, batch {cfg.get('batch_size', '?')}, "
             f"{m.get('world_size', '?')} GPU(s), {m.get('dtype', '?')}")  # fmt: skip
    steps = sorted(m.get("step_times", [])[1:])
    step = f", {steps[len(steps) // 2]:.2f} s a step" if steps else ""
    return (f"{shape}: {m['tokens_per_s']:,.0f} tokens/s, MFU {100 * m['mfu']:.1f} % of "
            f"{m['peak_flops_per_rank'] / 1e12:,.0f} TFLOP/s ({m['peak_source']}){step}")  # fmt: skip


_LINES = {"cnn": _cnn, "allreduce": _allreduce, "llama": _llama}


def _first(root: Path | None) -> dict:
    found = recorded(root)
    if not found:
        raise LookupError(_NONE_YET)
    return found[0]
