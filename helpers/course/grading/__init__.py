"""Lab release and grading with nbgrader, and what keeps grading honest.

    python -m helpers.course.grading.labs {release,check,roundtrip LAB}

labs.py releases labs/ from solutions/ and checks grading; roundtrip.py grades fake
students and plausible wrong answers (course_dir.py: a scratch nbgrader course; draws.py:
the hidden tests' random draws; export.py: the grades CSV; preprocessors.py: nbgrader's
extra steps; roles.py: which nbgrader tools a learner sees). guard.py reads a learner's
cell before it runs (scanner.py, refusals.py, lab_policy.py: what each lab refuses, from
solutions/<lab>/grading.toml). recorder/ records each rank's traffic for the tests, and
checks/ holds the per-lab "by hand" checks built on it. Nothing here imports the
techniques whose answers the labs ask for, except to switch them off while a learner's
code runs (pyproject.toml's "graders-never-import-answers" contract).
"""
