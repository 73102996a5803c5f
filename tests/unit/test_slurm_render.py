"""Job scripts render for every profile and shape, and nothing a user types runs as a command.

No cluster needed: these check the text (and bash's parse of it).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cluster.job import Job
from helpers.cluster.jobscript import JobSpec, check_time, render
from helpers.cluster.profiles import ProfileError, load_profile, profile_names

# Placeholder values for the fields only a user knows, clearly fake.
USER_VALUES = {
    "engaging": {"env": "MY_ENV"},
    "perlmutter": {"account": "MY_ACCOUNT"},
    "jean-zay": {"project": "MY_PROJECT"},
    "local": {},
}
SHAPES = [(1, 1, "single"), (1, 4, "node"), (2, 4, "multinode")]
HOSTILE = [
    "a b",
    "name\n",
    "m1\n#SBATCH --x",
    "$(touch /tmp/pwned)",
    "x'y",
    'x"y',
    "a\nb",
    "`id`",
    "a;b",
    "../up",
    "",
]


def spec(profile: str, nodes: int, gpus: int, **kw) -> JobSpec:
    p = load_profile(profile)
    base = dict(
        name="demo",
        profile=p,
        values=p.values(USER_VALUES[profile]),
        nodes=nodes,
        gpus_per_node=gpus,
        program="/runs/demo/1/program.py",
        run_dir="/runs/demo/1",
    )
    return JobSpec(**{**base, **kw})


def test_the_four_profiles_exist():
    assert {"engaging", "perlmutter", "jean-zay", "local"} <= set(profile_names())


@pytest.mark.parametrize("profile", ["engaging", "perlmutter", "jean-zay", "local"])
@pytest.mark.parametrize("nodes,gpus,shape", SHAPES)
def test_every_shape_renders_for_every_profile(profile, nodes, gpus, shape, tmp_path):
    text = render(spec(profile, nodes, gpus, nsys=True, nccl_debug=True))
    assert text.startswith("#!/bin/bash\n")
    assert f"shape '{shape}'" in text
    assert f"#SBATCH --nodes={nodes}" in text
    assert "export WORKBOOK_METRICS=/runs/demo/1/metrics.json" in text
    assert "NCCL_DEBUG=INFO" in text and "nsys profile" in text
    last = [ln for ln in text.splitlines() if "program.py" in ln][-1]
    if shape == "single":
        assert last.endswith("python /runs/demo/1/program.py")
    else:
        assert "--rdzv-backend=c10d" in last and f"--nproc-per-node={gpus}" in last
        assert "--rdzv-id=$SLURM_JOB_ID" in last
    if shape == "node":
        assert "--nnodes=1" in last and "--rdzv-endpoint=localhost:$PORT" in last
    if shape == "multinode":
        assert last.startswith("srun ") and "--nnodes=$SLURM_NNODES" in last
        assert "--rdzv-endpoint=$MASTER_IP:$PORT" in last
        assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0  # bash parses it


def test_profile_specific_lines():
    eng = render(spec("engaging", 1, 4))
    assert "#SBATCH --partition=mit_normal_gpu" in eng and "--gres=gpu:h200:4" in eng
    assert "module load miniforge/24.3.0-0" in eng and "source activate MY_ENV" in eng
    l40s = render(spec("engaging", 1, 2, values=load_profile("engaging").values(
        {"env": "MY_ENV", "gpu_type": ""})))  # fmt: skip
    assert "--gres=gpu:2 " in l40s  # the default L40S: untyped gres
    per = render(spec("perlmutter", 2, 4))
    for line in ("--constraint=gpu", "--qos=regular", "--account=MY_ACCOUNT", "--gpus-per-node=4"):
        assert f"#SBATCH {line}" in per
    assert "module load pytorch" in per
    jz = render(spec("jean-zay", 1, 4))
    for line in ("--constraint=h100", "--account=MY_PROJECT@h100", "--hint=nomultithread",
                 "--gres=gpu:4"):  # fmt: skip
        assert f"#SBATCH {line}" in jz
    assert "module load pytorch-gpu/py3/" in jz


def test_memory_scales_with_gpus_and_partial_nodes_get_their_own_qos(tmp_path, monkeypatch):
    """Engaging asks for 20GB per GPU rank; Perlmutter's 1-2 GPU jobs on one node use the
    shared QOS (charged for their share), every other job the regular one (whole nodes)."""
    mem = {g: re.search(r"--mem=(\S+)", render(spec("engaging", 1, g))).group(1) for g in (1, 2, 4)}
    assert mem == {1: "20GB", 2: "40GB", 4: "80GB"}
    assert "--mem=80GB" in render(spec("engaging", 2, 4))  # per node, not per job
    qos = {(n, g): re.search(r"--qos=(\w+)", render(spec("perlmutter", n, g))).group(1)
           for n, g in ((1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 4))}  # fmt: skip
    assert qos == {(1, 1): "shared", (1, 2): "shared", (1, 3): "regular", (1, 4): "regular",
                   (2, 1): "regular", (2, 4): "regular"}  # fmt: skip
    values = load_profile("engaging").values({"env": "E", "mem_per_gpu": "lots"})
    with pytest.raises(ProfileError, match="whole number and a unit"):
        render(spec("engaging", 1, 1, values=values))
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\ngpu_request = "--gres=gpu:{gpus}"\n[[directive]]\nflag = "--qos"\n'
                   'value = "a"\n[directive.partial_node]\nvalue = "b"\n')  # fmt: skip
    monkeypatch.setenv("WORKBOOK_PROFILES", str(tmp_path))
    with pytest.raises(ProfileError, match="max_gpus"):
        load_profile("bad")


def test_local_profile_uses_this_interpreter():
    text = render(spec("local", 1, 2))
    assert f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH" in text
    assert "#SBATCH --partition=workbook" in text


@pytest.mark.parametrize("profile,field", [("perlmutter", "account"), ("engaging", "env"),
                                           ("jean-zay", "project")])  # fmt: skip
def test_missing_user_value_names_profile_field_and_how(profile, field, monkeypatch):
    for var in ("WORKBOOK_ACCOUNT", "WORKBOOK_CONDA_ENV", "WORKBOOK_IDRIS_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ProfileError) as e:
        load_profile(profile).values({})
    msg = str(e.value)
    assert repr(profile) in msg and repr(field) in msg and "--set" in msg and "export" in msg


def test_user_value_from_environment(monkeypatch):
    monkeypatch.setenv("WORKBOOK_ACCOUNT", "m9999_g")
    assert load_profile("perlmutter").values({})["account"] == "m9999_g"


def test_unknown_profile_lists_known_ones():
    with pytest.raises(ProfileError, match="known profiles: .*engaging.*local.*perlmutter"):
        load_profile("frontier")


def test_unknown_field_and_bad_choice_are_clear():
    with pytest.raises(ProfileError, match="has no field"):
        load_profile("perlmutter").values({"account": "m1", "acount": "typo"})
    with pytest.raises(ProfileError, match="not one of"):
        load_profile("jean-zay").values({"project": "abc", "arch": "v100"})


@pytest.mark.parametrize("bad", HOSTILE)
def test_hostile_job_name_is_rejected(bad):
    with pytest.raises(ValueError, match="invalid run name"):
        render(spec("local", 1, 1, name=bad))


@pytest.mark.parametrize("bad", [v for v in HOSTILE if v and v != "../up"])
def test_hostile_profile_value_is_rejected(bad):
    with pytest.raises(ProfileError, match="not allowed"):
        load_profile("perlmutter").values({"account": bad})


def test_hostile_arguments_and_paths_are_inert(tmp_path):
    marker = tmp_path / "pwned"
    args = [f"$(touch {marker})", f"; touch {marker}", "it's", "a\nb", "`touch x`"]
    program = str(tmp_path / "my dir" / "p.py")
    text = render(spec("local", 1, 1, program=program, args=args, run_dir=str(tmp_path / "my dir")))
    launch = text.split("runs as rank 0 of 1).\n")[1]
    # bash sees exactly these words: the program path and the literal arguments...
    assert shlex.split(launch) == ["python", program, *args]
    # ...and running the line (python replaced by printf) executes none of them.
    out = subprocess.run(["bash", "-c", "python() { printf '<%s>' \"$@\"; }\n" + launch],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert not marker.exists() and not (tmp_path / "x").exists()
    assert out.stdout == "".join(f"<{a}>" for a in [program, *args])


def test_bad_resources_are_clear():
    with pytest.raises(ValueError, match="invalid time limit"):
        check_time("ten minutes")
    with pytest.raises(ValueError, match="at most 4 GPUs per node.*nodes=2"):
        render(spec("perlmutter", 1, 8))
    with pytest.raises(ValueError, match="nodes must be a whole number"):
        render(spec("local", 0, 1))


def test_write_only_mode_without_slurm(tmp_path, monkeypatch, capsys):
    """No sbatch on PATH: submit() writes the job, says how to run it locally, and returns None."""
    monkeypatch.setenv("PATH", "/nonexistent")
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    job = Job("wo", prog, nodes=1, gpus_per_node=2)
    assert job.submit() is None
    out = capsys.readouterr().out
    assert "write-only mode: no sbatch on PATH" in out
    assert "helpers.launch.run(" in out and "torchrun --nnodes=1 --nproc-per-node=2" in out
    assert job.script.is_file() and (job.run_dir / "program.py").read_text() == "print('hi')\n"
    assert job.result() is None and job.status() == "NOT_SUBMITTED"
    # Re-running the cell reuses the written job; a changed program is a new one.
    again = Job("wo", prog, nodes=1, gpus_per_node=2)
    assert again.run_dir == job.run_dir and again.key == job.key
    prog.write_text("print('changed')\n")
    changed = Job("wo", prog, nodes=1, gpus_per_node=2)
    assert changed.key != job.key and changed.script is None  # not written yet
    # Asked for its directory before its text (a notebook's header line), a job writes itself
    # first: the path printed is the one the job is in, never None (review m1).
    assert changed.run_dir != job.run_dir and (changed.run_dir / "job.sh").is_file()
    assert changed.text() == (changed.run_dir / "job.sh").read_text()
    assert os.environ["PATH"] == "/nonexistent"


def test_a_job_directory_is_the_job_it_names_only_files_beside_it(tmp_path, monkeypatch):
    """job.sh names its program, its files and its metrics relative to its own directory,
    so the directory, copied anywhere (a cluster's scratch), is submitted from there."""
    import json
    import shutil

    monkeypatch.setenv("WORKBOOK_RUNS", str(tmp_path / "runs"))
    prog, conf = tmp_path / "train.py", tmp_path / "ds_config.json"
    prog.write_text("import json\nprint(json.load(open('ds_config.json')))\n")
    conf.write_text("{}")
    job = Job(
        "ds",
        prog,
        nodes=1,
        gpus_per_node=4,
        profile="engaging",
        launcher="deepspeed",
        values={"env": "E"},
        files=[conf],
        args=["--deepspeed_config", "ds_config.json"],
    )
    text = job.text()
    assert str(tmp_path) not in text  # no path of this machine in the script
    assert text.splitlines()[-1].endswith("program.py --deepspeed_config ds_config.json")
    assert "export WORKBOOK_METRICS=metrics.json" in text
    moved = shutil.copytree(job.run_dir, tmp_path / "elsewhere")
    assert {"job.sh", "program.py", "ds_config.json", "job.json"} <= {
        p.name for p in moved.iterdir()
    }
    manifest = json.loads((moved / "job.json").read_text())
    assert (
        manifest["gpu"] == "h200"
        and manifest["mem"] == "80GB"  # 20GB per GPU x 4 GPUs, as the script says
        and manifest["launcher"] == "deepspeed"
    )
    assert manifest["files"] == ["ds_config.json"] and manifest["args"][-1] == "ds_config.json"


def test_profiles_name_the_gpu_of_each_variant():
    engaging, jz = load_profile("engaging"), load_profile("jean-zay")
    gpus = [engaging.facts(v)["gpu"] for v in engaging.gpu_variants(engaging.values({"env": "E"}))]
    assert gpus == ["h200", "l40s"]  # --gres=gpu:h200:N, or the default L40S
    values = jz.values({"project": "p"})
    assert [jz.facts(v)["gpu"] for v in jz.gpu_variants(values)] == ["h100", "a100-80"]
    assert jz.facts({**values, "arch": "a100"})["host_mem_per_gpu_gb"] == 64


def test_logs_per_rank_when_two_ranks_share_a_line(tmp_path, monkeypatch):
    """Ranks print into one slurm-<id>.out; a print is two writes, so lines can merge."""
    monkeypatch.setenv("PATH", "/nonexistent")
    prog = tmp_path / "prog.py"
    prog.write_text("print('hi')\n")
    job = Job("lg", prog, nodes=1, gpus_per_node=2)
    job.submit()  # write-only: gives the job its run directory
    job.job_id = "42"
    job.log_path.write_text(
        "job 42 on 1 node(s)\n[rank0] sum=3.0 on node1[rank1] sum=3.0 on node1\n\n[rank1] bye\n"
    )
    assert job.logs(rank=0) == "[rank0] sum=3.0 on node1"
    assert job.logs(rank=1) == "[rank1] sum=3.0 on node1\n[rank1] bye"
    assert job.logs(tail=1) == "[rank1] bye"


@pytest.mark.parametrize(
    "line,message",
    [
        ("", "required: name"),
        ("x --nodes two", "invalid int value"),
        ("x --bogus", "unrecognized arguments: --bogus"),
        ("x --submit --write-only", "choose one of --submit and --write-only"),
        ("x --as 1a", "Python variable name"),
        ("x --set account", "FIELD=VALUE"),
        ("x$(id)", "invalid run name"),
    ],
)
def test_sbatch_magic_bad_lines_are_clear(line, message, tmp_path, monkeypatch):
    from helpers.notebook.sbatch_cell import sbatch_magic

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)):
        sbatch_magic(line, "print(1)\n", None)


def test_sbatch_magic_write_only_saves_the_cell_and_the_job(tmp_path, monkeypatch, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from helpers.notebook.sbatch_cell import sbatch_magic

    monkeypatch.chdir(tmp_path)
    shell = InteractiveShell.instance()
    line = "train --nodes 2 --gpus-per-node 4 --profile perlmutter --set account=m1_g --write-only"
    job = sbatch_magic(line + " --as pm", "print('hello')\n", shell)
    assert shell.user_ns["pm"] is job and job.job_id is None
    assert (tmp_path / "programs" / "train.py").read_text() == "print('hello')\n"
    text = job.script.read_text()
    assert "#SBATCH --account=m1_g" in text and text.rstrip().endswith(" program.py")
    assert "write-only" in capsys.readouterr().out


def test_jean_zay_node_shape_follows_the_gpu_type():
    p = load_profile("jean-zay")
    a100 = dict(name="demo", profile=p, values=p.values({"project": "abc", "arch": "a100"}))
    text = render(JobSpec(**a100, nodes=1, gpus_per_node=8))
    for line in ("--constraint=a100", "--account=abc@a100", "--gres=gpu:8", "--cpus-per-task=64"):
        assert f"#SBATCH {line}" in text
    four = render(JobSpec(**a100, nodes=1, gpus_per_node=4))
    assert "#SBATCH --cpus-per-task=32" in four  # 8 cores per A100, not the H100's 24
    h100 = dict(name="demo", profile=p, values=p.values({"project": "abc", "arch": "h100"}))
    assert "#SBATCH --cpus-per-task=96" in render(JobSpec(**h100, nodes=1, gpus_per_node=4))
    with pytest.raises(ValueError, match="arch=h100.*at most 4 GPUs"):
        render(JobSpec(**h100, nodes=1, gpus_per_node=8))


def test_local_jobs_import_helpers_from_this_checkout():
    text = render(spec("local", 1, 2))
    root = Path(__file__).resolve().parents[2]
    assert f"export PYTHONPATH={shlex.quote(str(root))}" in text
    assert (root / "helpers" / "__init__.py").is_file()


def test_sbatch_magic_under_nbgrader_writes_but_never_submits(tmp_path, monkeypatch, capsys):
    from helpers.notebook.sbatch_cell import sbatch_magic

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    # --submit is ignored too: an autograde run must never queue (or wait on) a job.
    job = sbatch_magic("graded --profile local --submit", "print(1)\n", None)
    assert job.job_id is None and job.script.is_file()
    assert "nbgrader autograde: wrote" in capsys.readouterr().out


def test_a_job_carries_the_modules_its_program_imports(tmp_path):
    from helpers.cluster import Job

    progs = tmp_path / "programs"
    progs.mkdir()
    (progs / "ring.py").write_text("from helper_of_ring import K\n")
    (progs / "helper_of_ring.py").write_text("K = 1\n")
    (progs / "unrelated.py").write_text("raise SystemExit\n")
    (progs / "bench.py").write_text("import os\nfrom ring import K\n")
    job = Job("bench_carry", progs / "bench.py", profile="local")
    job.write()
    copied = sorted(p.name for p in job.run_dir.glob("*.py"))
    assert copied == ["helper_of_ring.py", "program.py", "ring.py"]
    # The learner edits their solution: a different job (not a re-attach to the old one).
    (progs / "ring.py").write_text("from helper_of_ring import K\nK2 = 2\n")
    assert Job("bench_carry", progs / "bench.py", profile="local").key != job.key


def test_a_job_whose_program_does_not_parse_says_where(tmp_path):
    from helpers.cluster import Job

    (tmp_path / "bad.py").write_text("def f(:\n")
    with pytest.raises(SyntaxError, match="bad.py line 1"):
        Job("bad_syntax", tmp_path / "bad.py", profile="local")
