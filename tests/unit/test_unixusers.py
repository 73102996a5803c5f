"""The search bit that lets fresh Unix users reach the interpreter comes off only when the
last holder is done, in whichever process (test_classroom and test_hub run side by side)."""

import multiprocessing
import stat
from pathlib import Path

import pytest
import unixusers


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private folder (0700) with a subfolder, and a state file of this test's own."""
    monkeypatch.setattr(unixusers, "STATE", tmp_path / "state.json")
    monkeypatch.setattr(unixusers, "LOCK", tmp_path / "state.lock")
    top = tmp_path / "home"
    (top / "inner").mkdir(parents=True)
    top.chmod(0o700)
    return top


def _hold(path, started, release):
    with unixusers.searchable(path):
        started.set()
        release.wait(10)


def _searchable_bit(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXOTH)


def test_the_bit_stays_while_another_process_holds_it(home):
    target = home / "inner" / "python"
    ctx = multiprocessing.get_context("fork")  # the child sees the patched paths
    started, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(target, started, release))
    other.start()
    try:
        assert started.wait(10)
        assert _searchable_bit(home)
        with unixusers.searchable(target):
            assert _searchable_bit(home)
        assert _searchable_bit(home), "the other process still needs it"
    finally:
        release.set()
        other.join(10)
    with unixusers.searchable(target):
        pass  # the last holder leaves: the mode comes back
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_a_dead_holder_does_not_keep_the_bit(home):
    unixusers.STATE.write_text('{"holders": {"gone": 999999999}, "modes": {}}')
    with unixusers.searchable(home / "inner" / "python"):
        assert _searchable_bit(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
