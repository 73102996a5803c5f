"""helpers.launch.spawn on real gloo ranks forked from the warm pool (helpers.launch.pool).

Bounds on elapsed time are correctness bounds (a failure must not hang), not
speed targets: ``python -m helpers.course.bench launch`` measures speed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as tdist

from helpers import launch
from helpers.launch import RankFailure
from helpers.launch.pool import get_pool


def _script(tmp_path, text: str):
    p = tmp_path / "script.py"
    p.write_text(text)
    return p


def _child_env() -> dict:
    return {**os.environ, "PYTHONPATH": launch.workbook_pythonpath(os.environ.get("PYTHONPATH"))}


# --------------------------------------------------------------------------- spawn()


def _rank_and_sum(d):
    t = torch.tensor([float(d.rank)])
    tdist.all_reduce(t)
    return (d.rank, d.world_size, t.item())


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_spawn_returns_values_in_rank_order(n):
    out = launch.spawn(_rank_and_sum, world_size=n)
    total = sum(range(n))
    assert out == [(r, n, float(total)) for r in range(n)]


def test_spawn_ships_closures_and_lambdas_by_value():
    offset = 100
    scale = torch.arange(4.0)

    def closure(d, extra):
        return offset + float(scale[d.rank]) + extra

    assert launch.spawn(closure, world_size=4, args=(0.5,)) == [100.5, 101.5, 102.5, 103.5]
    assert launch.spawn(lambda d: d.rank * offset, world_size=2) == [0, 100]


def test_spawn_reraises_naming_the_rank_while_others_wait_in_a_collective():
    def rank3_fails(d):
        if d.rank == 3:
            raise KeyError("missing on rank 3")
        t = torch.ones(1)
        tdist.all_reduce(t)  # waits for rank 3, which never arrives
        return t.item()

    t0 = time.monotonic()
    with pytest.raises(RankFailure, match="rank 3") as info:
        launch.spawn(rank3_fails, world_size=4, timeout=60)
    assert time.monotonic() - t0 < 30
    assert info.value.rank == 3
    assert isinstance(info.value.original, KeyError)
    assert "missing on rank 3" in str(info.value) and "rank3_fails" in str(info.value)
    # The pool is usable again right away.
    assert launch.spawn(lambda d: d.rank, world_size=4) == [0, 1, 2, 3]


def test_spawn_reports_a_crashed_rank_and_a_timeout():
    def crash(d):
        if d.rank == 1:
            os._exit(7)
        tdist.barrier()

    with pytest.raises(RankFailure, match="rank 1") as info:
        launch.spawn(crash, world_size=2, timeout=60)
    assert "code 7" in str(info.value)

    def hang(d):
        if d.rank == 0:
            time.sleep(600)
        return d.rank

    t0 = time.monotonic()
    with pytest.raises(RankFailure, match="timed out"):
        launch.spawn(hang, world_size=2, timeout=3)
    assert time.monotonic() - t0 < 20


def test_spawn_prefixes_rank_output(capsys):
    launch.spawn(lambda d: print("hello", d.rank), world_size=2)
    out = capsys.readouterr().out
    assert "[rank0] hello 0" in out and "[rank1] hello 1" in out


def test_repeated_spawn_calls_in_one_process():
    for i in range(5):
        assert launch.spawn(lambda d, i: d.rank + i, world_size=3, args=(i,)) == [i, i + 1, i + 2]


def test_rank_0_alone_serves_the_rendezvous_on_the_socket_the_pool_opened():
    """The zygote listens before it forks (so no rank is refused and backs off: speed is
    ``bench launch``'s max column), hands the socket to rank 0's store and keeps no copy."""

    def port_and_listening(d):
        mine = psutil.Process().net_connections(kind="tcp")
        listening = {c.laddr.port for c in mine if c.status == psutil.CONN_LISTEN}
        return int(os.environ["MASTER_PORT"]), listening

    launch.spawn(lambda d: None, world_size=2)  # the pool is up
    zygote = psutil.Process(get_pool()._proc.pid)
    fds = zygote.num_fds()
    for _ in range(3):
        out = launch.spawn(port_and_listening, world_size=4)
        port = out[0][0]
        assert [p for p, _ in out] == [port] * 4, out
        assert port in out[0][1], f"rank 0 does not serve the store on port {port}: {out[0]}"
        assert not any(port in held for _, held in out[1:]), f"ranks 1-3 kept the socket: {out}"
    assert zygote.num_fds() == fds, "the zygote kept the rendezvous sockets it opened"
    assert not any(c.status == psutil.CONN_LISTEN for c in zygote.net_connections(kind="tcp"))


def test_a_rank_that_knocks_before_rank_0_serves_is_queued_not_refused():
    """With env:// a rank that connects before rank 0's store exists is refused and backs
    off; on the zygote's socket, listening before any rank runs, it waits in the queue."""
    from helpers.launch.zygote import rendezvous_socket, store_for_rank

    listener = rendezvous_socket()
    port, stores = listener.getsockname()[1], {}

    def rank_1():  # its own copy of the socket, which it closes, as a forked rank does
        stores[1] = store_for_rank(1, 2, port, os.dup(listener.fileno()), timeout=20)

    early = threading.Thread(target=rank_1)
    early.start()
    time.sleep(0.3)  # rank 1 is already waiting when rank 0 starts serving
    stores[0] = store_for_rank(0, 2, port, listener.detach(), timeout=20)
    early.join(20)
    stores[1].set("from rank 1", "hello")
    assert stores[0].get("from rank 1") == b"hello"


def test_spawn_from_a_plain_script_with_unguarded_top_level_code(tmp_path):
    # No `if __name__ == "__main__"`: the pool must never re-import the caller's script.
    script = _script(
        tmp_path,
        textwrap.dedent(
            """
            import torch.distributed as tdist
            import torch
            from helpers import launch
            print("top level ran")

            def f(d):
                t = torch.ones(1)
                tdist.all_reduce(t)
                return t.item()

            print("result", launch.spawn(f, world_size=2))
            """
        ),
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=_child_env(), timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("top level ran") == 1
    assert "result [2.0, 2.0]" in out.stdout


def test_spawn_rejects_bad_input():
    with pytest.raises(ValueError, match="world_size"):
        launch.spawn(lambda d: 0, world_size=0)
    with pytest.raises(TypeError, match="function"):
        launch.spawn(42, world_size=2)


def test_stopping_a_rank_also_stops_processes_it_started(tmp_path):
    pidfile = tmp_path / "grandchild.pid"

    def starts_a_helper_then_hangs(d, path):
        if d.rank == 0:
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open(path, "w").write(str(helper.pid))
            time.sleep(600)
        return d.rank

    with pytest.raises(RankFailure, match="timed out"):
        launch.spawn(starts_a_helper_then_hangs, world_size=2, args=(str(pidfile),), timeout=5)
    pid = int(pidfile.read_text())
    for _ in range(50):  # the kill is asynchronous: give the kernel a moment
        try:  # a killed process not yet reaped by its new parent is a zombie: it is gone
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {pid} started by rank 0 outlived the spawn")


def _all_raise(d):
    raise NotImplementedError("fill in this function")


def _rank1_raises(d):
    import torch
    import torch.distributed as tdist

    if d.rank == 1:
        raise KeyError("only rank 1")
    tdist.all_reduce(torch.ones(1))


def test_a_failure_of_every_rank_says_so_and_shows_the_rank_traceback_first():
    with pytest.raises(RankFailure) as info:
        launch.spawn(_all_raise, world_size=4)
    err = info.value
    assert err.headline().startswith("all 4 ranks raised NotImplementedError")
    shown = err._render_traceback_()
    assert shown[0].startswith("RankFailure: all 4 ranks raised NotImplementedError")
    body = "\n".join(shown)
    assert "_all_raise" in body and "fill in this function" in body
    assert "helpers/launch" not in body and "pool.py" not in body  # no launcher frames


def test_one_failing_rank_is_named_and_the_others_reported_stopped():
    with pytest.raises(RankFailure) as info:
        launch.spawn(_rank1_raises, world_size=3)
    assert info.value.failed == [1]
    assert info.value.headline().startswith("rank 1 failed; the other 2 ranks were stopped")
    two = launch.RankFailure(1, "KeyError: 'x'", failed=[1], world_size=2)
    assert two.headline() == "rank 1 failed; the other rank was stopped: KeyError: 'x'"


def test_warm_up_in_the_background_then_spawn(tmp_path):
    # The lab's first cell starts the pool without waiting; the first spawn waits for it.
    script = _script(
        tmp_path,
        "from helpers import launch\n"
        "from helpers.launch.pool import get_pool\n"
        "launch.warm_up(wait=False)\n"
        "print('ready right away:', get_pool()._ready)\n"
        "print(launch.spawn(lambda d: d.rank * 10, world_size=3))\n",
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=_child_env(), timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "ready right away: False" in out.stdout and "[0, 10, 20]" in out.stdout
