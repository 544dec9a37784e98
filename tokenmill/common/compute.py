"""Compute engines behind `map_ordered`: the local process pool (the default) or a Ray cluster.

An asset activates one engine around its stage call (`activated`); every `map_ordered` of the stage then runs its
tasks there, unchanged. Under Ray each task is a Ray task with declared CPUs and memory, retried by Ray when its
worker process or node dies (`max_retries`); the run process only schedules and merges the small results. Tasks
read and write the data root themselves, so every node must mount it at the same path: a task on a node that
cannot see it fails naming the node and the path. With a staging prefix on object storage (`DataRootStager`,
tokenmill.common.staging) no node needs the data root: each task's files cross the prefix instead. Results still
come back in task order, so the outputs are byte-identical whatever the engine, the number of nodes or the order in
which tasks finish.

`Usage` records what an asset used (engine, nodes, CPUs, seconds and tasks per step) for its metadata, and each
step logs tasks done / total with rate and ETA.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from tokenmill.common.parallel import engine_in_use, local_workers, pool_map
from tokenmill.common.progress import Progress
from tokenmill.common.staging import (
    DataRootStager,
    StagingArea,
    TaskFiles,
    Traffic,
    named_paths,
    node_cache,
    run_staged,
)
from tokenmill.errors import ComputeError

T = TypeVar("T")
R = TypeVar("R")

PROGRESS_SECONDS = 10.0  # at most one progress line per step this often (and one when the step ends)


@dataclass(kw_only=True)
class Usage:
    """What one asset's steps used: filled in by the engine, read back for the asset's metadata."""

    engine: str
    nodes: int
    cpus: float
    # step -> seconds, tasks, nodes (the nodes its tasks ran on); with a staging prefix also staged_bytes_up and
    # staged_bytes_down (through the prefix, by the run process and the nodes together)
    steps: dict[str, dict] = field(default_factory=dict)

    def add(self, step: str, tasks: int, seconds: float, nodes: set[str]) -> None:
        entry = self._entry(step)
        entry["seconds"] = round(entry["seconds"] + seconds, 3)
        entry["tasks"] += tasks
        entry["nodes"] = max(entry["nodes"], len(nodes))

    def add_staged(self, step: str, traffic: Traffic) -> None:
        entry = self._entry(step)
        entry["staged_bytes_up"] = entry.get("staged_bytes_up", 0) + traffic.up
        entry["staged_bytes_down"] = entry.get("staged_bytes_down", 0) + traffic.down

    def _entry(self, step: str) -> dict:
        return self.steps.setdefault(step, {"seconds": 0.0, "tasks": 0, "nodes": 0})


class LocalEngine:
    """Today's behaviour: a spawned process pool on this machine (TOKENMILL_WORKERS, else the usable cores)."""

    name = "local"

    def __init__(self, workers: int = 0, label: str = "", log=None):
        self._workers = local_workers(workers)
        self.label, self.log = label, log
        self.usage = Usage(engine=self.name, nodes=1, cpus=self._workers)

    def workers(self) -> int:
        return self._workers

    def map(self, fn: Callable[[T], R], tasks: list[T], workers: int) -> Iterator[R]:
        step = _Step(self.usage, _step_name(self.label, fn), len(tasks), self.log)
        for result in pool_map(fn, tasks, workers):
            step.task_done(socket.gethostname())
            yield result


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """How each task is declared to Ray."""

    address: str  # "auto", "host:port" (this machine joins as a driver) or "ray://host:port" (Ray client)
    task_cpus: float = 1.0
    task_memory_mb: int = 2048
    max_retries: int = 3  # re-runs of a task whose worker process or node died (its exceptions are never retried)


class RayEngine:
    """Tasks as Ray tasks on the cluster at `options.address`; connected once per run (`connect`). With a `stager`
    the nodes need no data root: each task's files cross its staging prefix."""

    name = "ray"

    def __init__(
        self, options: RayOptions, data_root: str, label: str = "", log=None, stager: DataRootStager | None = None
    ):
        import ray

        self.ray, self.options, self.data_root = ray, options, data_root
        self.label, self.log, self.stager = label, log, stager
        nodes = [n for n in ray.nodes() if n["Alive"]]
        self.usage = Usage(engine=self.name, nodes=len(nodes), cpus=sum(n["Resources"].get("CPU", 0) for n in nodes))

    @staticmethod
    def connect(address: str) -> None:
        """Joins the cluster (once per process and address); a wrong address is a clear error."""
        import ray

        if ray.is_initialized():
            return
        _check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError) as e:
            raise ComputeError(
                f"compute.ray_address {address!r}: no Ray cluster reachable ({e}); start one with "
                f"`ray start --head` or set TOKENMILL_RAY_ADDRESS"
            ) from e

    @staticmethod
    def disconnect() -> None:
        import ray

        ray.shutdown()

    def workers(self) -> int:
        return max(1, int(self.usage.cpus // self.options.task_cpus))

    def map(self, fn: Callable[[T], R], tasks: list[T], workers: int) -> Iterator[R]:
        """Every task goes to the cluster, whatever `workers` says (a stage passes 1 where a local pool would not
        pay off; here workers are warm and the run process only schedules). At most twice as many tasks as the
        cluster has task slots are queued or running at once, topped up as any of them finishes, and results are
        taken in task order.

        A failed or abandoned step cancels nothing: Ray 2.60 aborts the driver when a cancel crosses the reply of
        a task finishing at that moment ("Tried to complete task that was not pending", task_manager.cc). The
        window bounds what is left to finish on its own (or to end with the run's driver) instead."""
        ray, opt = self.ray, self.options
        step = _step_name(self.label, fn)
        remote = ray.remote(run_task).options(
            name=step,
            # across the nodes: tasks read and write the shared data root (or the staging prefix), so no node holds
            # their data; Ray's default packs a short step's tasks onto the first node while the others' workers are
            # still starting
            scheduling_strategy="SPREAD",
            num_cpus=opt.task_cpus,
            memory=opt.task_memory_mb << 20,
            max_retries=opt.max_retries,
            retry_exceptions=False,
        )
        tracker = _Step(self.usage, step, len(tasks), self.log)
        window = 2 * self.workers()
        not_sent = iter(tasks)
        submitted: collections.deque = collections.deque()  # refs whose results are not taken yet, in task order
        unfinished: set = set()  # refs Ray has not finished: queued or running
        stager = self.stager
        counted = dataclasses.replace(stager.traffic) if stager is not None else Traffic()

        def top_up() -> None:
            for task in itertools.islice(not_sent, max(0, window - len(unfinished))):
                staged = None
                if stager is not None:  # the files under the data-root paths the task names, uploaded where needed
                    staged = Staged(area=stager.area, inputs=stager.inputs(named_paths((fn, task), self.data_root)))
                ref = remote.remote(fn, task, self.data_root, staged)
                submitted.append(ref)
                unfinished.add(ref)

        for i in range(len(tasks)):
            top_up()
            while submitted[0] in unfinished:
                ready, _ = ray.wait(list(unfinished), num_returns=1)
                unfinished.difference_update(ready)
                top_up()
            result, node = self._result(submitted.popleft(), step, i, len(tasks))
            if stager is not None:
                result = self._published(stager, step, result, counted)
            tracker.task_done(node)
            yield result

    def _published(self, stager: DataRootStager, step: str, staged_result: tuple, counted: Traffic) -> object:
        """A task's outputs written into the data root before its result is taken; the step's bytes through the
        prefix counted: the node's, and the run process's since `counted` (its uploads for the tasks sent since)."""
        result, outputs, traffic = staged_result
        stager.publish(outputs)
        total = stager.traffic
        traffic.add(Traffic(up=total.up - counted.up, down=total.down - counted.down))
        counted.up, counted.down = total.up, total.down
        self.usage.add_staged(step, traffic)
        return result

    def _result(self, ref, step: str, i: int, n: int):
        from ray.exceptions import RayError, RayTaskError

        try:
            return self.ray.get(ref)
        except RayTaskError as e:
            raise e.as_instanceof_cause() from None  # the task's own error (CorruptOutputError, ...), unchanged
        except RayError as e:
            raise ComputeError(
                f"step {step}: task {i + 1} of {n} failed on the Ray cluster at {self.options.address} after "
                f"{self.options.max_retries} retries ({type(e).__name__}: {str(e).strip().splitlines()[0]}): a node "
                f"or worker process was lost; rerun once the cluster is healthy"
            ) from e


CONNECT_SECONDS = 10.0  # ray.init retries an unreachable GCS for minutes: fail fast with the address instead


def _check_reachable(address: str) -> None:
    """A TCP connection to host:port (or ray://host:port) before ray.init; 'auto' is found by Ray itself."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as e:
        raise ComputeError(
            f"compute.ray_address {address!r}: nothing answers at {host}:{port} ({e}); is the head "
            f"node up (`ray start --head --port={port}`)?"
        ) from e


@dataclass(frozen=True, kw_only=True)
class Staged:
    """What a staged task takes to its node: the prefix and the files it finds there."""

    area: StagingArea
    inputs: TaskFiles


def run_task(fn: Callable[[T], R], task: T, data_root: str, staged: Staged | None = None) -> tuple[object, str]:
    """On a Ray worker: fn(task), after checking this node sees the data root, or, `staged`, in a folder of this
    node filled from the staging prefix (then the result comes with what the task wrote and the bytes moved);
    returns that and the node id."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    if staged is not None:
        return run_staged(
            fn, task, data_root=data_root, area=staged.area, inputs=staged.inputs, cache=node_cache()
        ), node
    if data_root and not os.path.isdir(data_root):
        raise ComputeError(
            f"node {socket.gethostname()} ({ray.util.get_node_ip_address()}, Ray node {node[:12]}) "
            f"cannot see the data root {data_root}: every node of the cluster must mount it at the "
            f"same path"
        )
    return fn(task), node


def _step_name(label: str, fn: Callable) -> str:
    # a functools.partial is named by its function (its repr holds an address, which would differ run to run)
    name = getattr(getattr(fn, "func", fn), "__name__", type(fn).__name__)
    return f"{label}:{name}" if label else name


class _Step:
    """One map over a task list: progress lines, and its seconds, tasks and nodes recorded in `usage` when the
    last result arrives (consumers such as zip() may never ask the iterator for its end)."""

    def __init__(self, usage: Usage, name: str, tasks: int, log):
        self.usage, self.name, self.tasks, self.log = usage, name, tasks, log
        self.nodes: set[str] = set()
        self.progress = Progress(
            f"{usage.engine} {name}", total=tasks, unit="tasks", log=log, interval=PROGRESS_SECONDS
        )
        if not tasks:
            self._end()

    def task_done(self, node: str) -> None:
        self.nodes.add(node)
        self.progress.advance()
        if self.progress.done == self.tasks:
            self._end()

    def _end(self) -> None:
        self.usage.add(self.name, self.tasks, time.perf_counter() - self.progress.start, self.nodes)
        if self.log is not None:
            self.progress.finish()


@contextlib.contextmanager
def activated(engine: LocalEngine | RayEngine) -> Iterator[Usage]:
    """Runs every map_ordered of the block on `engine`; yields its Usage."""
    with engine_in_use(engine):
        yield engine.usage
