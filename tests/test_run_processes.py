"""Every run process ends with its run: a real `dagster dev`, runs launched through GraphQL (a failed step, a config
the launcher refuses: canceled before any process starts, tests/test_refused_runs.py; a run refused at set-up after
its worker pool started: its data root is a file; a success) and one by the sensor through the daemon. Within
10 s of each run's end neither its process nor its workers are left, and the code server's process tree does not
grow run after run (each leaked run kept ~340 MB). And a run that died holding its data root's lock is found and
marked failed (the queue on PostgreSQL: tests/test_production.py)."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import dagster as dg
import pytest

from devtools.dagster_server import LAUNCH_ASSETS_MUTATION, RUN_LOG_QUERY, DagsterDev, dev_with_source_batch
from resources import DataRoot
from tokenmill.common.lock import LOCK_FILE, DataRootLock, holder_gone

psutil = pytest.importorskip("psutil", reason="psutil (the test extra) reads the server's process tree")

EXIT_SECONDS = 10  # from a run's end to the end of its process and workers
RUN_SECONDS = 300
MEMORY_RUNS = 6  # runs over which the code server's tree may not grow (10 asked; 6 keep the test shorter)
GROWTH_LIMIT_MB = 100  # a leaked run process with its two workers holds ~340 MB
REFUSED_CONFIG = {"ops": {"cleaned_jsonl": {"config": {"bp_threshold": 1.5}}}}  # out of bounds: refused at launch
START_SENSOR = """
mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) { __typename ... on PythonError { message } }
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_source):
    with dev_with_source_batch(tmp_path_factory.mktemp("run_processes"), demo_source) as (dev, instance, batch):
        yield dev, instance, batch


def finished(dev: DagsterDev, run_id: str) -> str:
    """Waits for the run's end; returns its status."""
    from dagster_graphql import DagsterGraphQLClient

    client = DagsterGraphQLClient("127.0.0.1", port_number=dev.port)
    deadline = time.monotonic() + RUN_SECONDS
    while time.monotonic() < deadline:
        status = client.get_run_status(run_id).value
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(0.5)
    raise TimeoutError(f"run {run_id} not finished after {RUN_SECONDS} s; log: {dev.log_path}")


def run_processes(dev: DagsterDev, run_id: str) -> list:
    """The run's process (the pid its log names) and its children (the pool's workers), those still alive (none
    for a run the launcher refused: no process started)."""
    events = dev.graphql(RUN_LOG_QUERY, {"runId": run_id})["logsForRun"]["events"]
    pids = [
        int(m[1]) for e in events if (m := re.search(r"Started process for run \(pid: (\d+)\)", e["message"] or ""))
    ]
    assert len(pids) <= 1, f"run {run_id}: {pids}"
    if not pids:
        return []
    try:
        process = psutil.Process(pids[0])
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def assert_run_process_ends(dev: DagsterDev, run_id: str) -> None:
    left = run_processes(dev, run_id)
    _, alive = psutil.wait_procs(left, timeout=EXIT_SECONDS)
    zombies = [p for p in alive if p.status() == psutil.STATUS_ZOMBIE]  # exited; its parent reaps it on its next poll
    assert set(alive) == set(zombies), f"run {run_id}: {[(p.pid, p.cmdline()[-2:]) for p in alive]} still running"


def code_server_mb(dev: DagsterDev) -> float:
    """Resident memory of the code servers (`dagster api grpc`: they start the run processes) and all below them."""
    tree = psutil.Process(dev.proc.pid).children(recursive=True)
    servers = [p for p in tree if "grpc" in " ".join(p.cmdline())]
    processes = {p for s in servers for p in [s, *s.children(recursive=True)]}
    return sum(p.memory_info().rss for p in processes) / 2**20


def launch(
    dev: DagsterDev, batch: str | None, assets: list[str], run_config: dict | None = None, job: str = "__ASSET_JOB"
) -> str:
    """A materialization of `assets` (or all of `job`'s) for the batch (none: no partition), as the launchpad
    launches it."""
    selector = {"repositoryLocationName": "tokenmill", "repositoryName": "__repository__", "jobName": job}
    if assets:
        selector["assetSelection"] = [{"path": [k]} for k in assets]
    params = {
        "selector": selector,
        "runConfigData": run_config or {},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": batch}] if batch else []},
    }
    launched = dev.graphql(LAUNCH_ASSETS_MUTATION, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def test_every_run_process_ends_and_the_code_server_does_not_grow(server):
    dev, instance, batch = server
    # a data root that is a file: refused by the DataRoot at set-up (after the run's pool started), not at launch
    on_a_file = {"resources": {"data_root": {"config": {"root": str(dev.dagster_home / "dagster.yaml")}}}}
    memory = []
    checked = [
        ("a failed step", lambda: launch(dev, batch, ["cleaned_jsonl"]), "FAILURE"),  # raw_records not written yet
        ("a config refused at launch", lambda: launch(dev, batch, ["cleaned_jsonl"], REFUSED_CONFIG), "CANCELED"),
        ("a run refused at set-up", lambda: launch(dev, batch, ["raw_records"], on_a_file), "FAILURE"),
        ("a success", lambda: launch(dev, batch, ["raw_records"]), "SUCCESS"),
        ("the sensor's run", lambda: sensor_run(dev, instance), "SUCCESS"),
    ]
    refused = ("a run refused at set-up", lambda: launch(dev, batch, ["raw_records"], on_a_file), "FAILURE")
    for what, start, expected in checked + [refused] * (MEMORY_RUNS - len(checked)):
        run_id = start()
        assert finished(dev, run_id) == expected, f"{what}: run {run_id}; log {dev.log_path}"
        assert_run_process_ends(dev, run_id)
        memory.append(code_server_mb(dev))
    print("code server tree MB after each run:", [round(m) for m in memory])
    assert max(memory[2:]) - memory[1] < GROWTH_LIMIT_MB, memory  # after the first runs warmed the code server


def sensor_run(dev: DagsterDev, instance: dg.DagsterInstance) -> str:
    """Starts the source sensor; its first tick requests tokenmill_all for the registered batch (the daemon
    launches it). Returns that run's id."""
    selector = {"repositoryLocationName": "tokenmill", "repositoryName": "__repository__"}
    started = dev.graphql(START_SENSOR, {"selector": {**selector, "sensorName": "source_files_sensor"}})
    assert started["startSensor"]["__typename"] == "Sensor", started
    deadline = time.monotonic() + RUN_SECONDS
    while time.monotonic() < deadline:
        runs = instance.get_runs(dg.RunsFilter(tags={"dagster/sensor_name": "source_files_sensor"}))
        if runs:
            return runs[0].run_id
        time.sleep(1)
    raise TimeoutError(f"the sensor requested no run in {RUN_SECONDS} s; log: {dev.log_path}")


def test_the_lock_names_a_holder_killed_while_holding_it_to_the_next_run(tmp_path):
    """A release empties the lock file: a holder still named once the lock is free died holding it."""
    hold = "import sys, time; from tokenmill.common.lock import DataRootLock as L; L(sys.argv[1]).acquire('killed')"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"{hold}; print('held', flush=True); time.sleep(600)", str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait()
    lock = DataRootLock(tmp_path).acquire("next")
    assert (lock.dead_holder["run_id"], lock.dead_holder["pid"]) == ("killed", holder.pid)
    lock.release()
    assert DataRootLock(tmp_path).acquire("after").dead_holder == {}


def test_a_reused_pid_is_not_the_holder_and_another_host_is_never_judged(tmp_path):
    lock = DataRootLock(tmp_path).acquire("me")
    me = json.loads((tmp_path / LOCK_FILE).read_text())
    lock.release()
    assert me["pid"] == os.getpid() and not holder_gone(me)
    assert holder_gone({**me, "process_start": "1"})  # the pid's process started at another time: not the holder
    assert not holder_gone({**me, "process_start": "1", "host": f"not-{socket.gethostname()}"})


def test_the_run_taking_the_lock_fails_the_run_that_died_holding_it(tmp_path):
    """Without the daemon's run monitoring (the embedded instance, `dagster dev`), the next run on the data root
    marks the dead holder's run failed, so it no longer shows in progress."""

    @dg.asset
    def probe(data_root: DataRoot) -> None: ...

    with dg.instance_for_test() as instance:
        dead = instance.add_run(dg.DagsterRun(job_name="killed", status=dg.DagsterRunStatus.STARTED))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": "then"}
        (tmp_path / LOCK_FILE).write_text(json.dumps({**me, "run_id": dead.run_id, "process_start": "1"}))
        assert dg.materialize([probe], resources={"data_root": DataRoot(root=str(tmp_path))}, instance=instance).success
        assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
        (failure,) = instance.all_logs(dead.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert f"its process {os.getpid()} on {me['host']} ended while it held the data root" in failure.message
