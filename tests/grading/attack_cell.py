# A learner's cell written to get marks without the work, for tests/grading/test_grader_boundary.py.
# It runs in every sandboxed rank and in the learner process (its definitions come with it),
# tries each way out the issues list, and ends by raising a report of what each attempt got:
# the grader puts that message on the cell, where the test reads it. The test puts in ROOT
# (the course root), CHECKOUT (the directory that holds helpers/), GRADER_PID, REFUSED (the
# lab's refused modules and their files) and REFERENCES (the names of the lab's references).
import builtins
import gc
import json
import os
import socket
import sys
import threading

import torch

report = {}


def attempt(name, fn):
    try:
        report[name] = f"ok: {fn()!r}"[:160]
    except BaseException as e:  # noqa: BLE001 - every way out is tried, each outcome noted
        report[name] = f"{type(e).__name__}: {e}"[:160]


def _environ_has(pid, word):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return word in f.read()
    except OSError:
        return False


# Patching: every check passes, every comparison is equal (in this process).
torch.testing.assert_close = lambda *a, **k: None
torch.equal = lambda *a, **k: True
torch.allclose = lambda *a, **k: True
builtins.AssertionError = type("AssertionError", (Exception,), {})
# Hooks: a tracer and an exit handler that would rewrite results.
sys.settrace(lambda frame, event, arg: None)
threading.settrace(lambda frame, event, arg: None)
# Frames: look for the tests' reference functions in every frame and every live object.
attempt(
    "frames",
    lambda: sorted(
        {
            k
            for f in [sys._getframe(i) for i in range(len(__import__("inspect").stack()))]
            for k in f.f_globals
            if "reference" in k
        }
    ),
)
attempt(
    "objects",
    lambda: [
        getattr(o, "__name__", "")
        for o in gc.get_objects()
        if callable(o) and "reference" in getattr(o, "__name__", "")
    ][:5],
)
# Files: the course's secrets and the grading state.
for rel in ("solutions", "gradebook.db", "autograded", "submitted"):
    path = os.path.join(ROOT, rel)  # noqa: F821 - ROOT is put in by the test
    attempt(
        f"read {rel}",
        lambda path=path: os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(64),
    )
attempt("write course", lambda: open(os.path.join(ROOT, "pwned.txt"), "w").write("x"))  # noqa: F821
attempt("write cwd", lambda: open("pwned.txt", "w").write("x"))
attempt("write /tmp", lambda: open("/tmp/pwned.txt", "w").write("x"))


# A process that outlives the job: double fork, new session, and a loop that keeps writing.
def _linger():
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            import time

            for _ in range(600):
                for target in (os.path.join(ROOT, "pwned.txt"), "/tmp/pwned.txt"):  # noqa: F821
                    try:
                        open(target, "a").write("still here\n")
                    except OSError:
                        pass
                time.sleep(0.1)
        os._exit(0)
    os.waitpid(pid, 0)
    return "forked"


attempt("linger", _linger)
# Another channel between ranks: the first process to bind a TCP port on the loopback (or an
# abstract Unix name) keeps it; a later one that finds it taken connects. "alone" means no
# other rank or job shares this network namespace; "ok" would be a channel the grader misses.
_kept = []


def _meet(family, address):
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind(address)
        s.listen(8)
        _kept.append(s)
        return None
    except OSError:
        c = socket.socket(family, socket.SOCK_STREAM)
        c.settimeout(0.5)
        c.connect(address)
        return "met another process"


for _name, _family, _address in (
    ("tcp", socket.AF_INET, ("127.0.0.1", 29511)),
    ("abstract unix", socket.AF_UNIX, "\0workbook-side-channel"),
):
    try:
        _met = _meet(_family, _address)
        report[_name] = "alone" if _met is None else f"ok: {_met}"
    except OSError as e:
        report[_name] = f"{type(e).__name__}: {e}"[:160]
attempt("signal the grader", lambda: os.kill(GRADER_PID, 0))  # noqa: F821


# What the lab refuses, by every route (REFUSED: {module: [its files on the grader's side]};
# "loaded" lists those in the sandbox's sys.modules as learner code starts: none may be).
def _found(what):
    if not what:
        raise LookupError("nothing")
    return what


def _from_file(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("stolen", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(vars(module))[:3]


def _from_pyc(path):
    import importlib.util
    import marshal

    with open(importlib.util.cache_from_source(path), "rb") as f:
        code = marshal.loads(f.read()[16:])
    scope = {}
    exec(code, scope)
    return sorted(scope)[:3]


report["loaded"] = sorted(m for m in REFUSED if m in sys.modules)  # noqa: F821
for _module, _paths in REFUSED.items():  # noqa: F821
    attempt(f"torch.importlib {_module}", lambda m=_module: torch.importlib.import_module(m))
    attempt(f"sys.modules {_module}", lambda m=_module: sys.modules[m])
    attempt(f"__import__ {_module}", lambda m=_module: __import__(m, fromlist=["x"]))
    for _path in _paths:
        attempt(f"spec_from_file_location {_module}", lambda p=_path: _from_file(p))
        attempt(f"read and exec {_module}", lambda p=_path: exec(open(p).read(), {}) or "ran")
        attempt(f"compiled copy {_module}", lambda p=_path: _from_pyc(p))
# The lab's reference functions (REFERENCES): in the learner's namespace, or anywhere alive.
attempt("references in the namespace", lambda: _found([n for n in REFERENCES if n in globals()]))  # noqa: F821
attempt(
    "references alive",
    lambda: _found(
        [getattr(o, "__name__", "") for o in gc.get_objects()
         if callable(o) and getattr(o, "__name__", "") in REFERENCES]  # noqa: F821
    ),
)  # fmt: skip
# What the sandbox shows of the grader and the machine.
attempt("grader environment", lambda: open("/proc/1/environ", "rb").read(80))
attempt(
    "NBGRADER variables",
    lambda: _found(
        [p for p in os.listdir("/proc") if p.isdigit() and _environ_has(p, b"NBGRADER")]
        + [k for k in os.environ if "NBGRADER" in k]
    ),
)
attempt("list the course", lambda: os.listdir(ROOT))  # noqa: F821
attempt("list other users' homes", lambda: os.listdir("/home"))
attempt(
    "list the checkout",
    lambda: _found(
        [n for n in os.listdir(CHECKOUT)  # noqa: F821 - only helpers/, data/ and the venv there
         if n not in ("helpers", "data") and not sys.prefix.startswith(os.path.join(CHECKOUT, n))]  # noqa: F821
    ),
)  # fmt: skip
raise RuntimeError("ATTACK REPORT " + json.dumps(report))
