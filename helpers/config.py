"""The workbook's one config idiom: a dataclass, overridable from the command line.

    @dataclass
    class TrainConfig:
        epochs: int = 2
        lr: float = 0.05
        amp: bool = False

    cfg = parse(TrainConfig)            # python prog.py --epochs 5 --amp true
    cfg = parse(TrainConfig, [])        # in a notebook: defaults only
    cfg = replace(cfg, lr=0.1)          # dataclasses.replace for variants

Every field becomes ``--field`` (underscores also accepted as dashes). Bools
take true/false/1/0/yes/no. A field may declare ``choices`` in its metadata.
Unknown options are an error that lists the valid ones.

A field may also declare a ``small`` value: the size a laptop can run. With
``$WORKBOOK_SMALL`` set (the dry run's device-strict check sets it, to run a cluster
job's program on two CPU ranks) those values replace whatever the command line says::

    dim: int = field(default=0, metadata={"small": 64})
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, TypeVar, get_type_hints

T = TypeVar("T")

__all__ = ["parse", "to_args", "SMALL_ENV"]

SMALL_ENV = "WORKBOOK_SMALL"


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "y", "on"):
        return True
    if v in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def _converter(tp: Any):
    if tp is bool:
        return _bool
    if tp in (int, float, str):
        return tp
    # Optional[int] and friends: use the first concrete type.
    for arg in getattr(tp, "__args__", ()):
        if arg is not type(None):
            return _converter(arg)
    return str


def parse(cls: type[T], argv: list[str] | None = None, prog: str | None = None) -> T:
    """Build ``cls`` from its defaults and ``--field value`` overrides in argv."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip())
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        names = [flag] if "_" not in f.name else [flag, "--" + f.name]
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        parser.add_argument(
            *names,
            dest=f.name,
            type=_converter(hints[f.name]),
            default=default,
            choices=f.metadata.get("choices"),
            help=f.metadata.get("help", f"(default: {default!r})"),
        )
    ns = vars(parser.parse_args(sys.argv[1:] if argv is None else argv))
    if os.environ.get(SMALL_ENV):
        ns.update({f.name: f.metadata["small"] for f in dataclasses.fields(cls)
                   if "small" in f.metadata})  # fmt: skip
    return cls(**ns)


def to_args(cfg: Any) -> list[str]:
    """The command-line overrides that reproduce ``cfg`` (for job scripts).

    Fields that are None are left out: "None" is not a value the parser reads
    back, and such fields default to None.
    """
    out: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value is not None:
            out += ["--" + f.name.replace("_", "-"), str(value)]
    return out
