"""nbgrader configuration for the workbook's labs (nbgrader 0.9.6).

Layout (run nbgrader from the top of the checkout):

    solutions/<lab>/<lab>.ipynb    instructor version: solutions + hidden tests (source)
    labs/<lab>/<lab>.ipynb         student version, generated, committed (release)
    submitted/ autograded/ feedback/   grading work areas, git-ignored

Regenerate labs/ with ``python -m helpers.labs release`` (it calls
``nbgrader generate_assignment`` with this file). Instructors grade with the
usual commands, e.g. ``nbgrader collect lab0`` then ``nbgrader autograde lab0``.
"""

c = get_config()  # noqa: F821 - injected by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "pdl-workbook"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

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
# first spawn in a fresh kernel imports torch in every rank. nbgrader's default
# of 30 s per cell is too short for that on a 2-core laptop.
c.Execute.timeout = 600
c.Execute.kernel_name = "python3"
