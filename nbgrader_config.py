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

# No kernel runs a lab when it is graded or validated (see below); these apply to the
# notebooks an instructor may still execute with nbgrader's Execute elsewhere.
c.Execute.timeout = 120
c.Execute.kernel_name = "python3"

# Grading (helpers/course/grading/grader/): no kernel runs a lab. GradeInSandbox takes the
# place of nbgrader's Execute in autograde and in Validate: the lab's tests, their reference
# functions and the verdict run in nbgrader's own process, where no learner code runs; the
# learner's cells run only in bubblewrap sandboxes (helpers/course/grading/sandbox/), as
# user nobody, and their ranks talk only through the grader (helpers/course/grading/relay/),
# which records every message. The guard (helpers/course/grading/guard.py) still reads every
# learner cell first, for a clear early message: a cell that imports what its lab refuses
# (solutions/<lab>/grading.toml) is not run, and the grades CSV (`nbgrader export`) says why
# in its `refused` column. See docs/instructors.md, "What runs where, as whom".
# Other preprocessors of helpers/course/grading/preprocessors.py:
# - feedback shows a hidden test's result and message, never its code or traceback
#   (GetGrades must come first: it reads scores by cell);
# - a graded cell a learner copied (two cells, one grade_id) no longer aborts the
#   grading of every learner after them.
try:
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, GetGrades
    from nbgrader.preprocessors import OverwriteCells, OverwriteKernelspec

    from helpers.course.grading.grader.preprocessor import configure as grade_in_sandbox
    from helpers.course.grading.export import CsvWithRefusals
    from helpers.course.grading.preprocessors import DropDuplicateIds, HideHiddenTests
except ImportError:  # a learner's environment without the workbook package: not needed
    pass
else:
    grade_in_sandbox(c)
    c.ExportApp.plugin_class = CsvWithRefusals
    c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor]
    c.Autograde.sanitize_preprocessors = [
        ClearOutput,
        DropDuplicateIds,
        OverwriteKernelspec,
        OverwriteCells,
        CheckCellMetadata,
    ]
