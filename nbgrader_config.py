"""nbgrader configuration for the workbook's labs (nbgrader 0.9.6).

Layout (run nbgrader from the top of the checkout):

    solutions/<lab>/<lab>.ipynb    instructor version: solutions + hidden tests (source)
    labs/<lab>/<lab>.ipynb         student version, generated, committed (release)
    submitted/ autograded/ feedback/   grading work areas, git-ignored

Regenerate labs/ with ``python -m helpers.course.grading.labs release`` (it calls
``nbgrader generate_assignment`` with this file). Instructors grade with the
usual commands, e.g. ``nbgrader collect lab0`` then ``nbgrader autograde lab0``.
"""

import os

c = get_config()  # noqa: F821 - injected by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "pdl-workbook"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

# The exchange: where release_assignment puts labs, submit puts submissions and
# release_feedback puts feedback, on storage every learner can reach (see
# docs/instructors.md for its permissions). Learners name the same directory in
# their own ~/.jupyter/nbgrader_config.py.
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")

# Files next to a solution that are for instructors and CI only: the wrong
# answer the grading tests submit must not be copied into the student release.
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints",
    "*.pyc",
    "__pycache__",
    "feedback",
    "wrong_answers.py",
]

# Lab cells start several torch.distributed ranks (helpers.launch.spawn); the
# first spawn in a fresh kernel imports torch once (a few seconds), so nbgrader's
# default of 30 s per cell is too short on a busy 2-core laptop. A cell that runs
# longer than this (a learner's infinite loop) is interrupted and fails its test
# only; the rest of the notebook and the other submissions are still graded.
c.Execute.timeout = 120
c.Execute.kernel_name = "python3"

# Grading preprocessors of helpers/course/grading/preprocessors.py:
# - feedback shows a hidden test's result and message, never its code or traceback
#   (GetGrades must come first: it reads scores by cell);
# - a graded cell a learner copied (two cells, one grade_id) no longer aborts the
#   grading of every learner after them.
# The guard (helpers/course/grading/guard.py) reads every learner cell before the kernel runs
# it, in autograde and Validate: a cell that reaches into the kernel or the grader, or
# imports what its lab refuses (solutions/<lab>/grading.toml), is not run, and the
# grades CSV (`nbgrader export`) says why in its `refused` column.
try:
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, GetGrades
    from nbgrader.preprocessors import OverwriteCells, OverwriteKernelspec

    from helpers.course.grading import guard
    from helpers.course.grading.export import CsvWithRefusals
    from helpers.course.grading.preprocessors import DropDuplicateIds, HideHiddenTests
except ImportError:  # a learner's environment without the workbook package: not needed
    pass
else:
    guard.configure(c)
    c.ExportApp.plugin_class = CsvWithRefusals
    c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor]
    c.Autograde.sanitize_preprocessors = [
        ClearOutput,
        DropDuplicateIds,
        OverwriteKernelspec,
        OverwriteCells,
        CheckCellMetadata,
    ]
