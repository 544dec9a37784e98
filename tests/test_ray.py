"""The Ray engine on a real local cluster started by these tests (ray.cluster_utils.Cluster: a head node and, from
the second test on, a second node of one CPU each, on free ports): the whole graph writes the same files as the
local engine, launched through the webserver's launchpad too; a worker killed mid-task is retried; a lost node fails
the run naming the step and a rerun succeeds; a node that cannot see the data root is named; a failed step leaves
only a window of tasks to finish.

pytest itself never joins the cluster: each test's Ray driver (the run) is a process of its own (`driven`), so a
driver that dies with a removed node, or crashes in Ray's exit hooks, fails that test instead of ending pytest."""

import multiprocessing
import os
import re
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import dagster as dg
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from support import BATCH, published_files  # noqa: E402

from assets.batches import register_batches  # noqa: E402
from definitions import build_defs  # noqa: E402
from devtools.dagster_server import DagsterDev  # noqa: E402
from resources import DEFAULT_SOURCE as DEMO_SOURCE  # noqa: E402
from resources import Compute, CorpusSource, DataRoot  # noqa: E402
from runs import run_batches  # noqa: E402
from tokenmill.common.compute import RayEngine, RayOptions, activated  # noqa: E402
from tokenmill.common.parallel import map_ordered  # noqa: E402
from tokenmill.errors import ComputeError  # noqa: E402

pytestmark = pytest.mark.timeout(900)
SKIPPED = {"_timings.json"}  # seconds and worker counts; every other file must be byte-identical
STEP = "tokenized_bins:encode_task"  # the demo corpus's step with the most tasks (6) and the longest ones


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files(root: Path) -> dict[str, bytes]:
    """Every published file under the data root (stage and batch links followed), but the timings."""
    return published_files(root, frozenset(SKIPPED))


def same_files(expected: dict[str, bytes], root: Path) -> list[str]:
    got = files(root)
    return sorted(set(expected) ^ set(got)) + [k for k in expected if k in got and expected[k] != got[k]]


def run_job(source: Path, root: Path, compute: Compute, raise_on_error: bool = True, run_config: dict | None = None):
    """The source as its first batch through the whole graph (again when it already ran: a rerun)."""
    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(root)), compute)
    with dg.instance_for_test() as instance:
        pending = register_batches(instance, root, source.resolve())[0] or [BATCH]
        job = defs.resolve_job_def("tokenmill_all")
        ((_, result),) = run_batches(job, instance, pending, run_config, raise_on_error)
        return result


def step_usage(result, asset: str) -> dict:
    event = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset)
    md = event.materialization.metadata
    return {"engine": md["engine"].value, "nodes": md["nodes"].value, "steps": md["step_seconds"].value}


def error_text(error) -> str:
    """A step's error with its causes, as Dagster recorded them."""
    return "" if error is None else f"{error.cls_name}: {error.message}\n{error_text(error.cause)}"


def driven(fn, *args):
    """fn(*args) in a fresh process, the test's Ray driver: it joins the cluster and leaves with it, and when it dies
    (its raylet was removed, Ray crashed at exit) the test fails with BrokenProcessPool while pytest goes on."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as driver:
        return driver.submit(fn, *args).result()


def ray_run(source: Path, root: Path, compute: dict, raise_on_error: bool = True, run_config: dict | None = None):
    """In the driver: run_job on the ray engine; what the tests read of the result (Dagster's result stays here)."""
    result = run_job(source, root, Compute(engine="ray", **compute), raise_on_error, run_config)
    if not result.success:
        failure = result.failure_data_for_node("tokenized_bins")
        return {"success": False, "error": error_text(failure.error if failure else None)}
    return {
        "success": True,
        "usage": {asset: step_usage(result, asset) for asset in ("tokenized_bins", "dedup_report")},
    }


def task_processes(step: str, parent: int | None = None) -> list[int]:
    """Ray workers running a task of `step` now (Ray titles a busy worker `ray::<task name>`), under `parent`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if title.startswith(f"ray::{step}") and (parent is None or ppid == parent):
            pids.append(int(proc.name))
    return pids


class WhenTaskRuns(threading.Thread):
    """Calls `action(pid)` once, as soon as a worker runs a task of `step` (under `parent`)."""

    def __init__(self, step: str, action, parent: int | None = None, timeout: float = 300):
        super().__init__(daemon=True)
        self.step, self.action, self.parent, self.timeout = step, action, parent, timeout
        self.hit: int | None = None
        self.stop = threading.Event()

    def run(self):
        deadline = time.monotonic() + self.timeout
        while not self.stop.is_set() and time.monotonic() < deadline:
            pids = task_processes(self.step, self.parent)
            if pids:
                self.hit = pids[0]
                self.action(pids[0])
                return
            time.sleep(0.002)


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    c = Cluster(
        initialize_head=True,
        # the dashboard serves Ray's state API, which the two-node test reads
        head_node_args={
            "gcs_server_port": free_port(),
            "num_cpus": 1,
            "include_dashboard": True,
            "dashboard_port": free_port(),
        },
    )
    try:
        yield c
    finally:
        c.shutdown()
        c.global_state.disconnect()  # its GCS client goes now, not in the interpreter's teardown


@pytest.fixture(scope="module")
def second_node(cluster):
    return cluster.add_node(num_cpus=1)


@pytest.fixture(scope="module")
def local_files(tmp_path_factory, demo_source):
    root = tmp_path_factory.mktemp("local")
    assert run_job(demo_source, root, Compute(engine="local", workers=2)).success
    return files(root)


def test_one_node_through_the_launchpad_same_files(cluster, local_files, tmp_path):
    """The UI path: `dagster dev`, the job launched through GraphQL with the ray engine set in the run config
    (what the launchpad sends), on the code location's default local Compute."""
    from dagster_graphql import DagsterGraphQLClient

    data = tmp_path / "data"
    with DagsterDev(tmp_path / "home", env={"TOKENMILL_DATA": str(data), "TOKENMILL_RAY_ADDRESS": ""}) as server:
        with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
            (batch,), _ = register_batches(instance, data, DEMO_SOURCE)
        client = DagsterGraphQLClient("127.0.0.1", port_number=server.port)
        run_id = client.submit_job_execution(
            "tokenmill_all",
            repository_location_name="tokenmill",
            run_config={"resources": {"compute": {"config": {"engine": "ray", "ray_address": cluster.address}}}},
            tags={"dagster/partition": batch},
        )
        server.wait_for_run(run_id)
        usage = server.latest_metadata("tokenized_bins")
    assert usage["engine"] == "ray" and usage["nodes"] == 1
    assert same_files(local_files, data) == []


def encode_tasks_by_id(address: str) -> dict[str, str]:
    """task id -> node id of every finished encode task Ray's state API knows of."""
    from ray.util.state import list_tasks

    tasks = list_tasks(address=address, filters=[("name", "=", STEP), ("state", "=", "FINISHED")], limit=10_000)
    return {t.task_id: t.node_id for t in tasks}


def nodes_of_new_encode_tasks(address: str, before: dict[str, str], tasks: int) -> set[str]:
    """The nodes that ran the `tasks` encode tasks not in `before`: workers report task events to the state API
    about once a second, so it is asked until all of them are there."""
    deadline = time.monotonic() + 30
    while True:
        new = {task: node for task, node in encode_tasks_by_id(address).items() if task not in before}
        if len(new) >= tasks or time.monotonic() > deadline:
            return set(new.values())
        time.sleep(0.5)


def start_a_worker_on(nodes: list[str]) -> None:
    """A started worker of this job on each node. Ray hands a leased worker the step's next queued task: the demo's
    short tasks could all be done on one node while the other's first worker process is still starting."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def pid() -> int:
        return os.getpid()

    remote = ray.remote(num_cpus=1)(pid)
    ray.get([remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes])


def two_node_run(address: str, nodes: list[str], source: Path, root: Path) -> dict:
    """In the driver: a worker started on each node, then the run; also the nodes its encode tasks ran on."""
    RayEngine.connect(address)
    start_a_worker_on(nodes)
    before = encode_tasks_by_id(address)
    outcome = ray_run(source, root, {"ray_address": address})
    return {**outcome, "ran": nodes_of_new_encode_tasks(address, before, tasks=6)}


def test_two_nodes_same_files_and_tasks_on_both(cluster, second_node, local_files, demo_source, tmp_path):
    nodes = [cluster.head_node.node_id, second_node.node_id]
    outcome = driven(two_node_run, cluster.address, nodes, demo_source, tmp_path)
    assert outcome["success"], outcome
    assert same_files(local_files, tmp_path) == []
    assert outcome["ran"] == set(nodes), outcome["ran"]
    usage = outcome["usage"]["tokenized_bins"]
    assert usage["engine"] == "ray" and usage["nodes"] == 2
    assert usage["steps"][STEP]["tasks"] == 6 and usage["steps"][STEP]["nodes"] == 2, usage
    assert set(outcome["usage"]["dedup_report"]["steps"]) == {
        f"dedup_report:{s}"
        for s in (
            "sketch_chunk",
            "exact_groups",
            "lsh_inputs",
            "bucket_pairs",
            "verify_range",
            "cluster_part",
            "write_output",
        )
    }


def test_worker_killed_mid_task_is_retried(cluster, second_node, local_files, demo_source, tmp_path):
    killer = WhenTaskRuns(STEP, lambda pid: os.kill(pid, signal.SIGKILL))
    killer.start()
    try:
        outcome = driven(ray_run, demo_source, tmp_path, {"ray_address": cluster.address, "max_retries": 2})
    finally:
        killer.stop.set()
    assert killer.hit is not None, "no encode task was seen running"
    assert outcome["success"], outcome
    assert same_files(local_files, tmp_path) == []


LOSS_ATTEMPTS = 5  # the demo encode tasks are short: under load a loss may land between them
# fewer, slower encode tasks (a record per encode call) that the loss can land in; neither setting changes a byte
SLOW_ENCODE = {"ops": {"tokenized_bins": {"config": {"task_bytes": 512 << 10, "batch_records": 1}}}}


def test_lost_node_fails_naming_the_step_and_a_rerun_succeeds(cluster, second_node, local_files, demo_source, tmp_path):
    """Without retries left, a node lost mid-step fails the run with ComputeError naming the step; nothing half
    done is published, and a rerun on the remaining node writes the same files. The demo's encode tasks last well
    under a second: when the node goes down only after its task finished, the run rightly succeeds, so the loss
    is tried again on a fresh node (up to LOSS_ATTEMPTS times)."""
    node = second_node
    for attempt in range(LOSS_ATTEMPTS):
        root = tmp_path / f"attempt-{attempt}"
        if attempt:
            node = cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
        raylet = node.all_processes["raylet"][0].process.pid
        loser = WhenTaskRuns(STEP, lambda pid, n=node: cluster.remove_node(n, allow_graceful=False), parent=raylet)
        loser.start()
        try:
            outcome = driven(
                ray_run, demo_source, root, {"ray_address": cluster.address, "max_retries": 0}, False, SLOW_ENCODE
            )
        finally:
            loser.stop.set()
            loser.join(timeout=60)
        if loser.hit is not None and not outcome["success"]:
            break
        if loser.hit is None:  # the node is still up: leave it for the next attempt's fresh one to join
            cluster.remove_node(node, allow_graceful=False)
    else:
        pytest.fail(f"in {LOSS_ATTEMPTS} attempts the node never went down while an encode task ran on it")
    text = outcome["error"]
    assert "ComputeError" in text and f"step {STEP}" in text, text
    assert not (root / "tokenized_bins" / "train" / "dataset.json").exists()

    rerun = driven(ray_run, demo_source, root, {"ray_address": cluster.address})
    assert rerun["success"], rerun
    assert same_files(local_files, root) == []


def map_without_the_data_root(address: str, missing: str) -> str:
    """In the driver: a step's task sent with a data root no node has; the error it fails with."""
    RayEngine.connect(address)
    try:
        with activated(RayEngine(RayOptions(address=address), missing)):
            list(map_ordered(abs, [-1, -2, -3]))
    except ComputeError as e:
        return str(e)
    finally:
        RayEngine.disconnect()
    return "no error"


def test_node_without_the_data_root_is_named(cluster, tmp_path):
    missing = str(tmp_path / "not-mounted")
    message = driven(map_without_the_data_root, cluster.address, missing)
    assert re.search(rf"node .* cannot see the data root {re.escape(missing)}", message), message


def marked_task(task: tuple[str, int]) -> int:
    """The first task fails at once; every other one leaves a mark in the folder after a moment's work."""
    folder, i = task
    if i == 0:
        raise ValueError("the first task fails")
    time.sleep(0.3)
    Path(folder, str(i)).touch()
    return i


def map_failing_first(address: str, folder: str, tasks: int) -> tuple[str, int, int]:
    """In the driver: a step whose first task fails; its error, the tasks that ran anyway and the cluster's slots."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import this test module
    RayEngine.connect(address)
    try:
        engine = RayEngine(RayOptions(address=address), folder)
        with activated(engine):
            list(map_ordered(marked_task, [(folder, i) for i in range(tasks)]))
    except ValueError as e:
        time.sleep(5)  # what was queued or running when the step failed has finished by now
        return str(e), len(os.listdir(folder)), engine.workers()
    finally:
        RayEngine.disconnect()
    return "no error", 0, 0


def test_a_failed_step_leaves_at_most_a_window_of_tasks_to_finish(cluster, tmp_path):
    """Nothing is cancelled (a cancel crossing a finishing task's reply aborts Ray 2.60's driver): the step keeps
    twice the cluster's slots in flight, so that is all a failure leaves to finish, not the whole task list."""
    error, ran, slots = driven(map_failing_first, cluster.address, str(tmp_path), 40)
    assert error.rstrip().endswith("ValueError: the first task fails"), error
    assert 0 < ran <= 2 * slots, (ran, slots)


def square(x: int) -> int:
    return x * x


def test_local_engine_is_the_pool_and_records_its_steps():
    """No cluster: the default engine runs the same pool as before and records seconds, tasks and nodes per step."""
    from tokenmill.common.compute import LocalEngine

    engine = LocalEngine(workers=2, label="asset")
    with activated(engine) as usage:
        assert list(map_ordered(square, range(8))) == [x * x for x in range(8)]
        assert list(map_ordered(square, [3], workers=1)) == [9]
    assert usage.engine == "local" and usage.cpus == 2
    assert {k: (v["tasks"], v["nodes"]) for k, v in usage.steps.items()} == {"asset:square": (9, 1)}


def test_unreachable_cluster_fails_at_once_naming_the_address():
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(ComputeError, match=rf"compute.ray_address '{address}': nothing answers"):
        RayEngine.connect(address)
    assert time.monotonic() - start < 15
