"""Cluster profiles: what differs between Slurm sites, one small TOML file each.

A profile (``slurm/profiles/<name>.toml``) says how a site wants GPUs asked
for, which ``#SBATCH`` lines every job needs, and how to set up the software::

    name = "perlmutter"
    gpu_request = "--gpus-per-node={gpus}"
    cpus_per_gpu = 32
    setup = ["module load pytorch"]

    [[directive]]                       # one #SBATCH line, with why it is there
    flag = "--account"
    value = "{account}"
    why = "the NERSC project charged"

    [fields.account]                    # a value only the user knows
    help = "NERSC project to charge, e.g. m1234_g"
    env = "WORKBOOK_ACCOUNT"

A directive may scale with the GPUs a node runs (``per_gpu = true``: ``--mem`` of
``{mem_per_gpu}``, 20GB, becomes 80GB for 4 GPUs), and may change for a job that uses
part of one node (a ``[directive.partial_node]`` table with ``max_gpus``, ``value`` and
``why``: Perlmutter's shared QOS for 1 or 2 of a node's 4 GPUs).

``{field}`` placeholders are filled from, in order: values passed by the caller,
the field's environment variable, its ``default``, or an ``auto`` value taken
from the running interpreter (``python_bin``, ``workbook``). A field with none
of these is an error that names the profile, the field and how to supply it.

Values that land in ``#SBATCH`` lines must be plain words (they are not parsed
by a shell, so quoting cannot protect them); values in setup lines are also
shell-quoted. Either way nothing a user types can start a command.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from helpers.runs import workbook_root

__all__ = ["Profile", "ProfileError", "load_profile", "profile_names", "profiles_dir"]

# Plain words: letters, digits and the punctuation account names, module
# versions and Slurm values use. No spaces, quotes, $, ;, |, &, backticks, newlines.
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+:,/%=-]*")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_]\w*)\}")
_AUTO = {
    "python_bin": lambda: str(Path(sys.executable).parent),
    # The checkout holding this helpers package: what a job needs on PYTHONPATH.
    "workbook": lambda: str(Path(__file__).resolve().parents[2]),  # the checkout
}


_FACTS = ("max_gpus_per_node", "cpus_per_gpu", "gpu", "host_mem_per_gpu_gb")


class ProfileError(ValueError):
    """A profile is unknown, malformed, or needs a value the user has not given."""


def profiles_dir() -> Path:
    """``slurm/profiles`` of the checkout (override with $WORKBOOK_PROFILES)."""
    if os.environ.get("WORKBOOK_PROFILES"):
        return Path(os.environ["WORKBOOK_PROFILES"])
    top = workbook_root() or workbook_root(Path(__file__).parent)
    return (top or Path.cwd()) / "slurm" / "profiles"


def profile_names() -> list[str]:
    d = profiles_dir()
    return sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []


@dataclass(frozen=True)
class Directive:
    flag: str
    value: str
    why: str = ""
    per_gpu: bool = False  # the value is per GPU: multiplied by the GPUs of a node
    partial_node: dict = field(default_factory=dict)  # {max_gpus, value, why} for part of a node


@dataclass(frozen=True)
class Profile:
    """A parsed profile file; ``resolve()`` turns it into concrete lines."""

    name: str
    description: str
    path: Path
    gpu_request: str
    cpus_per_gpu: int = 1
    max_gpus_per_node: int = 8
    setup: tuple[str, ...] = ()
    directives: tuple[Directive, ...] = ()
    fields: dict = field(default_factory=dict)
    # Node facts that follow a field's value: {"arch": {"a100": {"cpus_per_gpu": 8, ...}}}
    variants: dict = field(default_factory=dict)
    gpu: str = ""  # the GPU a job gets, a key of helpers.gpus (variants may change it)
    host_mem_per_gpu_gb: float = 0.0  # host memory of a node per GPU, where no --mem is set

    def facts(self, values: dict[str, str]) -> dict:
        """Node facts for these field values: max_gpus_per_node, cpus_per_gpu, gpu,
        host_mem_per_gpu_gb. A ``[variant.FIELD.VALUE]`` table of the profile overrides the
        defaults, so a GPU type chosen by a field brings its own node shape with it."""
        facts = {
            "max_gpus_per_node": self.max_gpus_per_node,
            "cpus_per_gpu": self.cpus_per_gpu,
            "gpu": self.gpu,
            "host_mem_per_gpu_gb": self.host_mem_per_gpu_gb,
        }
        for key, by_value in self.variants.items():
            facts.update(by_value.get(values.get(key), {}))
        return facts

    def node_facts(self, values: dict[str, str]) -> tuple[int, int]:
        """(max GPUs per node, CPUs per GPU) for these field values."""
        facts = self.facts(values)
        return int(facts["max_gpus_per_node"]), int(facts["cpus_per_gpu"])

    def gpu_variants(self, values: dict[str, str]) -> list[dict[str, str]]:
        """The field values of every GPU this profile offers, ``values`` first.

        A profile whose variants choose the GPU (engaging: gpu_type h200 or the default
        L40S; jean-zay: arch h100 or a100) gives one set of values per variant.
        """
        out = [dict(values)]
        for key, by_value in self.variants.items():
            if not any("gpu" in facts for facts in by_value.values()):
                continue
            for value in by_value:
                other = {**values, key: value}
                if other not in out:
                    out.append(other)
        return out

    @property
    def text(self) -> str:
        return self.path.read_text()

    def values(self, given: dict[str, str] | None = None) -> dict[str, str]:
        """Every field's value, or a ProfileError saying which is missing and how to set it."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.fields))
        if unknown:
            raise ProfileError(
                f"profile {self.name!r} has no field(s) {', '.join(unknown)}; "
                f"its fields are: {', '.join(sorted(self.fields)) or 'none'}"
            )
        out: dict[str, str] = {}
        for key, spec in self.fields.items():
            if key in given and given[key] is not None:
                value = str(given[key])
            elif spec.get("env") and os.environ.get(spec["env"]):
                value = os.environ[spec["env"]]
            elif "default" in spec:
                value = str(spec["default"])
            elif spec.get("auto") in _AUTO:
                out[key] = _AUTO[spec["auto"]]()  # a path: shell-quoted later, not word-checked
                continue
            else:
                how = f"values={{'{key}': ...}} (or --set {key}=... in %%sbatch)"
                if spec.get("env"):
                    how += f", or export {spec['env']}=..."
                raise ProfileError(
                    f"profile {self.name!r} needs a value for {key!r} "
                    f"({spec.get('help', 'no description')}): pass {how}"
                )
            out[key] = self._check_value(key, spec, value)
        return out

    def _check_value(self, key: str, spec: dict, value: str) -> str:
        if value == "" and spec.get("allow_empty"):
            return value
        if spec.get("choices") and value not in spec["choices"]:
            raise ProfileError(
                f"profile {self.name!r}: {key}={value!r} is not one of {spec['choices']}"
            )
        if not _PLAIN.fullmatch(value):  # fullmatch: '$' would accept a trailing newline
            raise ProfileError(
                f"profile {self.name!r}: {key}={value!r} is not allowed; use letters, digits "
                "and _ . @ + : , / % = - only (no spaces, quotes, $ or ;)"
            )
        return value

    def fill(self, template: str, values: dict[str, str], quote: bool) -> str:
        """Replace {field} placeholders ({{ and }} stand for literal braces)."""

        def sub(m: re.Match) -> str:
            if m.group(0) in ("{{", "}}"):
                return m.group(0)[0]
            key = m.group(1)
            if key not in values:
                raise ProfileError(
                    f"profile {self.name!r} ({self.path}) uses {{{key}}} but defines no field "
                    f"{key!r}: add a [fields.{key}] table or remove the placeholder"
                )
            return shlex.quote(values[key]) if quote else values[key]

        return _PLACEHOLDER.sub(sub, template)


def _directive(d: dict, path: Path) -> Directive:
    if not str(d.get("flag", "")).startswith("-"):
        raise ProfileError(f"{path}: every [[directive]] needs a flag like '--partition'")
    part = dict(d.get("partial_node", {}))
    if part and (
        set(part) - {"max_gpus", "value", "why"} or not isinstance(part.get("max_gpus"), int)
    ):
        raise ProfileError(
            f"{path}: [directive.partial_node] of {d['flag']} takes max_gpus (a whole number), "
            f"value and why; found {sorted(part)}"
        )
    return Directive(d["flag"], str(d.get("value", "")), d.get("why", ""),
                     per_gpu=bool(d.get("per_gpu", False)), partial_node=part)  # fmt: skip


def load_profile(name: str) -> Profile:
    """Read ``slurm/profiles/NAME.toml``; an unknown name lists the known ones."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        raise ProfileError(f"invalid profile name {name!r}")
    path = profiles_dir() / f"{name}.toml"
    if not path.is_file():
        raise ProfileError(
            f"unknown cluster profile {name!r}; known profiles: {', '.join(profile_names())}. "
            f"To add a cluster, copy one of the files in {profiles_dir()} to {name}.toml"
        )
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"profile file {path} is not valid TOML: {e}") from e
    for key in ("name", "gpu_request"):
        if key not in raw:
            raise ProfileError(f"profile file {path} lacks the required key {key!r}")
    variants = raw.get("variant", {})
    for key, by_value in variants.items():
        bad = {k for v in by_value.values() for k in v} - set(_FACTS)
        if key not in raw.get("fields", {}) or bad:
            raise ProfileError(
                f"{path}: [variant.{key}.*] must name a field of the profile and set only "
                f"{', '.join(_FACTS)} (found {sorted(bad) or key!r})"
            )
    directives = [_directive(d, path) for d in raw.get("directive", [])]
    return Profile(
        name=raw["name"],
        description=raw.get("description", ""),
        path=path,
        gpu_request=raw["gpu_request"],
        cpus_per_gpu=int(raw.get("cpus_per_gpu", 1)),
        max_gpus_per_node=int(raw.get("max_gpus_per_node", 8)),
        setup=tuple(raw.get("setup", ())),
        directives=tuple(directives),
        fields=dict(raw.get("fields", {})),
        variants=variants,
        gpu=str(raw.get("gpu", "")),
        host_mem_per_gpu_gb=float(raw.get("host_mem_per_gpu_gb", 0.0)),
    )
