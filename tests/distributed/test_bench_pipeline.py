"""``python -m helpers.course.bench pipeline``: bad input is refused, a tiny run prints its table."""

import pytest

from helpers.course.bench import pipeline as bench


def test_interleaved_needs_equal_chunks_and_whole_groups():
    with pytest.raises(SystemExit, match="multiple of 4"):
        bench.main(["--schedules", "interleaved", "--stages", "2", "--depth", "6"])
    with pytest.raises(SystemExit, match="--stages >= 2"):
        bench.main(["--stages", "1"])


def test_tiny_run_prints_measured_and_simulated_bubbles(capsys):
    bench.main(["--schedules", "gpipe,interleaved", "--stages", "2", "--depth", "4",
                "--microbatches", "4", "--rows", "8", "--width", "64", "--repeats", "2",
                "--steps", "1"])  # fmt: skip
    out = capsys.readouterr().out
    rows = {
        ln.split()[0]: ln.split()
        for ln in out.splitlines()
        if ln.split()[:1] in (["gpipe"], ["interleaved"])
    }
    assert sorted(rows) == ["gpipe", "interleaved"], out
    for schedule, cols in rows.items():
        measured, simulated = float(cols[4]), float(cols[5])  # bubble fractions
        assert 0 < measured < 1 and 0 < simulated < 1, (schedule, cols)
        assert sum("/" in c for c in cols[7:]) == 2, cols  # bubble meas/sim of each of 2 runs
