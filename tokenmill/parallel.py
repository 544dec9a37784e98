"""Process fan-out for shard-by-shard stages: the same task list runs in-process or over a pool."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """Worker processes for a stage: TOKENMILL_WORKERS, else the usable cores."""
    env = os.environ.get("TOKENMILL_WORKERS")
    if env:
        return max(1, int(env))
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def map_ordered(fn: Callable[[T], R], tasks: Iterable[T], workers: int | None = None) -> Iterator[R]:
    """Yields fn(task) for each task, in task order, using `workers` processes (1: in this process).

    Results come back in order so outputs are byte-identical whatever the worker count. `spawn` keeps
    workers free of the parent's threads and locks (the Dagster run process has several).
    """
    tasks = list(tasks)
    workers = default_workers() if workers is None else workers
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield fn(task)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        yield from pool.map(fn, tasks)
