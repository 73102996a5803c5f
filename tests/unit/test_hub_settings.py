"""The hub's settings, class list and JupyterLab job script (no hub, no Slurm needed)."""

from __future__ import annotations

import pytest

from helpers.course.hub import workshop as hub


def _settings(tmp_path, **env):
    return hub.settings_from_env({"HUB_CLASS": str(tmp_path / "class.txt"),
                                  "WORKBOOK_HUB_STATE": str(tmp_path / "state"), **env})  # fmt: skip


def test_a_bad_setting_names_the_variable_to_change(tmp_path):
    with pytest.raises(ValueError, match="HUB_CLASS"):
        hub.settings_from_env({})
    for var, value in (("HUB_TIME", "90 minutes"), ("HUB_MEM", "8 GB"), ("HUB_CPUS", "0"),
                       ("HUB_RESERVATION", "x;rm"), ("HUB_URL", "127.0.0.1:8000")):  # fmt: skip
        with pytest.raises(ValueError, match=var):
            _settings(tmp_path, **{var: value})


def test_the_class_list_wants_unix_users_and_an_instructor(tmp_path):
    path = tmp_path / "class.txt"
    path.write_text("root instructor  # the course owner\n\nroot\n")
    assert hub.read_class(path) == {"learner": ["root"], "instructor": ["root"]}
    path.write_text("nosuchuser123 learner\nroot instructor\n")
    with pytest.raises(ValueError, match="line 1: no Unix user 'nosuchuser123'"):
        hub.read_class(path)
    path.write_text("root teacher\n")
    with pytest.raises(ValueError, match="'NAME learner' or 'NAME instructor'"):
        hub.read_class(path)
    path.write_text("root\n")
    with pytest.raises(ValueError, match="at least one instructor"):
        hub.read_class(path)


def test_the_job_script_asks_the_profile_partition_and_carries_the_hub_tag(tmp_path):
    s = _settings(tmp_path, HUB_CPUS="2", HUB_MEM="4G", HUB_RESERVATION="class")
    script = hub.job_script(s, "abcd1234", "/opt/wb/.venv/bin")
    lines = script.splitlines()
    for want in ("--partition=workbook", "--comment=pdl-hub-abcd1234", "--cpus-per-task=2",
                 "--mem=4G", "--reservation=class", "--time=01:30:00"):  # fmt: skip
        assert f"#SBATCH {want}" in lines, script
    assert "{{cmd}}" in script and "{{keepvars}}" in script  # left to batchspawner
    assert lines[-1] == "exec {{cmd}}"
    assert "0.0.0.0" not in script


def test_learners_get_the_learner_tools_only(tmp_path):
    dirs = hub.write_configs(_settings(tmp_path), "root")
    page = (dirs["learner"] / "labconfig" / "page_config.json").read_text()
    assert "nbgrader:formgrader" in page and "nbgrader:create-assignment" in page
    assert "nbgrader:menu" not in page and "assignment-list" not in page
    assert "JupyterHubAuthPlugin" in (dirs["all"] / "nbgrader_config.py").read_text()
    assert (
        "grader.preprocessor import configure"
        in (dirs["learner"] / "nbgrader_config.py").read_text()
    )
    assert not (dirs["all"] / "labconfig" / "page_config.json").exists()
