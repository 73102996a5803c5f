"""helpers.runs (run directories, metrics) and helpers.config (dataclass + argv)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from helpers import runs
from helpers.config import parse, to_args

# --------------------------------------------------------------------------- runs


@pytest.mark.parametrize("name", ["ddp", "lab1-resnet", "a.b_c", "0start", "x" * 64])
def test_check_name_accepts_plain_names(name):
    assert runs.check_name(name) == name


@pytest.mark.parametrize("name", ["", "has space", "../up", "a/b", "$HOME", "-flag", "x" * 65, 3])
def test_check_name_rejects_unsafe_names_with_advice(name):
    with pytest.raises(ValueError, match="letters, digits"):
        runs.check_name(name)


def test_new_run_dir_never_reuses_a_directory(tmp_path):
    dirs = [runs.new_run_dir("demo", root=tmp_path) for _ in range(30)]
    assert len(set(dirs)) == 30
    assert all(d.is_dir() and d.parent == tmp_path / "demo" for d in dirs)
    (dirs[0] / "keep.txt").write_text("mine")
    runs.new_run_dir("demo", root=tmp_path)
    assert (dirs[0] / "keep.txt").read_text() == "mine"
    assert len(runs.list_runs("demo", root=tmp_path)) == 31
    assert runs.list_runs("never", root=tmp_path) == []


def test_list_runs_returns_launches_in_the_order_they_started(tmp_path):
    # Many launches within one second: the order must still be the creation order.
    made = [runs.new_run_dir("fast", root=tmp_path) for _ in range(50)]
    assert runs.list_runs("fast", root=tmp_path) == made
    assert made[-1].name > made[0].name


def test_runs_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(runs.RUNS_ENV, str(tmp_path / "elsewhere"))
    assert runs.runs_root() == (tmp_path / "elsewhere").resolve()
    d = runs.new_run_dir("x")
    assert d.parent.parent == (tmp_path / "elsewhere").resolve()


def test_workbook_root_is_found_from_a_subdirectory(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "notebooks").mkdir()
    assert runs.workbook_root(tmp_path / "notebooks") == tmp_path.resolve()
    monkeypatch.delenv(runs.RUNS_ENV, raising=False)
    monkeypatch.chdir(tmp_path / "notebooks")
    assert runs.runs_root() == tmp_path.resolve() / "runs"


def test_metrics_round_trip_with_tensors(tmp_path, monkeypatch):
    target = tmp_path / "m" / "metrics.json"
    monkeypatch.setenv(runs.METRICS_ENV, str(target))
    written = runs.write_metrics({"loss": torch.tensor(0.5), "acc": [torch.tensor(1.0)], "n": 3})
    assert written == target
    assert runs.read_metrics(target) == {"loss": 0.5, "acc": [1.0], "n": 3}
    assert not target.with_suffix(".tmp").exists()
    assert runs.read_metrics(tmp_path / "missing.json") == {}


# --------------------------------------------------------------------------- config


@dataclass
class Cfg:
    """A test config."""

    epochs: int = 2
    lr: float = 0.05
    amp: bool = False
    model_name: str = "cnn"
    optim: str = field(default="sgd", metadata={"choices": ["sgd", "adam"]})
    seed: int | None = None


def test_parse_defaults_and_overrides():
    assert parse(Cfg, []) == Cfg()
    cfg = parse(Cfg, ["--epochs", "5", "--lr", "0.1", "--amp", "yes", "--model-name", "vit"])
    assert (cfg.epochs, cfg.lr, cfg.amp, cfg.model_name) == (5, 0.1, True, "vit")
    assert parse(Cfg, ["--model_name", "mlp"]).model_name == "mlp"
    assert parse(Cfg, ["--seed", "3"]).seed == 3


@pytest.mark.parametrize("word,value", [("true", True), ("0", False), ("No", False), ("on", True)])
def test_parse_bools(word, value):
    assert parse(Cfg, ["--amp", word]).amp is value


@pytest.mark.parametrize(
    "argv", [["--epochs-typo", "3"], ["--amp", "maybe"], ["--optim", "lbfgs"], ["--epochs", "two"]]
)
def test_parse_rejects_bad_input(argv, capsys):
    with pytest.raises(SystemExit):
        parse(Cfg, argv)
    assert "usage" in capsys.readouterr().err  # argparse names the valid options


def test_parse_needs_a_dataclass():
    with pytest.raises(TypeError, match="not a dataclass"):
        parse(dict, [])


def test_to_args_round_trips():
    cfg = Cfg(epochs=7, lr=0.2, amp=True, model_name="vit", optim="adam")
    assert parse(Cfg, to_args(cfg)) == cfg  # seed=None is left out, not written as "None"
    assert parse(Cfg, to_args(Cfg(seed=4))) == Cfg(seed=4)
