"""Process fan-out: results in task order whatever the worker count; workers never outlive their run process."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref

from tokenmill.common import parallel
from tokenmill.common.parallel import map_ordered, start_workers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def square(x: int) -> int:
    return x * x


def test_results_come_back_in_task_order_for_any_worker_count():
    assert list(map_ordered(square, range(20), workers=2)) == list(map_ordered(square, range(20), workers=1))


class Payload:
    """A task result that can be weakly referenced (ints and dicts cannot)."""

    def __init__(self, i: int):
        self.i = i


def payload(i: int) -> Payload:
    return Payload(i)


def test_a_result_taken_and_dropped_is_freed_before_the_step_ends():
    """The pool keeps no result once handed over: a consumer that holds one task's arrays at a time (tokenize's
    packing) holds that much, not every task's until the last."""
    results = map_ordered(payload, range(6), workers=2)
    first = weakref.ref(next(results))
    gc.collect()
    assert first() is None
    assert [r.i for r in results] == [1, 2, 3, 4, 5]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


def test_workers_exit_when_the_run_process_is_killed(tmp_path):
    """kill -9 of the run process alone (as the OOM killer does) must not leave its workers running."""
    script = textwrap.dedent("""
        import os, sys, time
        from tokenmill.common.parallel import map_ordered
        def report_and_block(i):
            os.write(1, f"{os.getpid()}\\n".encode())  # one write: two workers' lines never interleave
            time.sleep(600)
        if __name__ == "__main__":
            list(map_ordered(report_and_block, range(2), workers=2))
    """)
    (tmp_path / "run.py").write_text(script)
    run = subprocess.Popen(
        [sys.executable, str(tmp_path / "run.py")], cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    workers = [int(run.stdout.readline()) for _ in range(2)]
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 15
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [w for w in workers if alive(w)]
    for w in survivors:
        os.kill(w, signal.SIGKILL)
    assert not survivors, f"workers {survivors} outlived their run process"


def worker_pid(_) -> int:
    time.sleep(0.05)  # long enough that every worker takes a task
    return os.getpid()


def worker_env(name: str) -> str | None:
    return os.environ.get(name)


def collector_running(_) -> bool:
    return gc.isenabled()


def test_tasks_run_with_the_cyclic_collector_paused_and_it_resumes_after():
    assert list(map_ordered(collector_running, range(4), 2)) == [False] * 4
    assert [parallel._without_gc_pauses(collector_running, 0), gc.isenabled()] == [False, True]


def test_steps_share_warm_workers_until_the_environment_changes(monkeypatch):
    """A run's steps reuse one pool (starting one costs seconds); workers that took an older environment at spawn
    are replaced, so a task always sees the environment of the call that submitted it."""
    first = set(map_ordered(worker_pid, range(8), workers=2))
    assert set(map_ordered(worker_pid, range(4), workers=2)) <= first
    monkeypatch.setenv("TOKENMILL_TEST_MARK", "changed")
    assert list(map_ordered(worker_env, ["TOKENMILL_TEST_MARK"] * 2, workers=2)) == ["changed", "changed"]
    assert not set(map_ordered(worker_pid, range(4), workers=2)) & first


def test_workers_started_ahead_serve_the_first_step():
    """`tokenmill update` starts the pool before importing Dagster: the first step's tasks run on those workers."""
    start_workers(2)
    started = set(parallel._pool._processes)
    assert len(started) == 2
    assert set(map_ordered(worker_pid, range(4), workers=2)) <= started


def test_a_run_computing_locally_starts_its_workers_before_its_first_step():
    """Under `dagster asset materialize` (or any launch but `tokenmill update`), the Compute resource starts the
    pool when the run sets up: the first step's workers are already spawning."""
    import dagster as dg

    from resources import Compute

    parallel.close_workers()
    workers_at_step_start = []

    @dg.asset
    def probe(compute: Compute) -> None:
        workers_at_step_start.append(len(parallel._pool._processes) if parallel._pool else 0)

    assert dg.materialize([probe], resources={"compute": Compute(workers=2)}).success
    assert workers_at_step_start == [2]
    assert parallel._pool is None, "the run's pool outlived the run"


def test_a_run_refused_at_set_up_closes_the_pool_it_started():
    import dagster as dg

    from resources import Compute

    class Refused(dg.ConfigurableResource):  # initialized after `compute` (resource keys in order)
        def setup_for_execution(self, context) -> None:
            raise ValueError("refused at set-up")

    @dg.asset
    def probe(compute: Compute, refused: Refused) -> None: ...

    resources = {"compute": Compute(workers=2), "refused": Refused()}
    assert not dg.materialize([probe], resources=resources, raise_on_error=False).success
    assert parallel._pool is None


def test_a_process_started_by_multiprocessing_exits_after_using_the_pool(tmp_path):
    """Dagster's run process is a multiprocessing child: it joins its non-daemon children (the workers) before its
    atexit hooks run, so a pool still open at its end kept it and its workers alive forever."""
    script = textwrap.dedent("""
        import multiprocessing
        from tokenmill.common.parallel import map_ordered
        def run():
            assert list(map_ordered(abs, [-1, -2], workers=2)) == [1, 2]
        if __name__ == "__main__":
            process = multiprocessing.get_context("spawn").Process(target=run)
            process.start()
            process.join(30)
            print(process.exitcode)
            process.kill()
    """)
    (tmp_path / "run.py").write_text(script)
    out = subprocess.run([sys.executable, str(tmp_path / "run.py")], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.strip() == "0", out.stderr[-2000:]


def test_a_process_using_the_pool_freezes_its_heap_at_exit():
    """The interpreter's final collections skip a frozen heap (0.4-0.6 s at the end of every run process)."""
    script = textwrap.dedent(
        """
        import atexit, gc
        atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))  # runs after tokenmill's
        from tokenmill.common import parallel
        assert list(parallel.map_ordered(abs, [-1, -2], workers=2)) == [1, 2]
        print("frozen before exit:", gc.get_freeze_count() > 0)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["frozen before exit: False", "frozen at exit: True"]


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("task 3")
    return x


def test_a_failed_step_leaves_the_pool_usable():
    try:
        list(map_ordered(fail_on_three, range(8), workers=2))
    except ValueError as e:
        assert str(e) == "task 3"
    else:
        raise AssertionError("the task's error did not reach the caller")
    assert list(map_ordered(square, range(6), workers=2)) == [0, 1, 4, 9, 16, 25]
