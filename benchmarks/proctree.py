"""Memory of a process and its descendants, read from /proc (Linux), shared by the benchmarks."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


def status_mib(pid: int | str, field: str) -> float:
    """A /proc/<pid>/status figure in MiB (VmRSS, VmHWM, ...); 0 when the process is gone. VmHWM, unlike
    ru_maxrss, is not inherited across fork and exec: a worker's figure is its own."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (its workers, and theirs)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                    found += kids
                    todo += kids
        except OSError:
            pass
    return found


class Periodic:
    """Calls `sample()` every `interval` seconds in a thread while the `with` block runs (and once at its start)."""

    def __init__(self, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class TreeSampler(Periodic):
    """Samples `measure(descendant pids)` every `interval` seconds in a thread; `peak` is the largest value."""

    def __init__(self, measure: Callable[[list[int]], float], interval: float):
        super().__init__(interval)
        self.peak = 0.0
        self._measure = measure

    def sample(self):
        self.peak = max(self.peak, self._measure(descendants(os.getpid())))
