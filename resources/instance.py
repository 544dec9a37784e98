"""The instance `tokenmill update` opens, and the runs it left behind when it died.

A half-made instance: the embedded SQLite instance creates its tables the first time a command opens a new
DAGSTER_HOME, and a command killed meanwhile leaves some of them missing (the event log's index database
exists, so Dagster never creates the rest, and every later use of the source batches fails with "dynamic
partitions table ... run `dagster instance migrate`"). `open_instance` finds such an instance (a storage whose
tables, or whose schema version, are missing) and finishes it with `DagsterInstance.upgrade`, what `dagster
instance migrate` runs; where that fails it says so in one line naming the command.

Runs whose process died before the data root's lock named it: a run of `tokenmill update` runs in its process
(`execute_in_process`) and is tagged with that process (RUN_PROCESS_TAGS: pid, host, start time). Killed, it
stays STARTED for ever; the next `tokenmill update` (`fail_runs_of_gone_processes`) and run monitoring (the
launcher's health check, resources/run_launcher.py: `dagster dev` and the daemon, both instance templates turn
monitoring on) mark it failed, naming the process. A run of another host is never judged here: its own host's
daemon (run monitoring) judges it. The start time tells a reused pid from the run's process."""

from __future__ import annotations

import contextlib
import io
import socket
from collections.abc import Callable

import dagster as dg

from tokenmill.common.lock import holder_gone, this_process
from tokenmill.errors import TokenmillError

HOST_TAG = "tokenmill/host"
PID_TAG = "tokenmill/pid"
PROCESS_START_TAG = "tokenmill/process_start"  # /proc/<pid>/stat field 22: with the pid, one process
RUN_PROCESS_TAGS = (HOST_TAG, PID_TAG, PROCESS_START_TAG)
MIGRATE = "dagster instance migrate"
# the statuses of a run whose process may have died before it ended
UNFINISHED = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


class InstanceError(TokenmillError):
    """The instance in DAGSTER_HOME cannot be used and tokenmill cannot repair it (one line, naming the command)."""


def run_process_tags() -> dict[str, str]:
    """The tags naming this process, for a run it executes itself (none without /proc: nothing could judge them)."""
    me = this_process()
    if me["process_start"] is None:
        return {}
    return {HOST_TAG: me["host"], PID_TAG: str(me["pid"]), PROCESS_START_TAG: str(me["process_start"])}


def gone_process(run: dg.DagsterRun) -> str | None:
    """Why the run cannot be running, when its tags name a process of this host that has ended ("its process N
    on this host is gone"); None for a run without them, of another host, or whose process still runs."""
    tags = run.tags
    if not all(tag in tags for tag in RUN_PROCESS_TAGS) or not tags[PID_TAG].isdigit():
        return None
    process = {"host": tags[HOST_TAG], "pid": tags[PID_TAG], "process_start": tags[PROCESS_START_TAG]}
    if process["host"] != socket.gethostname() or not holder_gone(process):
        return None
    return (
        f"run {run.run_id}: its process {process['pid']} on this host ({process['host']}) is gone: it ended "
        "without finishing the run, killed (kill -9, the OOM killer) or crashed"
    )


def fail_runs_of_gone_processes(instance: dg.DagsterInstance, by: str, say: Callable[[str], None]) -> list[str]:
    """Marks failed every unfinished run whose process on this host is gone (`gone_process`); returns their ids."""
    failed = []
    runs = instance.get_runs(
        filters=dg.RunsFilter(statuses=UNFINISHED, tags={HOST_TAG: socket.gethostname()}), limit=1000
    )
    for run in runs:
        message = gone_process(run)
        if message is None:
            continue
        instance.report_run_failed(run, f"{message}; marked failed by {by}")
        say(f"marked run {run.run_id} failed: {message}")
        failed.append(run.run_id)
    return failed


def missing_tables(instance: dg.DagsterInstance) -> list[str]:
    """`<storage>: <table>` for each table a SQL storage of the instance lacks (none in a whole instance). The event
    log is asked with `has_table`: its index connection would create the missing tables, without the data
    migrations `upgrade` runs."""
    import sqlalchemy as sa
    from dagster._core.storage.event_log.schema import SqlEventLogStorageMetadata
    from dagster._core.storage.runs.schema import RunStorageSqlMetadata
    from dagster._core.storage.schedules.schema import ScheduleStorageSqlMetadata

    missing = []
    for name, storage, metadata in (
        ("run storage", instance.run_storage, RunStorageSqlMetadata),
        ("schedule storage", instance.schedule_storage, ScheduleStorageSqlMetadata),
    ):
        if callable(connect := getattr(storage, "connect", None)):
            with connect() as conn:
                present = set(sa.inspect(conn).get_table_names())
            missing += [f"{name}: {table}" for table in sorted({*metadata.tables, "alembic_version"} - present)]
    events = instance.event_log_storage
    if callable(has_table := getattr(events, "has_table", None)):
        tables = sorted({*SqlEventLogStorageMetadata.tables, "alembic_version"})
        missing += [f"event log storage: {table}" for table in tables if not has_table(table)]
    return missing


def open_instance(home: str, say: Callable[[str], None]) -> dg.DagsterInstance:
    """The instance of DAGSTER_HOME `home`, finished first when an earlier command died creating it; an
    InstanceError in one line when it cannot be opened or repaired."""
    try:
        instance = dg.DagsterInstance.get()
        missing = missing_tables(instance)
    except Exception as e:  # Dagster's own error is a page of traceback
        raise InstanceError(
            f"the Dagster instance in DAGSTER_HOME {home} cannot be opened ({_one_line(e)}): run `{MIGRATE}` with "
            f"DAGSTER_HOME={home}; if it cannot repair it either, restore the folder or point DAGSTER_HOME at a new one"
        ) from None
    if not missing:
        return instance
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            instance.upgrade()  # what `dagster instance migrate` runs; prints a line per storage and a progress bar
        still = missing_tables(instance)
    except Exception as e:
        still = [_one_line(e)]
    if still:
        raise InstanceError(
            f"the Dagster instance in DAGSTER_HOME {home} is incomplete ({', '.join(still[:3])}) and tokenmill "
            f"could not finish it: run `{MIGRATE}` with DAGSTER_HOME={home}"
        )
    say(
        f"finished the Dagster instance in DAGSTER_HOME {home}: an earlier command died creating it "
        f"({len(missing)} missing tables: {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}; "
        f"`{MIGRATE}`'s repair)"
    )
    return instance


def _one_line(error: BaseException) -> str:
    """The error's first line (SQLAlchemy's end with a link to its docs), at most 200 characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and "sqlalche.me" not in line]
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 200 else text[:199] + "…"


def unusable_instance(error: BaseException, home: str | None) -> str | None:
    """The one line for an error Dagster raises on an instance whose schema is behind (it names `dagster instance
    migrate`), else None."""
    if MIGRATE not in str(error) and "no such table" not in str(error):
        return None
    return (
        f"the Dagster instance in DAGSTER_HOME {home} lacks tables this Dagster needs ({_one_line(error)}): "
        f"run `{MIGRATE}` with DAGSTER_HOME={home}"
    )


__all__ = [
    "RUN_PROCESS_TAGS",
    "InstanceError",
    "fail_runs_of_gone_processes",
    "gone_process",
    "open_instance",
    "run_process_tags",
    "unusable_instance",
]
