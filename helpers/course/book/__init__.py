"""The book: every notebook executed with papermill, as ``make run`` and CI do.

    python -m helpers.course.book run [--smoke] [--only PATTERN]

runner.py discovers and executes the notebooks and prints the table; headless.py is the
papermill engine it runs them with; kernel.py checks the notebooks' Jupyter kernel, which
``make setup`` installs inside the venv (``python -m helpers.course.book.kernel``).
"""
