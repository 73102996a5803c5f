"""The grading sandbox holds: each attack is a learner's source written for the purpose, and fails.

One SandboxPool (2 rank slots and the learner slot, started in parallel) serves the file.
The learner's functions run as a test would run them: a direct call in the learner
process (``pool.call``), or as ranks (``pool.spawn`` of a ``LearnerRef``). Each attack
reports what it managed; the test asserts it managed nothing, and, where it matters, that
the same step on an unprotected path works (so the test is not vacuous).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import textwrap
from pathlib import Path

import cloudpickle
import psutil
import pytest
import torch

from helpers.course.grading.grader.proxies import LearnerRef
from helpers.course.grading.sandbox import bwrap
from helpers.course.grading.sandbox.outcome import LearnerError
from helpers.course.grading.sandbox.pool import SandboxPool
from helpers.launch.results import RankFailure

# The test functions sent to ranks travel by value, as a grader's do (the sandbox cannot
# import this file).
cloudpickle.register_pickle_by_value(sys.modules[__name__])
SECRET = "the-hidden-test-says-42"
ORPHAN = "wb-orphan"  # the name a leftover process gives itself (its comm)

ATTACKS = textwrap.dedent(
    '''
    import ctypes, os, pickle, socket, subprocess, time
    import torch

    def tried(fn):
        try:
            out = fn()
            return "ok:" + str(out)[:200]
        except BaseException as e:
            return type(e).__name__

    def write_outside(paths):
        def write(p):
            with open(p, "a") as f:
                f.write("graded by me")
        return {p: tried(lambda p=p: write(p)) for p in paths}

    def read_secrets(paths):
        return {p: tried(lambda p=p: open(p).read()) for p in paths}

    def who():
        kinds = []
        for f in os.listdir("/proc/self/fd"):
            try:
                kinds.append(os.readlink(f"/proc/self/fd/{f}").split(":")[0])
            except FileNotFoundError:  # listdir's own descriptor, closed since
                pass
        kinds.sort()
        return [os.getuid(), os.getgid(), os.getpid(), os.getcwd(), os.environ.get("HOME"), kinds]

    def leave_orphans(marker):
        """A double fork whose grandchild starts its own session, and a Popen'd sleep."""
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                ctypes.CDLL(None).prctl(15, marker.encode(), 0, 0, 0)  # PR_SET_NAME
                while True:
                    time.sleep(1)
            os._exit(0)
        os.waitpid(pid, 0)
        subprocess.Popen(["sleep", "6061"], start_new_session=True)  # a length nothing else sleeps
        for _ in range(500):
            names = [open(f"/proc/{p}/comm").read().strip()
                     for p in os.listdir("/proc") if p.isdigit()]
            if marker in names and "sleep" in names:
                return True
            time.sleep(0.01)
        return False

    def leave_orphans_rank(d, marker):
        return leave_orphans(marker)

    def talk_to_peer(d, port):
        """Rank 0 listens on TCP and on an abstract unix socket; rank 1 tries both."""
        import torch.distributed as tdist
        if d.rank == 0:
            tcp = socket.socket(); tcp.bind(("127.0.0.1", port)); tcp.listen()
            unix = socket.socket(socket.AF_UNIX); unix.bind("\\0wb-peer"); unix.listen()
        tdist.barrier()
        out = []
        if d.rank == 1:
            def tcp_connect():
                s = socket.create_connection(("127.0.0.1", port), timeout=1)
                return s.getpeername()
            def unix_connect():
                s = socket.socket(socket.AF_UNIX); s.settimeout(1); s.connect("\\0wb-peer")
                return "connected"
            out = [tried(tcp_connect), tried(unix_connect)]
        tdist.barrier()
        return out

    def reach_grader(grader_pid, port, abstract):
        def tcp():
            return socket.create_connection(("127.0.0.1", port), timeout=1).getpeername()
        def unix():
            s = socket.socket(socket.AF_UNIX); s.settimeout(1); s.connect(abstract)
            return "connected"
        def ptrace(pid):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.ptrace(16, pid, 0, 0) != 0:  # PTRACE_ATTACH
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            return "attached"
        def slot_descriptors():
            return os.listdir(f"/proc/{os.getppid()}/fd")
        return {
            "kill grader": tried(lambda: os.kill(grader_pid, 15)),
            "signal 0 grader": tried(lambda: os.kill(grader_pid, 0)),
            "ptrace grader": tried(lambda: ptrace(grader_pid)),
            "ptrace slot": tried(lambda: ptrace(os.getppid())),
            "slot fds": tried(slot_descriptors),
            "tcp grader": tried(tcp),
            "unix grader": tried(unix),
        }

    def leave_files():
        open("/tmp/left", "w").write("x"); open("left", "w").write("x")
        open("/dev/shm/left", "w").write("x")
        return sorted(os.listdir("/tmp")) + sorted(os.listdir("."))

    def seen_files():
        import sys
        import helpers
        # what the sandbox mounts read-only at its own path (a clone under /tmp shows there)
        mounted = (os.getcwd(), sys.prefix, helpers.__file__)
        tmp = [f for f in os.listdir("/tmp") if not any(p.startswith(f"/tmp/{f}/") for p in mounted)]
        return sorted(tmp) + sorted(os.listdir(".")) + sorted(os.listdir("/dev/shm"))

    calls = []
    def count():
        calls.append(1)
        return len(calls)

    class Evil:
        def __reduce__(self):
            return (os.getpid, ())

    def forge_result(d):
        """Replace the sandbox's value check with a pickle that runs code where it is loaded."""
        from helpers.course.grading.sandbox import learner
        learner.as_data = lambda value, who: pickle.dumps(Evil())
        return 1

    def returns_object():
        return Evil()

    def raises(kind):
        raise {"value": ValueError, "own": type("OwnError", (Exception,), {})}[kind]("nope")

    def kill_everyone(d):
        for pid in (-1, 1, os.getppid()):  # everyone it may signal, then its slot
            tried(lambda: os.kill(pid, 9))

    def spin(d):
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            pass

    def traces(words):
        """Where the sandbox shows any of words: variables, command lines, mounts, files."""
        found = [f"env {k}" for k, v in os.environ.items() if any(w in k + v for w in words)]
        for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self"]:
            for part in ("environ", "cmdline"):
                try:
                    text = open(f"/proc/{pid}/{part}", "rb").read().decode(errors="replace")
                except OSError:
                    continue
                found += [f"/proc/{pid}/{part}: {w}" for w in words if w in text]
        mounts = open("/proc/self/mountinfo").read()
        found += [f"mountinfo: {w}" for w in words if w in mounts]
        return found, sorted(os.listdir("/")), sorted(os.listdir("/etc"))

    def leave_ipc(d):
        libc = ctypes.CDLL(None, use_errno=True)
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
        shm = libc.shmget(0x5EED, 4096, 0o1000 | 0o666)  # IPC_CREAT
        queue = rt.mq_open(b"/wb-queue", os.O_CREAT | os.O_RDWR, 0o666, None)
        open("/dev/shm/wb-left", "w").write("x")
        return [shm >= 0, queue >= 0]

    def find_ipc(d):
        libc = ctypes.CDLL(None, use_errno=True)
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
        return [libc.shmget(0x5EED, 0, 0), rt.mq_open(b"/wb-queue", os.O_RDWR),
                os.listdir("/dev/shm"), open("/proc/sysvipc/shm").read().splitlines()]

    def limits():
        import resource
        got = {k: resource.getrlimit(getattr(resource, "RLIMIT_" + k))[0]
               for k in ("NPROC", "DATA", "FSIZE", "CORE")}
        def hog():
            return len(bytearray(got["DATA"] + (1 << 30)))
        def bomb():  # threads count against the process limit too (no fork: seccomp)
            import threading
            go, started = threading.Event(), []
            try:
                while len(started) < 10_000:
                    t = threading.Thread(target=go.wait)
                    t.start()
                    started.append(t)
            finally:
                go.set()
                for t in started:
                    t.join()
            return len(started)
        return got, tried(hog), tried(bomb), tried(os.fork)

    def load_refused(path):
        import importlib.util
        def by_name():
            import helpers.parallel.sharded.zero as z
            return z.__name__
        def by_path():
            spec = importlib.util.spec_from_file_location("z", path)
            return spec.loader.exec_module(importlib.util.module_from_spec(spec))
        def compiled():
            return open(importlib.util.cache_from_source(path), "rb").read(4)
        listing = os.listdir(os.path.dirname(path))
        return [tried(by_name), tried(by_path), tried(lambda: open(path).read(4)), tried(compiled),
                "__pycache__" in listing]

    def every_route(module, path):
        """A refused module by each route the issue lists, and its package's attribute."""
        import importlib.util
        import sys
        def by_spec():
            spec = importlib.util.spec_from_file_location("stolen", path)
            return spec.loader.exec_module(importlib.util.module_from_spec(spec))
        def from_package():
            parent, _, child = module.rpartition(".")
            return getattr(importlib.import_module(parent), child).__name__
        routes = {
            "torch.importlib": lambda: torch.importlib.import_module(module).__name__,
            "sys.modules": lambda: sys.modules[module].__name__,
            "__import__": lambda: __import__(module, fromlist=["x"]).__name__,
            "package attribute": from_package,
            "spec_from_file_location": by_spec,
            "read and exec": lambda: exec(open(path).read(), {"__name__": module, "__package__":
                                           module if path.endswith("__init__.py") else parent}),
        }
        parent = module.rpartition(".")[0]
        return {k: tried(fn)[:40] for k, fn in routes.items()}

    def reset_memory_meter():
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self is its own again
        return tried(lambda: open("/proc/self/clear_refs", "w").write("5"))

    def styles():
        import collections
        import numpy as np
        Pair = collections.namedtuple("Pair", "a b")
        return [Pair(1, 2), np.float64(0.5), np.int32(3), np.arange(3), collections.Counter("aab")]

    def hold_outside():
        """Each way to keep memory where the grader does not count it, and a thread."""
        import threading
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long

        def call(fn, *args):
            got = fn(*args)
            if got == 0 and fn is libc.fork:
                os._exit(0)
            return got if got >= 0 else "errno " + os.strerror(ctypes.get_errno())

        def raw_clone():  # clone(SIGCHLD): a fork by the system call glibc's fork makes
            got = libc.syscall(56, 17, 0, 0, 0, 0)
            if got == 0:
                os._exit(0)
            return got if got >= 0 else "errno " + os.strerror(ctypes.get_errno())

        def memfd_hold():
            fd = os.memfd_create("x")
            os.write(fd, b"x" * 4096)
            return fd

        def thread():
            out = []
            t = threading.Thread(target=lambda: out.append(torch.ones(4).sum().item()))
            t.start(); t.join()
            torch.set_num_threads(2)
            return out + [float((torch.ones(300, 300) @ torch.ones(300, 300))[0, 0])]

        def tried_long(fn):
            try:
                return "ok:" + str(fn())[:100]
            except BaseException as e:
                return type(e).__name__ + ": " + str(e)
        import multiprocessing, subprocess
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
        return {
            "os.fork": tried_long(os.fork),
            "fork": call(libc.fork),
            "clone": raw_clone(),
            "memfd": tried_long(memfd_hold),
            "memfd_create": call(libc.memfd_create, b"x", 0),
            "shmget": call(libc.shmget, 0, 1 << 20, 0o1000 | 0o600),
            "msgget": call(libc.msgget, 0, 0o1000 | 0o600),
            "mq_open": call(rt.mq_open, b"/wb-q", os.O_CREAT | os.O_RDWR, 0o600, None),
            "io_uring_setup": call(libc.syscall, 425, 8, ctypes.create_string_buffer(120)),
            "unshare": call(libc.unshare, 0x10000000),
            "subprocess": tried_long(lambda: subprocess.run(["true"])),
            "multiprocessing": tried_long(lambda: multiprocessing.Process(target=print).start()),
            "thread": tried_long(thread),
        }

    def hold_outside_rank(d):
        return hold_outside()

    def writable_mounts():
        """Every mount point this process can write into, with its file system."""
        out = {}
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            point, fstype = fields[4], fields[fields.index("-") + 1]
            probe = os.path.join(point, ".wb-probe")
            try:
                open(probe, "w").close()
                os.unlink(probe)
                out[point] = fstype
            except OSError:
                pass
        return out

    def writable_mounts_rank(d):
        return writable_mounts()

    def write_devnull():
        with open("/dev/null", "w") as f:
            f.write("x")
        return "ok"

    def big_message(d, numel):
        import torch.distributed as tdist
        tdist.all_reduce(torch.zeros(numel))

    '''
)


@pytest.fixture(scope="module")
def course():
    """A course directory outside /tmp (the sandbox replaces /tmp), readable by everyone,
    so only the sandbox's hiding keeps its secrets."""
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    root = Path(tempfile.mkdtemp(prefix="wb-course-", dir=base))
    for rel in (
        "solutions/lab1/lab1.ipynb",
        "autograded/ann/lab1/lab1.ipynb",
        "submitted/ann/lab1/lab1.ipynb",
        "feedback/ann/lab1/lab1.html",
        "gradebook.db",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(SECRET)
    (root / "labs/lab1").mkdir(parents=True)
    (root / "labs/lab1/lab1.ipynb").write_text("the release")
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o777)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o666)
    yield root
    import shutil

    shutil.rmtree(root, ignore_errors=True)


CAP = 1 << 22  # the relay's message cap in this file's pool: 4 MiB


@pytest.fixture(scope="module")
def pool(course):
    """The file's pool, started as nbgrader's autograde starts it: with NBGRADER_EXECUTION
    set in the grader's environment (Validate sets it otherwise: the sandbox must not tell)."""
    from helpers.course.grading.relay.switch import RelaySwitch

    saved = os.environ.get("NBGRADER_EXECUTION")
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    try:
        with SandboxPool(
            max_world=2,
            course_root=course,
            call_timeout=60,
            switch=lambda socks: RelaySwitch(socks, max_message=CAP),
            memory_bytes=3 << 30,
            processes=64,
        ) as p:
            p.start()
            yield p
    finally:
        if saved is None:
            os.environ.pop("NBGRADER_EXECUTION", None)
        else:
            os.environ["NBGRADER_EXECUTION"] = saved


def call(pool, name, *args):
    return pool.call(name, *args, learner_source=ATTACKS)


def spawn(pool, name, n, *args, timeout=60):
    return pool.spawn(LearnerRef(name), n, args, learner_source=ATTACKS, timeout=timeout)


def test_runs_as_nobody_with_its_two_descriptors(pool):
    uid, gid, pid, cwd, home, fds = call(pool, "who")
    # nobody inside, whoever grades (root drops to nobody; an instructor's uid is mapped to it)
    assert (uid, gid) == (bwrap.NOBODY, bwrap.NOBODY)
    assert pid < 100 and cwd == home == "/scratch"  # its own PID namespace; scratch is home
    # /dev/null, its output and result pipes and its request socket, all to the slot: no
    # file, nothing to the grader or to another sandbox
    assert fds == ["/dev/null", "pipe", "pipe", "pipe", "socket"], fds
    (rank_fds,) = [r[-1] for r in pool.spawn(_who_rank, 1, learner_source=ATTACKS)]
    assert rank_fds == ["/dev/null", "pipe", "pipe", "pipe", "socket"], rank_fds  # the relay


def _who_rank(d):
    from helpers.course.grading.grader.proxies import lookup

    return lookup("who")()


def test_cannot_write_outside_scratch(pool, course):
    targets = [
        course / "labs/lab1/lab1.ipynb",
        course / "gradebook.db",
        course / "labs/new.py",
        Path(bwrap.__file__),
        Path("/var/tmp/wb-planted"),
    ]
    before = {p: p.read_bytes() if p.exists() else None for p in targets}
    got = call(pool, "write_outside", [str(p) for p in targets])
    assert all(not v.startswith("ok") for v in got.values()), got
    assert {p: p.read_bytes() if p.exists() else None for p in targets} == before
    scratch = pool.slots[-1].scratch
    assert call(pool, "write_outside", [str(scratch / "mine.txt")])[
        str(scratch / "mine.txt")
    ].startswith("ok")


def test_cannot_read_course_secrets(pool, course):
    checkout = Path(bwrap.__file__).resolve().parents[4]
    secrets = [
        course / "solutions/lab1/lab1.ipynb",
        course / "gradebook.db",
        course / "autograded/ann/lab1/lab1.ipynb",
        course / "submitted/ann/lab1/lab1.ipynb",
        course / "feedback/ann/lab1/lab1.html",
    ]
    secrets += [
        p for p in [checkout / "solutions/lab1/lab1.ipynb", checkout / ".git/HEAD"] if p.exists()
    ]
    got = call(pool, "read_secrets", [str(p) for p in [*secrets, course / "labs/lab1/lab1.ipynb"]])
    for path, outcome in got.items():  # the course directory is not there at all, release included
        assert outcome in ("FileNotFoundError", "PermissionError"), (path, outcome)
    assert open(course / "labs/lab1/lab1.ipynb").read() == "the release"  # it is, outside


def test_no_socket_to_another_rank_or_the_grader(pool):
    _, port = _free_port()
    assert spawn(pool, "talk_to_peer", 2, port) == [
        [],
        ["ConnectionRefusedError", "ConnectionRefusedError"],
    ]
    tcp, unix = socket.socket(), socket.socket(socket.AF_UNIX)
    tcp.bind(("127.0.0.1", 0)), tcp.listen()
    unix.bind("\0wb-grader-test"), unix.listen()
    try:
        got = call(pool, "reach_grader", os.getpid(), tcp.getsockname()[1], "\0wb-grader-test")
    finally:
        tcp.close(), unix.close()
    assert got["tcp grader"] == got["unix grader"] == "ConnectionRefusedError", got
    assert got["kill grader"] == got["signal 0 grader"] == "ProcessLookupError", got
    assert got["ptrace grader"] == "ProcessLookupError", got  # not even there to be seen
    assert got["ptrace slot"] == "PermissionError", got  # the slot is not dumpable
    assert got["slot fds"] == "PermissionError", got


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return None, port


def _orphans() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        if p.info["name"] == ORPHAN or p.info["cmdline"] == ["sleep", "6061"]:
            found.append(p)
    return found


def test_no_process_outlives_its_job(pool):
    """A job may not start a process at all (seccomp: helpers.course.grading.sandbox.seccomp);
    the slot still ends whatever a job left (children.end_processes) should one get through."""
    with pytest.raises(LearnerError, match="SandboxRefusal: .*may not start processes"):
        call(pool, "leave_orphans", ORPHAN)
    assert not _orphans()
    assert call(pool, "count") < call(pool, "count")  # the learner process itself lives on
    with pytest.raises(RankFailure, match="may not start processes"):
        spawn(pool, "leave_orphans_rank", 2, ORPHAN)
    assert not _orphans()
    learner = {p for p in pool.pids() if psutil.Process(p).name() == "python"}
    pool.end_learner()  # the notebook is graded: its learner process goes too
    alive = {p for p in pool.pids() if psutil.Process(p).name() == "python"}
    assert learner - alive and alive < learner


def test_nothing_written_reaches_the_next_job(pool):
    assert "left" in pool.spawn(_leave, 1, learner_source=ATTACKS)[0]
    assert pool.spawn(_seen, 1, learner_source=ATTACKS) == [[]]


def _leave(d):
    from helpers.course.grading.grader.proxies import lookup

    return lookup("leave_files")()


def _seen(d):
    from helpers.course.grading.grader.proxies import lookup

    return lookup("seen_files")()


def test_values_are_data_never_unpickled(pool):
    with pytest.raises(RankFailure, match="not data"):
        spawn(pool, "forge_result", 1)
    with pytest.raises(TypeError, match="returned a Evil object"):
        call(pool, "returns_object")


def test_errors_come_back_as_text(pool):
    with pytest.raises(ValueError, match="nope"):
        call(pool, "raises", "value")
    with pytest.raises(LearnerError, match="OwnError: nope"):
        call(pool, "raises", "own")
    with pytest.raises(RankFailure, match=r"rank 1 failed.*ValueError: nope"):
        pool.spawn(_raise_on_1, 2, learner_source=ATTACKS)


def _raise_on_1(d):
    import torch.distributed as tdist

    from helpers.course.grading.grader.proxies import lookup

    if d.rank == 1:
        lookup("raises")("value")
    tdist.barrier()


def test_a_rank_cannot_end_its_sandbox(pool):
    before = pool.slots[0].proc.pid
    assert spawn(pool, "kill_everyone", 1, timeout=30) == [None]  # its slot is init: immune
    assert psutil.pid_exists(os.getpid()) and pool.slots[0].proc.pid == before
    out = pool.spawn(_sum, 2, learner_source=ATTACKS)  # the same slots go on
    assert [t.tolist() for t in out] == [[3.0, 3.0]] * 2


def _sum(d):
    import torch.distributed as tdist

    t = torch.full((2,), float(d.rank + 1))
    tdist.all_reduce(t)
    return t


def test_refuses_clearly_without_bwrap(monkeypatch):
    monkeypatch.setattr(bwrap.shutil, "which", lambda name: None)
    with pytest.raises(bwrap.SandboxUnavailable, match="apt-get install bubblewrap"):
        bwrap.require()
    with pytest.raises(bwrap.SandboxUnavailable):
        SandboxPool(max_world=1)


def test_spawn_refuses_inside_the_sandbox(monkeypatch):
    import importlib

    launch_spawn = importlib.import_module("helpers.launch.spawn")

    monkeypatch.setenv("WORKBOOK_SANDBOX", "1")
    launch_spawn.warm_up()  # does nothing
    with pytest.raises(RuntimeError, match="grading sandbox"):
        launch_spawn.spawn(_sum, 2)


def test_programs_are_modules_and_a_spinning_rank_is_stopped(pool):
    source = "from lab_mod import X\n\ndef plus_one():\n    return X + 1\n"
    assert pool.call("plus_one", learner_source=source, programs={"lab_mod": "X = 41"}) == 42
    # a program never stands in for an installed module, the tests' own included
    fake = {"json": "dumps = None", "helpers.course.grading.checks.ring_check": "X = 1"}
    source = (
        "import json\nimport helpers.course.grading.checks.ring_check as rc\n\n"
        "def real():\n    return json.dumps([1]), hasattr(rc, 'ring_problems')\n"
    )
    assert pool.call("real", learner_source=source, programs=fake) == ("[1]", True)
    with pytest.raises(RankFailure, match="timed out after 2 s"):
        spawn(pool, "spin", 2, timeout=2)
    assert [t.tolist() for t in pool.spawn(_sum, 2, learner_source=ATTACKS)] == [[3.0, 3.0]] * 2


def test_nothing_of_the_grader_shows_inside(pool, course):
    """No variable, command line, mount or file tells autograde from Validate, or names the
    course: the sandbox holds the system, the interpreter and helpers/, nothing else."""
    words = ["NBGRADER", str(course), str(pool.root), "wb-course"]
    found, root, etc = call(pool, "traces", words)
    assert found == [], found
    assert call(pool, "traces", ["WORKBOOK_SANDBOX"])[0]  # the search finds what is there
    assert set(root) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "root",
                         "sbin", "scratch", "sys", "tmp", "usr", *Path(sys.prefix).parts[1:2],
                         *bwrap.needed_paths()[0].parts[1:2]}, root  # fmt: skip
    assert "home" not in root and "passwd" not in etc and "shadow" not in etc


def test_another_jobs_ipc_is_gone(pool):
    """SysV shared memory, POSIX queues and /dev/shm of one job are gone for the next job in
    the same slot (another learner's, in a class). The first two are refused outright now
    (seccomp); the job's own IPC namespace stays as a second wall."""
    assert pool.spawn(LearnerRef("leave_ipc"), 1, learner_source=ATTACKS) == [[False, False]]
    ((shm, queue, files, segments),) = pool.spawn(LearnerRef("find_ipc"), 1, learner_source=ATTACKS)
    assert shm == -1 and queue == -1 and files == [] and len(segments) == 1, (shm, queue, files)


REFUSED = ["fork", "clone", "memfd_create", "shmget", "msgget", "mq_open", "io_uring_setup",
           "unshare"]  # fmt: skip


@pytest.mark.parametrize("where", ["rank", "learner process"])
def test_no_process_or_memory_outside_the_rank_but_threads_work(pool, where):
    """Issue 38's red team kept full marks in labs 2, 3, 4 and 7 with memory in a child the
    rank forked, or in a memfd written and never mapped: neither is in what the grader
    counts (the rank's /proc and its tmpfs). Each is refused by the job's seccomp filter,
    with a message that says what to change; threads (torch's, the relay's) still run."""
    if where == "rank":
        (got,) = pool.spawn(LearnerRef("hold_outside_rank"), 1, learner_source=ATTACKS)
    else:
        got = call(pool, "hold_outside")
    assert {k: got[k] for k in REFUSED} == dict.fromkeys(REFUSED, "errno Operation not permitted")
    for k in ("os.fork", "memfd", "subprocess", "multiprocessing"):
        assert got[k].startswith("SandboxRefusal: [Errno 1]"), (k, got[k])
        assert (
            "the grader's ranks may not start processes or hold memory outside the rank" in got[k]
        ), got[k]
    assert got["thread"] == "ok:[4.0, 300.0]", got["thread"]


def test_a_rank_writes_only_where_the_grader_counts(pool):
    """The only places a job can write are the fresh tmpfs the grader reads (helpers.course.
    grading.recorder.os_memory): no disk path holds what the rank does not."""
    assert call(pool, "writable_mounts") == dict.fromkeys(["/tmp", "/dev/shm", "/scratch"], "tmpfs")
    (in_rank,) = pool.spawn(LearnerRef("writable_mounts_rank"), 1, learner_source=ATTACKS)
    assert set(in_rank) == {"/tmp", "/dev/shm", "/scratch"}, in_rank  # /dev was, before
    assert call(pool, "write_devnull") == "ok"  # its device nodes still work


def test_limits_on_processes_and_memory(pool):
    got, hog, bomb, fork = call(pool, "limits")
    assert got == {"NPROC": 64, "DATA": 3 << 30, "FSIZE": 1 << 30, "CORE": 0}, got
    assert hog == "MemoryError", hog  # more than the data limit: refused at once
    assert bomb == "RuntimeError", bomb  # a thread bomb stops at the process limit
    assert fork == "SandboxRefusal", fork  # and a fork is refused outright
    assert call(pool, "count") >= 1  # the learner slot still serves


def test_a_refused_module_is_absent_by_every_route(pool):
    import helpers.parallel.sharded as sharded

    path = str(Path(sharded.__file__).parent / "zero.py")
    got = pool.call(
        "load_refused", path, learner_source=ATTACKS, refused=["helpers.parallel.sharded.zero"]
    )
    assert got == ["ModuleNotFoundError", "FileNotFoundError", "FileNotFoundError",
                   "FileNotFoundError", False], got  # fmt: skip
    where_allowed = pool.call("load_refused", path, learner_source=ATTACKS)
    assert [r[:3] for r in where_allowed[:3]] == ["ok:"] * 3, where_allowed  # not vacuous


ROUTES = ["torch.importlib", "sys.modules", "__import__", "package attribute",
          "spec_from_file_location", "read and exec"]  # fmt: skip


@pytest.mark.parametrize(
    "module",
    [
        "helpers.parallel.sharded.zero",  # a workbook module, not loaded before the job
        "torch.nn.parallel",  # loaded by `import torch` itself (lab 1, lab 6)
        "torch.distributed.tensor",  # loaded by the slot's preload (labs 2, 4, 6, 7)
        "helpers.course.grading.checks.ddp_check",  # lab 6's reference functions
    ],
)
def test_a_refused_module_cannot_be_loaded_by_any_route(pool, module):
    """On 7718dfa a module in memory before the job (torch's own start-up, the slot's
    preload) stayed in sys.modules and importable; the rest could be read and exec'd."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    path = spec.origin  # a package's __init__.py
    refused = pool.call("every_route", module, path, learner_source=ATTACKS, refused=[module])
    absent = {"ModuleNotFoundError", "FileNotFoundError", "KeyError", "AttributeError"}
    assert set(refused) == set(ROUTES) and set(refused.values()) <= absent, refused
    allowed = pool.call("every_route", module, path, learner_source=ATTACKS)
    ok = [k for k, v in allowed.items() if v.startswith("ok")]  # not vacuous: where allowed,
    assert ok[:4] == ROUTES[:4], list(allowed.items())  # it loads, and its file is there
    assert "FileNotFoundError" not in (allowed["spec_from_file_location"], allowed["read and exec"])


def test_a_rank_cannot_reset_what_the_os_counts_of_its_memory(pool):
    """The grader reads a rank's memory high-water mark from outside (/proc/<pid>/status);
    a rank that made itself dumpable could reset it through /proc/self/clear_refs."""
    assert call(pool, "reset_memory_meter") == "OSError"  # /proc is read-only in a job


def test_a_value_of_another_type_comes_back_as_its_plain_kind(pool):
    pair, half, three, array, counter = call(pool, "styles")
    assert pair == (1, 2) and type(pair) is tuple
    assert half == 0.5 and type(half) is float and three == 3 and type(three) is int
    assert torch.equal(array, torch.arange(3)) and counter == {"a": 2, "b": 1}


def test_a_message_over_the_cap_fails_cleanly(pool):
    with pytest.raises(RankFailure, match=r"more than the 4,194,304 bytes the relay carries"):
        spawn(pool, "big_message", 1, CAP // 4 + 1)
    assert spawn(pool, "big_message", 1, CAP // 4) == [None]  # at the cap: carried


def test_the_relay_never_holds_a_message_announced_over_the_cap():
    """A rank's frame that claims 2 GiB (written by hand, as learner code in a rank can): the
    grading process answers with the reason, allocates nothing, and reads on."""
    import json
    import resource
    import struct

    from helpers.course.grading.relay.frames import recv_frame
    from helpers.course.grading.relay.switch import RelaySwitch

    ours, rank = socket.socketpair()
    switch = RelaySwitch([ours], max_message=CAP)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        head = json.dumps({"t": "sync", "id": 7}).encode()
        rank.sendall(struct.pack("!II", len(head), (1 << 31) - 1) + head + b"x" * 100_000)
        rank.settimeout(20)
        reply, _ = recv_frame(rank)
        assert reply == {"id": 7, "err": f"relay: a message of {(1 << 31) - 1:,} bytes is more "
                         "than the 4,194,304 bytes the relay carries at once (the tests never "
                         "need that much): send smaller tensors"}, reply  # fmt: skip
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown < 100_000, f"the grading process grew by {grown} kB"  # not 2 GiB
    finally:
        rank.close()
        switch.close()


def _run_filter(code: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """The classic-BPF program's answer to one system call (the few instructions it uses)."""
    import struct

    ops = [struct.unpack("=HBBI", code[i : i + 8]) for i in range(0, len(code), 8)]
    data, acc, pc = {0: nr, 4: arch, 16: arg0}, 0, 0
    while True:
        op, jt, jf, k = ops[pc]
        if op == 0x20:  # ld [k]
            acc, pc = data[k], pc + 1
        elif op == 0x06:  # ret k
            return k
        else:  # jeq, jge, jset
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += 1 + (jt if hit else jf)


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_filter_refuses_processes_and_memfd_and_lets_threads_through(arch):
    """Both architectures' programs, run by a small BPF interpreter (no aarch64 machine here):
    a thread's clone passes, a fork's is refused, clone3 answers ENOSYS (glibc falls back),
    memfd and SysV memory are refused, a call of another ABI is refused, read passes."""
    from helpers.course.grading.sandbox import seccomp

    spec, code = seccomp.ARCHES[arch], seccomp.program(arch)
    audit, perm = spec["audit"], seccomp.RET_ERRNO | 1
    thread = 0x3D0F00  # glibc's pthread_create flags (CLONE_VM | ... | CLONE_THREAD | ...)
    assert _run_filter(code, audit, spec["clone"], thread) == seccomp.RET_ALLOW
    assert _run_filter(code, audit, spec["clone"], 0x01200011) == perm  # glibc's fork
    assert _run_filter(code, audit, spec["clone"], thread | 0x10000000) == perm  # a user ns
    assert _run_filter(code, audit, spec["clone3"]) == seccomp.RET_ERRNO | 38
    for name in ("memfd_create", "shmget", "msgget", "mq_open", "io_uring_setup", "unshare"):
        assert _run_filter(code, audit, spec["numbers"][name]) == perm, name
    read = {"x86_64": 0, "aarch64": 63}[arch]
    assert _run_filter(code, audit, read) == seccomp.RET_ALLOW
    assert _run_filter(code, 0x40000003, read) == perm  # i386 (int 0x80) on the same machine
    if arch == "x86_64":
        assert _run_filter(code, audit, 0x40000000 | 319) == perm  # x32's memfd_create
    assert seccomp.install("riscv64").startswith("seccomp: no filter for the architecture")
