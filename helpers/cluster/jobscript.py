"""Job scripts: render a program, its resources and a cluster profile into sbatch text.

Three shapes, chosen from the resources (templates in ``slurm/templates``)::

    nodes=1, gpus_per_node=1   single.sh.j2     python prog.py
    nodes=1, gpus_per_node=G   node.sh.j2       torchrun --nnodes=1 --nproc-per-node=G
                                                  --rdzv-endpoint=localhost:$PORT ...
    nodes=N, gpus_per_node=G   multinode.sh.j2  srun torchrun --nnodes=$SLURM_NNODES
                                                  --rdzv-endpoint=$MASTER_IP:$PORT ...

The torchrun line comes from ``helpers.launch.torchrun_command``, the same
function the laptop launcher uses, so a job runs exactly the local command.

Shell safety: the job name must pass ``helpers.runs.check_name``; profile
values must be plain words (``helpers.cluster.profiles``); the program path, its
arguments and every path in the script body are ``shlex.quote``d; the output
file is relative (``slurm-%j.out``) so no path appears in an ``#SBATCH`` line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from helpers.cluster.profiles import Profile, ProfileError, profiles_dir
from helpers.launch import torchrun_command
from helpers.runs import check_name

__all__ = [
    "JobSpec",
    "render",
    "preview",
    "shape_of",
    "check_time",
    "check_job_name",
    "check_signal",
    "templates_dir",
    "PORT_BASE",
    "directive_value",
    "sbatch_value",
]

PORT_BASE = 29500  # rendezvous port = PORT_BASE + job id % 20000
_TIME = re.compile(r"(\d+-)?\d{1,3}(:\d{2}){0,2}")
_SIGNAL = re.compile(r"(?:B:)?(USR1|USR2|TERM|INT)@(\d{1,5})")


def templates_dir() -> Path:
    return profiles_dir().parent / "templates"


def check_time(time: str) -> str:
    """Slurm's --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    if not isinstance(time, str) or not _TIME.fullmatch(time):
        raise ValueError(
            f"invalid time limit {time!r}: use HH:MM:SS (e.g. '00:10:00') or D-HH:MM:SS"
        )
    return time


@dataclass(frozen=True)
class JobSpec:
    """Everything a job script depends on (and nothing else: it is hashed)."""

    name: str
    profile: Profile
    values: dict = field(default_factory=dict)  # resolved profile fields
    nodes: int = 1
    gpus_per_node: int = 1
    time: str = "00:10:00"
    program: str = "program.py"  # path as the job will see it
    args: Sequence[str] = ()
    run_dir: str | None = None  # where metrics and profiles go (None: not known yet)
    nsys: bool = False
    nccl_debug: bool = False
    # Preemption: signal="USR1@90" asks Slurm for SIGUSR1 90 s before the time limit
    # (to the batch shell, which passes it to the ranks); requeue=True lets the job
    # go back to the queue after it was preempted, requeued, or stopped by the signal.
    signal: str = ""
    requeue: bool = False
    # "deepspeed": one node starts its ranks with DeepSpeed's own launcher (seed 000's
    # recipe); several nodes keep srun + torchrun, which deepspeed.init_distributed reads.
    # "python": one process with every GPU of the node (a tool that starts its own ranks).
    launcher: str = "torchrun"


def check_signal(signal: str) -> tuple[str, int] | None:
    """'USR1@90' (or 'B:USR1@90') -> ("USR1", 90); '' -> None."""
    if not signal:
        return None
    m = _SIGNAL.fullmatch(signal) if isinstance(signal, str) else None
    if not m:
        raise ValueError(
            f"invalid signal {signal!r}: use NAME@SECONDS with NAME one of USR1, USR2, TERM, "
            "INT, e.g. 'USR1@90' (SIGUSR1 90 s before the time limit)"
        )
    return m.group(1), int(m.group(2))


def shape_of(nodes: int, gpus_per_node: int) -> str:
    if nodes == 1 and gpus_per_node == 1:
        return "single"
    return "node" if nodes == 1 else "multinode"


def check_job_name(name: str) -> str:
    """helpers.runs.check_name, plus no trailing newline (which '$' in a regex lets through)."""
    if isinstance(name, str) and name != name.strip():
        raise ValueError(f"invalid run name {name!r}: no spaces or newlines")
    return check_name(name)


def _check(spec: JobSpec) -> None:
    check_job_name(spec.name)
    check_time(spec.time)
    check_signal(spec.signal)
    if spec.launcher not in ("torchrun", "deepspeed", "python"):
        raise ValueError(
            f"launcher must be 'torchrun', 'deepspeed' or 'python', got {spec.launcher!r}"
        )
    if spec.launcher == "python" and spec.nodes > 1:
        raise ValueError("launcher='python' starts one process: use nodes=1")
    for what, n in (("nodes", spec.nodes), ("gpus_per_node", spec.gpus_per_node)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{what} must be a whole number >= 1, got {n!r}")
    top, _ = spec.profile.node_facts(spec.values)
    if spec.gpus_per_node > top:
        raise ValueError(
            f"profile {spec.profile.name!r} ({_variant_note(spec)}) has at most {top} GPUs "
            f"per node, asked for "
            f"{spec.gpus_per_node}: use more nodes (nodes={-(-spec.gpus_per_node // top)}, "
            f"gpus_per_node={top})"
        )


def _variant_note(spec: JobSpec) -> str:
    keys = sorted(spec.profile.variants)
    return ", ".join(f"{k}={spec.values.get(k)}" for k in keys) or "its nodes"


def _directives(spec: JobSpec) -> list[dict]:
    """The #SBATCH lines: resources first, then the profile's own lines."""
    p, g = spec.profile, spec.gpus_per_node
    _, cpus_per_gpu = p.node_facts(spec.values)
    typed = f"{spec.values['gpu_type']}:{g}" if spec.values.get("gpu_type") else str(g)
    gpu_values = {**spec.values, "gpus": str(g), "typed_gpus": typed}
    lines = [
        (f"--job-name={spec.name}", ""),
        (f"--nodes={spec.nodes}", ""),
        ("--ntasks-per-node=1", "one launcher per node: python or torchrun starts the ranks"),
        (f"--cpus-per-task={cpus_per_gpu * g}", f"{cpus_per_gpu} CPU(s) per GPU rank"),
        (p.fill(p.gpu_request, gpu_values, quote=False), f"{g} GPU(s) on each node"),
        (f"--time={spec.time}", "wall-clock limit: the job is killed after it"),
        ("--output=slurm-%j.out", "stdout and stderr, relative to the submit directory"),
    ]
    warn = check_signal(spec.signal)
    if warn:
        lines.append((f"--signal=B:{warn[0]}@{warn[1]}",
                      f"SIG{warn[0]} to the batch shell {warn[1]} s before the time limit"))  # fmt: skip
    if spec.requeue:
        lines.append(("--requeue", "back to the queue after a preemption or a node failure"))
        lines.append(("--open-mode=append", "a requeued run appends to slurm-%j.out"))
    for d in p.directives:
        value, why = directive_value(spec, d)
        lines.append((f"{d.flag}={value}" if value else d.flag, why))
    for text, _ in lines:
        if not re.fullmatch(r"--[a-z-]+(=[A-Za-z0-9_.@+:,/%=-]+)?", text):
            raise ProfileError(f"profile {p.name!r} produced an unsafe #SBATCH line: {text!r}")
    width = max(len(t) for t, _ in lines) + 2
    return [{"text": t, "why": w, "pad": width - len(t)} for t, w in lines]


def directive_value(spec: JobSpec, d) -> tuple[str, str]:
    """(value, why) of a profile directive for this job: filled, scaled by the GPUs of a node
    when ``per_gpu``, or the ``partial_node`` value when one node runs at most its max_gpus."""
    part = d.partial_node
    if part and spec.nodes == 1 and spec.gpus_per_node <= part["max_gpus"]:
        template, why = str(part["value"]), part.get("why", d.why)
    else:
        template, why = d.value, d.why
    value = spec.profile.fill(template, spec.values, quote=False)
    if d.per_gpu:
        m = re.fullmatch(r"(\d+)([KMGT]B?)", value)
        if not m:
            raise ProfileError(
                f"profile {spec.profile.name!r}: {d.flag} is per GPU, so its value must be a "
                f"whole number and a unit such as 20GB or 512M, not {value!r}"
            )
        value = f"{int(m.group(1)) * spec.gpus_per_node}{m.group(2)}"
    return value, why


def sbatch_value(spec: JobSpec, flag: str) -> str:
    """The value a profile directive gets in this job's script ('' if the profile has none)."""
    return next(
        (directive_value(spec, d)[0] for d in spec.profile.directives if d.flag == flag), ""
    )


def launch_command(spec: JobSpec) -> str:
    """The launch line of the job, shell-quoted (variables like $PORT left to the shell)."""
    program = shlex.quote(spec.program)
    args = " ".join(shlex.quote(str(a)) for a in spec.args)
    shape = shape_of(spec.nodes, spec.gpus_per_node)
    if shape == "single" or spec.launcher == "python":  # one process (it may start its own)
        return " ".join(x for x in ("python", program, args) if x)
    if shape == "node" and spec.launcher == "deepspeed":
        return " ".join(["deepspeed", f"--num_gpus={spec.gpus_per_node}", "--master_port=$PORT",
                         program, args]).rstrip()  # fmt: skip
    if shape == "node":
        cmd = torchrun_command(
            "PROGRAM",
            spec.gpus_per_node,
            nnodes=1,
            rdzv_endpoint="localhost:$PORT",
            rdzv_id="$SLURM_JOB_ID",
        )
    else:
        cmd = torchrun_command(
            "PROGRAM",
            spec.gpus_per_node,
            nnodes="$SLURM_NNODES",
            rdzv_endpoint="$MASTER_IP:$PORT",
            rdzv_id="$SLURM_JOB_ID",
        )
    head = cmd[: cmd.index("PROGRAM")]  # our own flags: safe words and $VARS, left unquoted
    return " ".join([*head, program, args]).rstrip()


def render(spec: JobSpec) -> str:
    """The job script text for ``spec`` (raises ValueError/ProfileError on bad input)."""
    _check(spec)
    p = spec.profile
    shape = shape_of(spec.nodes, spec.gpus_per_node)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,  # a missing variable is an error, not an empty string
        keep_trailing_newline=True,
        autoescape=False,  # shell, not HTML: values are quoted in Python before they get here
    )
    run_dir = spec.run_dir
    gpus = spec.nodes * spec.gpus_per_node
    title = (
        f'Job "{spec.name}": {spec.nodes} node(s) x {spec.gpus_per_node} GPU(s) '
        f"= {gpus} rank(s), shape '{shape}'"
    )
    text = env.get_template(f"{shape}.sh.j2").render(
        title=title,
        profile=p,
        directives=_directives(spec),
        setup=[p.fill(line, spec.values, quote=True) for line in p.setup],
        metrics_path=shlex.quote(str(Path(run_dir) / "metrics.json")) if run_dir else "",
        profile_prefix=shlex.quote(str(Path(run_dir) / "nsys-")) if run_dir else "nsys-",
        nsys=spec.nsys,
        nccl_debug=spec.nccl_debug,
        command=launch_command(spec),
        preemptible=bool(spec.signal or spec.requeue),
        requeue=spec.requeue,
        shape=shape,
        nodes=spec.nodes,
        gpus=spec.gpus_per_node,
        port_base=PORT_BASE,
        launcher=spec.launcher,
    )
    return text.rstrip("\n") + "\n"  # the launch line is the script's last line


def preview(
    profile: str,
    nodes: int = 1,
    gpus_per_node: int = 1,
    values: dict | None = None,
    name: str = "demo",
    program: str = "RUN_DIR/program.py",
    **options,
) -> str:
    """The script a job would get, without writing anything (for reading and teaching).

    ``values`` fills the profile's fields (account, env, ...); ``options`` are
    JobSpec fields such as time, args, nsys, nccl_debug. The run directory is
    shown as RUN_DIR: a job written by helpers.cluster.job keeps its program, its
    script and its output there, so the script works when submitted from it.
    """
    from helpers.cluster.profiles import load_profile

    p = load_profile(profile)
    spec = JobSpec(name=name, profile=p, values=p.values(values), nodes=nodes,
                   gpus_per_node=gpus_per_node, program=program, run_dir="RUN_DIR", **options)  # fmt: skip
    return render(spec)
