"""The production instance (deploy/dagster.yaml) against the real PostgreSQL server: `tokenmill update`, a schedule
tick and a sensor tick recorded there (a new file becomes a batch and a run), and runs launched together on one data
root executed one after the other."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from support import write_batch_file

from automation import DATA_ROOT_TAG, WHOLE_GRAPH_JOB
from tokenmill.common.lock import read_holder

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PG_SERVER = os.environ.get("TOKENMILL_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
WAIT_SECONDS = 300


def connect(database: str):
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        conn = psycopg2.connect(f"{PG_SERVER}/{database}", connect_timeout=3)
    except psycopg2.OperationalError as e:
        pytest.skip(f"no PostgreSQL server at {PG_SERVER}: {e}")
    conn.autocommit = True
    return conn


@pytest.fixture
def production_env(tmp_path, demo_source, monkeypatch):
    source = tmp_path / "source"
    shutil.copytree(demo_source, source)
    """A fresh database, DAGSTER_HOME holding deploy/dagster.yaml, and the environment a deployment sets."""
    database = f"tokenmill_test_{uuid.uuid4().hex[:8]}"
    admin = connect("postgres")
    admin.cursor().execute(f"CREATE DATABASE {database}")
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    env = {
        "DAGSTER_HOME": str(home),
        "TOKENMILL_PG_URL": f"{PG_SERVER.replace('postgresql://', 'postgresql+psycopg2://')}/{database}",
        "TOKENMILL_SOURCE": str(source),
        "TOKENMILL_DATA": str(tmp_path / "data"),
        "TOKENMILL_SCHEDULE_CRON": "* * * * *",
        "TOKENMILL_WORKERS": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield {**os.environ, **env}
    admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    admin.close()


def dagster(*args, env):
    return subprocess.run(
        [str(BIN / "dagster"), *args, "-m", "definitions"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_update_schedule_and_sensor_on_postgres_one_run_per_data_root(production_env):
    env = production_env
    updated = subprocess.run([sys.executable, "-m", "cli", "update"], env=env, cwd=REPO, capture_output=True, text=True)
    assert updated.returncode == 0, updated.stderr[-3000:]
    write_batch_file(Path(env["TOKENMILL_SOURCE"]) / "added.jsonl", 20, seed=7)  # the next batch

    rerun_first_batch = ("job", "launch", "-j", WHOLE_GRAPH_JOB, "--tags", '{"dagster/partition": "g1-b000001"}')
    with daemon_running(env):
        for args in (
            ("schedule", "start", "tokenmill_daily"),
            ("sensor", "start", "source_files_sensor"),
            rerun_first_batch,
            rerun_first_batch,
        ):
            done = dagster(*args, env=env)
            assert done.returncode == 0, (args, done.stderr[-3000:])

        with dg.DagsterInstance.get() as instance:  # DAGSTER_HOME and TOKENMILL_PG_URL: the PostgreSQL instance
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            deadline = time.monotonic() + WAIT_SECONDS
            while time.monotonic() < deadline:
                ticks = {
                    kind: instance.get_ticks(origin_id, selector_id)
                    for kind, origin_id, selector_id in instigators(instance)
                }
                records = instance.get_run_records()
                finished = all(r.dagster_run.is_finished for r in records)
                batches = {r.dagster_run.tags.get("dagster/partition") for r in records}
                if finished and len(records) >= 4 and "g1-b000002" in batches and all(ticks.values()):
                    break
                time.sleep(3)
            else:
                pytest.fail(f"timed out: {len(records)} runs, ticks { {k: len(v) for k, v in ticks.items()} }")

            assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records), [
                (r.dagster_run.run_id, r.dagster_run.status) for r in records
            ]
            assert {r.dagster_run.tags.get(DATA_ROOT_TAG) for r in records} == {env["TOKENMILL_DATA"]}
            windows = sorted((r.start_time, r.end_time) for r in records)
            for (_, end), (next_start, _) in zip(windows, windows[1:]):
                assert next_start >= end, f"runs on one data root overlapped: {windows}"
            assert instance.get_dynamic_partitions("source_batch") == ["g1-b000001", "g1-b000002"]


@contextlib.contextmanager
def daemon_running(env: dict) -> Iterator[None]:
    """dagster-daemon over the definitions, in a session of its own; at the end stopped with SIGINT, then whatever is
    left in its session killed: the code server it started waits for its last run's process to be cleared in
    PostgreSQL, which the fixture stops next, so it would outlive the test."""
    daemon = subprocess.Popen(
        [str(BIN / "dagster-daemon"), "run", "-m", "definitions"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield
    finally:
        os.killpg(daemon.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()


def instigators(instance):
    """(kind, origin id, selector id) of the schedule and the sensor, from the states `start` stored."""
    states = instance.all_instigator_state()
    found = [
        (s.instigator_type.value, s.instigator_origin_id, s.selector_id)
        for s in states
        if s.instigator_name in ("tokenmill_daily", "source_files_sensor")
    ]
    assert len(found) == 2, states
    return found


def test_a_killed_update_never_wedges_the_queue(production_env):
    """kill -9 of `tokenmill update` mid-run leaves its run STARTED in PostgreSQL (no code server watches it), which
    would keep every queued run of its data root QUEUED; the daemon's run monitoring fails it (the data root's lock
    names its dead process) and the queued run starts within a minute of the daemon's start, and succeeds."""
    env = production_env
    update = subprocess.Popen(
        [sys.executable, "-m", "cli", "update"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    data_root = env["TOKENMILL_DATA"]
    deadline = time.monotonic() + WAIT_SECONDS
    while not read_holder(data_root).get("pid") == update.pid and update.poll() is None:
        assert time.monotonic() < deadline, "tokenmill update never took the data root's lock"
        time.sleep(0.1)
    killed_run = read_holder(data_root)["run_id"]
    update.kill()
    update.wait()

    queued = dagster("job", "launch", "-j", WHOLE_GRAPH_JOB, "--tags", '{"dagster/partition": "g1-b000001"}', env=env)
    assert queued.returncode == 0, queued.stderr[-3000:]
    with dg.DagsterInstance.get() as instance:  # the production instance: PostgreSQL, the run queue, one per root
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert instance.get_run_by_id(killed_run).status == dg.DagsterRunStatus.STARTED  # what wedged the queue
    with daemon_running(env):
        with dg.DagsterInstance.get() as instance:
            (waiting,) = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
            deadline = time.monotonic() + 60
            while instance.get_run_by_id(waiting.run_id).status == dg.DagsterRunStatus.QUEUED:
                assert time.monotonic() < deadline, "the queued run did not start within a minute"
                time.sleep(1)
            dead = instance.get_run_record_by_id(killed_run)
            assert dead.dagster_run.status == dg.DagsterRunStatus.FAILURE
            failure = instance.all_logs(killed_run, of_type=dg.DagsterEventType.RUN_FAILURE)
            assert f"its process {update.pid}" in failure[-1].message, failure[-1].message
            deadline = time.monotonic() + WAIT_SECONDS  # and it recovers what the killed run left
            while not (run := instance.get_run_by_id(waiting.run_id)).is_finished:
                assert time.monotonic() < deadline, f"the queued run did not finish: {run.status}"
                time.sleep(1)
            assert run.status == dg.DagsterRunStatus.SUCCESS
