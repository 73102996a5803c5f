"""What the grading sandbox binds back under its empty /tmp and home: every import root."""

from __future__ import annotations

import sys

from helpers.course.grading.sandbox import bwrap


def test_a_site_directory_a_pth_file_added_is_bound_back(tmp_path, monkeypatch):
    # A class venv whose .pth borrows another venv's packages (tests/grading/test_classroom.py
    # builds one): with that venv under /tmp, the sandbox's empty /tmp hid torch from the
    # grader's ranks and every submission scored 0.
    borrowed = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    borrowed.mkdir(parents=True)
    script_dir = tmp_path / "course"
    script_dir.mkdir()
    monkeypatch.setattr(sys, "path", [str(script_dir), *sys.path, str(borrowed)])
    needed = bwrap.needed_paths()
    assert borrowed.resolve() in needed
    assert script_dir.resolve() not in needed  # never the course's own directories
