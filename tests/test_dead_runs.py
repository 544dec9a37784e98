"""Runs and instances that die early never wedge (issue 45 item 2): a `tokenmill update` killed after its run
STARTED and before it locked its data root is marked failed, naming its process, by the next update and by run
monitoring (`dagster dev`, the daemon); an instance whose creation was killed is finished by the next update, and
one tokenmill cannot open is one line naming `dagster instance migrate`."""

import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import dagster as dg
from dagster._daemon.monitoring.run_monitoring import monitor_started_run
from support import write_batch_file

from resources.instance import HOST_TAG, PID_TAG, PROCESS_START_TAG, gone_process, run_process_tags
from tokenmill.common.failpoints import ENV as FAILPOINT_ENV
from tokenmill.common.lock import read_holder

REPO = Path(__file__).resolve().parents[1]
# SIGKILLs the process when SQLite creates the event log index's third table: the instance half made, as a kill
# while a first command opens a new DAGSTER_HOME leaves it
KILL_WHILE_CREATING = """
import os, signal
import sqlalchemy as sa
import dagster as dg

@sa.event.listens_for(sa.Table, "after_create")
def killed(table, connection, **kw):
    if table.name == "asset_keys":
        os.kill(os.getpid(), signal.SIGKILL)

dg.DagsterInstance.get()
"""


def setup(tmp_path: Path) -> dict:
    """A tiny source, a data root and a new DAGSTER_HOME with the instance template; the update environment."""
    source, home = tmp_path / "source", tmp_path / "home"
    source.mkdir()
    home.mkdir()
    write_batch_file(source / "a.jsonl", 30, seed=1)
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "TOKENMILL_SOURCE": str(source),
        "TOKENMILL_DATA": str(tmp_path / "data"),
        "DAGSTER_HOME": str(home),
        "TOKENMILL_WORKERS": "1",
    }
    env.pop(FAILPOINT_ENV, None)
    return env


def update(env: dict, failpoint: str | None = None) -> subprocess.CompletedProcess:
    # its own session: a process-group kill must not reach pytest
    return subprocess.run(
        [sys.executable, "-m", "cli", "update"],
        cwd=REPO,
        env={**env, FAILPOINT_ENV: failpoint} if failpoint else env,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )


def killed_before_the_lock(env: dict) -> dg.DagsterRun:
    """Runs an update SIGKILLed (with its workers) once its run is STARTED, before it locks the data root; returns
    that run as the instance holds it."""
    killed = update(env, failpoint="data_root:lock@group")
    assert killed.returncode == -9, killed.stderr[-2000:]
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        (run,) = instance.get_runs()
    assert run.status == dg.DagsterRunStatus.STARTED  # Dagster alone keeps it so for ever
    assert read_holder(env["TOKENMILL_DATA"]) == {}  # no lock names it: only its tags tell it is dead
    return run


def failure_message(instance: dg.DagsterInstance, run_id: str) -> str:
    (failure,) = [
        e
        for e in instance.all_logs(run_id)
        if e.is_dagster_event and e.dagster_event_type == dg.DagsterEventType.RUN_FAILURE
    ]
    return failure.message


def test_the_next_update_fails_a_run_killed_before_it_locked_the_data_root(tmp_path):
    env = setup(tmp_path)
    stale = killed_before_the_lock(env)
    pid = stale.tags[PID_TAG]
    again = update(env)
    assert again.returncode == 0, again.stderr[-2000:]
    gone = f"its process {pid} on this host ({socket.gethostname()}) is gone"
    assert f"marked run {stale.run_id} failed: run {stale.run_id}: {gone}" in again.stderr
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert instance.get_run_by_id(stale.run_id).status == dg.DagsterRunStatus.FAILURE
        assert gone in failure_message(instance, stale.run_id)
        (new,) = [run for run in instance.get_runs() if run.run_id != stale.run_id]
        assert new.status == dg.DagsterRunStatus.SUCCESS


def test_run_monitoring_fails_a_run_killed_before_it_locked_the_data_root(tmp_path):
    """What `dagster dev`'s daemon does each poll interval with the instance template (monitoring on, the
    DataRootRunLauncher's health check)."""
    env = setup(tmp_path)
    stale = killed_before_the_lock(env)
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert instance.run_monitoring_enabled and instance.run_monitoring_poll_interval_seconds <= 30
        monitor_started_run(instance, None, instance.get_run_record_by_id(stale.run_id), logging.getLogger("test"))
        assert instance.get_run_by_id(stale.run_id).status == dg.DagsterRunStatus.FAILURE
        assert f"its process {stale.tags[PID_TAG]} on this host" in failure_message(instance, stale.run_id)


def test_a_live_process_a_reused_pid_and_another_host_are_not_judged_gone():
    me = run_process_tags()
    assert me[PID_TAG] == str(os.getpid())
    assert gone_process(dg.DagsterRun(job_name="j", run_id="live", tags=me)) is None
    reused = {**me, PROCESS_START_TAG: "1"}  # this pid, another process's start: the run's process is gone
    assert "is gone" in gone_process(dg.DagsterRun(job_name="j", run_id="reused", tags=reused))
    elsewhere = {**reused, HOST_TAG: "another-host"}  # left to that host's run monitoring
    assert gone_process(dg.DagsterRun(job_name="j", run_id="elsewhere", tags=elsewhere)) is None
    assert gone_process(dg.DagsterRun(job_name="j", run_id="untagged")) is None  # launched by a code server


def test_the_next_update_finishes_an_instance_killed_while_it_was_created(tmp_path):
    env = setup(tmp_path)
    killed = subprocess.run([sys.executable, "-c", KILL_WHILE_CREATING], cwd=REPO, env=env, capture_output=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (tmp_path / "home" / "history" / "runs" / "index.db").exists()  # half made: Dagster never finishes it
    done = update(env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"finished the Dagster instance in DAGSTER_HOME {env['DAGSTER_HOME']}" in done.stderr
    assert "missing tables: event log storage: alembic_version" in done.stderr
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert [run.status for run in instance.get_runs()] == [dg.DagsterRunStatus.SUCCESS]
        assert instance.get_dynamic_partitions("source_batch") == ["g1-b000001"]


def test_an_instance_tokenmill_cannot_open_is_one_line_naming_the_command(tmp_path):
    env = setup(tmp_path)
    index = tmp_path / "home" / "history" / "runs" / "index.db"
    index.parent.mkdir(parents=True)
    index.write_bytes(b"not a database\n" * 100)
    done = update(env)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("tokenmill update: the Dagster instance in DAGSTER_HOME")
    assert "`dagster instance migrate`" in line and "file is not a database" in line
