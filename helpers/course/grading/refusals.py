"""What a learner's code may not do: a check of its syntax tree, before any of it runs.

``helpers.course.grading.scanner.scan(source, policy)`` reads one cell and returns a
``Refusal`` for each construct it will not run, with its line; this module holds what
it refuses, and why. There are two kinds:

* **grader** refusals: constructs that reach into the kernel, the grader or the
  traffic recorder rather than computing an answer. IPython's transformers, hooks
  and magics; tracing (``sys.settrace``); ``sys.modules`` and ``builtins``; code
  objects, frames and the garbage collector; ``exec`` / ``eval`` / ``compile`` /
  ``importlib`` / ``ctypes``; torch's private dispatch internals; special methods
  that change what ``==``, ``-`` or unpickling mean for an object the tests compare;
  changing a module, a builtin, or a name the lab's own cells defined. Nothing a
  notebook with one of these computes can be trusted, so it scores zero.
* **lab** refusals: imports the lab names in ``solutions/<lab>/grading.toml``
  (``refuse.imports``): the answer itself (the workbook's own version of what the lab
  asks for) or the library that does the exercise. The cell does not run; the tests
  that need what it defines fail.

A refusal says what to change. The scan is a first line of defence: the tests
themselves check what the messages carry (helpers.course.grading.recorder.traffic), so a way around
it still has to produce the right messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Policy", "Refusal", "SolutionRefused", "SubmissionRefused"]


class SolutionRefused(RuntimeError):
    """A learner's cell was not run: it uses a construct the lab refuses."""


class SubmissionRefused(RuntimeError):
    """A test was not run: the notebook reaches into the grader, so nothing is graded."""


@dataclass(frozen=True)
class Refusal:
    line: int  # 1-based, in the cell as the learner sees it
    construct: str  # what was found, as written: "get_ipython", "import helpers.parallel.tensor.tp"
    why: str  # what it does, and what to do instead
    grader: bool = True  # True: reaches the grader (the whole notebook scores zero)

    def __str__(self) -> str:
        return f"line {self.line}: {self.construct}: {self.why}"


# Modules whose import reaches the kernel, the grader, the interpreter or the file system.
GRADER_MODULES = {
    "IPython": "IPython is the kernel that grades this notebook",
    "ipykernel": "the kernel that grades this notebook",
    "traitlets": "the kernel's configuration",
    "jupyter_client": "the kernel's messaging",
    "jupyter_core": "Jupyter's configuration",
    "nbgrader": "the grader",
    "nbclient": "the grader's notebook runner",
    "nbformat": "the notebook being graded",
    "papermill": "the notebook runner",
    "helpers.course": "the workbook's grading code",
    "helpers.notebook": "the workbook's notebook magics",
    "helpers.launch": "the launcher that runs the tests' ranks",
    "sys": "the interpreter itself (sys.modules, settrace, frames)",
    "os": "the process and its files",
    "builtins": "the builtins every cell, tests included, uses",
    "importlib": "the import machinery",
    "ctypes": "raw memory of the interpreter",
    "gc": "every live object (gc.get_objects), the tests' included",
    "inspect": "frames and the tests' own code",
    "traceback": "frames of the running code",
    "types": "code objects and functions made by hand",
    "code": "an interpreter inside the kernel",
    "codeop": "compiling code from text",
    "runpy": "running code from text",
    "marshal": "code objects from bytes",
    "pickle": "code that runs when data is loaded",
    "copyreg": "code that runs when data is loaded",
    "cloudpickle": "code that runs when data is loaded",
    "dill": "code that runs when data is loaded",
    "subprocess": "other programs",
    "multiprocessing": "other processes",
    "threading": "threads and their trace hooks",
    "_thread": "threads",
    "signal": "the kernel's signals",
    "atexit": "the kernel's exit",
    "socket": "connections outside the lab's messages",
    "shutil": "files",
    "pathlib": "files",
    "io": "files",
    "tempfile": "files",
    "glob": "files",
    "site": "the interpreter's start-up",
    "sysconfig": "the interpreter's installation",
    "pkgutil": "the import machinery",
    "zipimport": "the import machinery",
    "trace": "tracing",
    "tracemalloc": "the interpreter's allocator",
    "faulthandler": "the interpreter's frames",
    "resource": "the process's limits",
    "unittest": "mock objects that replace the tests' tools",
    "pytest": "the test framework",
    "dis": "code objects",
    "torch.utils._python_dispatch": "the dispatch modes that record your collectives",
    "torch.overrides": "torch-function modes that intercept every torch call",
    "torch.library": "replacing torch's operators",
}
# Builtins that run text as code, reach the kernel's namespace, or change attributes by name.
GRADER_NAMES = {
    "get_ipython": "reaches the IPython kernel that grades this notebook (its transformers, "
    "hooks, events and namespace)",
    "exec": "runs text as code, which no check can read",
    "eval": "runs text as code, which no check can read",
    "compile": "makes code from text, which no check can read",
    "__import__": "imports by name, around the import checks",
    "globals": "reaches the notebook's namespace, the tests' functions included",
    "locals": "reaches the namespace it is called in",
    "vars": "reaches an object's or the notebook's namespace",
    "setattr": "changes attributes by name",
    "delattr": "removes attributes by name",
    "breakpoint": "stops the kernel in a debugger",
    "open": "reads and writes files; results must travel in the lab's messages",
    "exit": "stops the kernel",
    "quit": "stops the kernel",
    "input": "waits for typing that never comes when grading",
    "In": "the kernel's input history",
    "Out": "the kernel's output history",
    "_ih": "the kernel's input history",
    "_oh": "the kernel's output history",
    "_dh": "the kernel's directory history",
}
# Attributes that lead to frames, code and the interpreter's internals, whatever the object.
GRADER_ATTRIBUTES = {
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "f_trace", "tb_frame",
    "tb_next", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "co_code",
    "co_consts", "ast_transformers", "input_transformers_post", "input_transformers_cleanup",
    "settrace", "setprofile", "_getframe", "meta_path", "path_hooks",
}  # fmt: skip
# Special names a learner's class may define or touch: construction, display, iteration,
# calls, contexts. Every other special method changes what the tests' own comparisons,
# arithmetic, attribute access or unpickling do with an object.
ALLOWED_DUNDERS = {
    "__init__", "__repr__", "__str__", "__len__", "__iter__", "__next__", "__getitem__",
    "__call__", "__enter__", "__exit__", "__post_init__", "__name__", "__qualname__",
    "__doc__", "__main__", "__file__", "__future__", "__all__",
}  # fmt: skip
DUNDER = re.compile(r"^__\w+__$")
# Cell magics whose body runs as Python in the kernel (scanned), or not at all (skipped).
SCANNED_MAGICS = {"program", "time", "timeit", "capture"}
UNRUN_MAGICS = {"sbatch"}  # under nbgrader, %%sbatch only writes its job script


@dataclass
class Policy:
    """What one lab refuses, and what its own cells define."""

    # module (or module prefix) -> why the lab refuses it (grading.toml's refuse.imports)
    lab_imports: dict[str, str] = field(default_factory=dict)
    # names the lab's locked cells define that learner code must not rebind
    protected: set[str] = field(default_factory=set)
    # name -> the import that binds it in the lab's cells: the same import is allowed again
    lab_bindings: dict[str, str] = field(default_factory=dict)
    # top-level names of the learner's own %%program modules (importable in jobs)
    programs: set[str] = field(default_factory=set)
    # module files next to the notebook (would shadow an installed module of that name)
    shadowing: set[str] = field(default_factory=set)
