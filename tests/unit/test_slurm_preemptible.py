"""Preemptible job scripts: the #SBATCH lines asked for, the signal passed on, valid bash."""

from __future__ import annotations

import subprocess

import pytest

from helpers.cluster.jobscript import preview


@pytest.mark.parametrize("nodes,gpus,forward", [
    (1, 1, 'kill -s "$1" "$launcher"'),
    (1, 2, 'pkill -"$1" -P "$launcher"'),
    (2, 2, 'kill -s TERM "$launcher"'),
])  # fmt: skip
def test_signal_and_requeue_lines_and_the_script_passes_the_signal_on(nodes, gpus, forward):
    text = preview("local", nodes, gpus, signal="USR1@90", requeue=True)
    for line in ("#SBATCH --signal=B:USR1@90", "#SBATCH --requeue", "#SBATCH --open-mode=append"):
        assert line in text
    assert forward in text and "trap 'pass_on USR1' USR1" in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text
    launch = next(ln for ln in text.splitlines() if "program.py" in ln and "RUN_DIR" in ln)
    assert launch.endswith(" &")  # in the background: bash runs traps only between commands
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_without_the_options_nothing_changes():
    text = preview("local", 1, 2)
    assert "--signal" not in text and "--requeue" not in text and "trap" not in text
    assert text.rstrip().endswith("RUN_DIR/program.py")  # the launch line is still the last


def test_signal_without_requeue_says_how_to_resume():
    text = preview("local", 1, 2, signal="B:USR2@30")
    assert "#SBATCH --signal=B:USR2@30" in text and "#SBATCH --requeue" not in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' not in text and "resubmit to resume" in text


@pytest.mark.parametrize("bad", ["USR1", "USR1@", "KILL@90", "USR1@90; rm -rf /", "usr1@90"])
def test_bad_signal_is_rejected_with_the_form_to_use(bad):
    with pytest.raises(ValueError, match="NAME@SECONDS"):
        preview("local", 1, 2, signal=bad)
