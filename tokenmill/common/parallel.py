"""Process fan-out for shard-by-shard stages: the same task list runs in-process, over a pool, or on the engine
that `tokenmill.common.compute` made active for the current asset (a Ray cluster)."""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import gc
import multiprocessing
import multiprocessing.util
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Protocol, TypeVar

from tokenmill.common.failpoints import failpoint
from tokenmill.errors import ConfigError
from tokenmill.settings import number_from_env

T = TypeVar("T")
R = TypeVar("R")


class Engine(Protocol):
    """Where map_ordered runs tasks while an asset has activated it (tokenmill.common.compute)."""

    def workers(self) -> int:
        """Tasks that can run at once: what stages plan their task lists for."""

    def map(self, fn: Callable[[T], R], tasks: list[T], workers: int) -> Iterator[R]:
        """fn(task) for each task, in task order."""


_engine: Engine | None = None  # process-wide: the Dagster run process executes one step at a time


@contextlib.contextmanager
def engine_in_use(engine: Engine) -> Iterator[Engine]:
    """Routes every map_ordered and default_workers call of this process to `engine` for the block."""
    global _engine
    previous, _engine = _engine, engine
    try:
        yield engine
    finally:
        _engine = previous


def default_workers() -> int:
    """Worker processes for a stage: the active engine's, else TOKENMILL_WORKERS, else the usable cores."""
    if _engine is not None:
        return _engine.workers()
    return local_workers()


MAX_WORKERS_PER_CORE = 8  # each worker is a process of its own (~150 MB once imported): more only add memory


def local_workers(requested: int = 0) -> int:
    """`requested` (compute.workers), else TOKENMILL_WORKERS, else the usable cores; more than
    MAX_WORKERS_PER_CORE per usable core is a ConfigError (thousands would exhaust memory before any work)."""
    cores = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    workers = requested or number_from_env("TOKENMILL_WORKERS", 0, int)
    if workers > MAX_WORKERS_PER_CORE * cores:
        raise ConfigError(
            f"compute.workers / TOKENMILL_WORKERS: {workers} worker processes, at most {MAX_WORKERS_PER_CORE * cores} "
            f"on this machine ({MAX_WORKERS_PER_CORE} per usable core; {cores} usable)"
        )
    return workers or cores


@contextlib.contextmanager
def _main_module_hidden(fn: Callable) -> Iterator[None]:
    """Spawned workers re-import the parent's __main__; under Dagster that is its CLI (seconds per
    worker). Hide it unless the task function itself lives there (a script)."""
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__":
        main = None
    saved: dict[str, object] = {
        k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__
    }
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            if "__spec__" in saved:
                main.__spec__ = None
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


PARENT_POLL_SECONDS = 1.0


def _exit_with_parent(parent_pid: int) -> None:
    """Worker initializer: a daemon thread ends the worker once its run process is gone (OOM killer, kill -9),
    so no orphan keeps memory or a half-finished file. Reparenting changes getppid(), which needs no signal."""

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="tokenmill-parent-watch", daemon=True).start()


def hash_ranges(parts: int) -> list[tuple[int, int]]:
    """`parts` equal ranges [lo, hi) of a 64-bit hash (the last hi is 2**64): how a step over hashed items is
    partitioned into tasks that each see every item of their range."""
    bounds = [i * (1 << 64) // parts for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def map_ordered(fn: Callable[[T], R], tasks: Iterable[T], workers: int | None = None) -> Iterator[R]:
    """Yields fn(task) for each task, in task order, on the active engine, else over `workers` local processes
    (1: in this process).

    Results come back in order so outputs are byte-identical whatever the worker count or engine.
    """
    tasks = list(tasks)
    workers = default_workers() if workers is None else workers
    if _engine is not None:
        return _engine.map(fn, tasks, workers)
    return pool_map(fn, tasks, workers)


def pool_map(fn: Callable[[T], R], tasks: list[T], workers: int) -> Iterator[R]:
    """The local engine: fn over `workers` spawned processes, results in task order (1: in this process).
    `spawn` keeps workers free of the parent's threads and locks (the Dagster run process has several)."""
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield fn(task)
        return
    pool = _shared_pool(workers)
    with _main_module_hidden(fn):
        # every worker is spawned here; each future is dropped once its result is taken, so a result the consumer
        # has let go is freed (tokenize's encoded arrays of 10M records would otherwise stay until the step ends)
        pending = collections.deque(pool.submit(_without_gc_pauses, fn, task) for task in tasks)
    try:
        failpoint(f"tasks:{getattr(fn, '__name__', fn)}")
        while pending:
            yield pending.popleft().result()
    finally:  # a failed or abandoned step leaves no task of it queued or running
        for future in pending:
            future.cancel()
        concurrent.futures.wait(pending)


def _without_gc_pauses(fn: Callable[[T], R], task: T) -> R:
    """fn(task) in a worker with the cyclic garbage collector paused: the stages allocate millions of small acyclic
    objects (records, token lists) that reference counting frees, and the collector's passes over them cost a
    measurable share of an encode task (docs/profile.md, 'What changed in this round'). It runs again between tasks."""
    gc.disable()
    try:
        return fn(task)
    finally:
        gc.enable()


def _ready() -> None:
    """A warm-up task: the worker has started and imported what every task needs (numpy)."""
    import numpy  # noqa: F401


def start_workers(workers: int | None = None) -> None:
    """Starts the local worker pool now, without waiting: its workers spawn and import while this process sets up
    the run, and the first parallel step finds them ready. Nothing under another engine or with one worker."""
    workers = default_workers() if workers is None else workers
    if _engine is None and workers > 1:
        pool = _shared_pool(workers)
        with _main_module_hidden(_ready):
            for _ in range(workers):
                pool.submit(_ready)


_holders = 0  # open workers_kept blocks: the last to leave closes the pool


@contextlib.contextmanager
def workers_kept(workers: int | None = None) -> Iterator[None]:
    """Starts the local worker pool now (start_workers) and keeps it for the block, then shuts it down: the pool
    lives as long as the run (the Compute resource) or the command (`tokenmill update`, around all its runs) that
    holds it. Nested blocks share it; the outermost closes it. Without a holder (plain library calls), the pool
    map_ordered starts is closed when the process exits."""
    global _holders
    start_workers(workers)
    _holders += 1
    try:
        yield
    finally:
        _holders -= 1
        if not _holders:
            close_workers()


_pool: ProcessPoolExecutor | None = None
_pool_key: tuple | None = None


def _shared_pool(workers: int) -> ProcessPoolExecutor:
    """The run's worker pool, started once and reused by every parallel step of every stage: starting one is not
    cheap (each worker imports numpy, pydantic and the stage modules; docs/profile.md, 'What changed in this round'),
    and a run has ~15 such steps.
    Tasks leave no process-wide setting behind (dedup trims the heap it freed instead of fixing glibc's malloc
    parameters). A new pool replaces it when the worker count, the environment, the working directory or the
    import path changed (workers take them at spawn) or a worker died."""
    global _pool, _pool_key
    key = (workers, tuple(sorted(os.environ.items())), os.getcwd(), tuple(sys.path))
    if _pool is not None and (_pool_key != key or _pool._broken):
        close_workers()
    if _pool is None:
        _pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_exit_with_parent,
            initargs=(os.getpid(),),
        )
        _pool_key = key
    return _pool


def close_workers() -> None:
    """Shuts the pool down and waits for its workers to exit (quick: a step's tasks are already done or cancelled)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
        _pool = None


# The last resort for a pool nobody closed. Not atexit: a process that multiprocessing started (Dagster's run
# process is one) joins its non-daemon children, the pool's workers, before its atexit hooks run, and would wait
# for them forever. multiprocessing's exit finalizers run before that join (and from its atexit hook in any other
# process), highest priority first: above 10, the pool's queues still carry the workers' stop signals.
multiprocessing.util.Finalize(None, close_workers, exitpriority=100)


@atexit.register
def _skip_final_collections() -> None:
    """At exit, the heap moves to the collector's permanent generation, so the interpreter's final collections skip it:
    they walked every object of a run process that imported Dagster, pandas and pyarrow, and did as much in each worker,
    both at the end of every run (docs/profile.md, 'What changed in this round'). Reference counting still frees what
    module teardown releases; the OS takes the rest. It cannot block: by then the workers are gone (see
    close_workers)."""
    gc.freeze()
