"""The whole-graph job, the schedule and sensor that run the source's new files as a batch, and the job that retires
a batch that failed."""

import os
from dataclasses import dataclass

import dagster as dg
from pydantic import Field

from assets.batches import retire
from assets.exports import EXPORTS_GROUP
from resources import CorpusSource, DataRoot
from tokenmill.batches import (
    DATA_ROOT_TAG,
    PARTITIONS_NAME,
    PLANNED_BATCH_TAG,
    SOURCE_TAG,
    WHOLE_GRAPH_JOB,
    pending_batches,
    read_registry,
    refusal,
    retire_hint,
)
from tokenmill.errors import TOKENMILL_ERRORS, CorruptOutputError, SourceChangedError, SourceError, failure_reason
from tokenmill.stages.raw.discover import source_state

RETIRE_JOB = "retire_source_batch"
PARTITION_TAG = "dagster/partition"
DAILY_CRON = os.environ.get("TOKENMILL_SCHEDULE_CRON", "0 3 * * *")
# A failed batch is requested again (a new run key: `<batch>:<attempt>`) up to this many attempts in all when the
# cause may pass by itself: another run held the data root, a worker or node was lost, an error tokenmill does not
# explain (a killed process); a cause the user must fix (a bad batch, a setting) waits for their decision.
MAX_ATTEMPTS = 3
PASSING_CAUSES = {"DataRootBusyError", "ComputeError"}
FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def whole_graph_job(data_root: str, source: str) -> "dg.UnresolvedAssetJobDefinition":
    """One source batch through every asset (the per-batch ones for that batch, then the dataset's version and
    the funnel), tagged with the data root it writes and the source it reads."""
    # In-process: each stage already fans out over worker processes, so a process per step would only add
    # start-up time and SQLite contention on the embedded instance.
    return dg.define_asset_job(
        WHOLE_GRAPH_JOB,
        selection=dg.AssetSelection.all() - dg.AssetSelection.groups(EXPORTS_GROUP),  # exports: when selected
        description="Materialize one source batch, raw records to funnel telemetry (exports excluded).",
        executor_def=dg.in_process_executor,
        tags={DATA_ROOT_TAG: data_root, SOURCE_TAG: source},
    )


@dataclass
class NextBatch:
    """What a tick asks for: a run of `key` (`planned`: not yet registered, the run registers it)."""

    key: str
    run_key: str
    planned: bool
    files: int


def next_batch(source: CorpusSource, data_root: DataRoot, instance: dg.DagsterInstance) -> NextBatch | str:
    """The batch a sensor or schedule tick should run next, or why none (one line naming what waits and why).

    Writes nothing (Dagster's "Preview tick result" evaluates this too): the first registered batch not yet
    through the whole graph, else the source's new files planned as the next batch from the registry and the
    source, which the run registers when it starts. One batch at a time, each deduplicated against the ones
    before it; a batch whose last run failed waits for the user unless the cause may pass (MAX_ATTEMPTS)."""
    path = source.location()
    root = data_root.path("")
    try:
        if not path.exists():
            return f"source {path} does not exist"
        registry = read_registry(root)
        changes = registry.compare(path.resolve(), source_state(path.resolve(), exclude=root))
        pending = pending_batches(root)
    except (SourceError, SourceChangedError, CorruptOutputError) as e:  # SourceError: a store that does not answer
        return str(e)
    waiting = f"; {changes.waiting()}" if changes.waiting() else ""
    if pending:
        key, planned, files = pending[0], False, len(registry.batch(pending[0]).files)
    elif changes.new:
        refused = {f: why for f in changes.new if (why := refusal(path.resolve(), f)) is not None}
        if len(refused) == len(changes.new):  # nothing to read: a run would only retire the batch it registers
            shown = ", ".join(f"{f} ({why[0]})" for f, why in sorted(refused.items())[:5])
            return (
                f"no new file to read under {path}: the readers refuse {len(refused)} ({shown}); "
                f"each comes in once it is a readable file{waiting}"
            )
        key, planned, files = registry.next_key, True, len(changes.new)
    else:
        return changes.waiting() or f"no new files among the files the readers ingest under {path}"
    runs = instance.get_runs(
        dg.RunsFilter(job_name=WHOLE_GRAPH_JOB, tags={PARTITION_TAG: key, DATA_ROOT_TAG: str(root)})
    )  # newest first
    attempt = 1 + sum(r.status != dg.DagsterRunStatus.SUCCESS for r in runs if r.status in FINISHED)
    if runs and runs[0].status not in FINISHED:
        return f"batch {key}: run {runs[0].run_id} is {runs[0].status.value.lower()}{waiting}"
    if runs and runs[0].status != dg.DagsterRunStatus.SUCCESS:
        reason, passing = _failure(instance, runs[0].run_id)
        if not (passing or planned) or attempt > MAX_ATTEMPTS:
            tries = f" (attempt {attempt - 1} of {MAX_ATTEMPTS})" if passing or planned else ""
            return (
                f"batch {key} failed in run {runs[0].run_id}{tries}: {reason}; later batches wait behind it: "
                f"re-execute that run once the cause is fixed, or {retire_hint(key)}{waiting}"
            )
    return NextBatch(key, f"{key}:{attempt}", planned, files)


def _failure(instance: dg.DagsterInstance, run_id: str) -> tuple[str, bool]:
    """The failed run's reason (its first failing step) and whether the cause may pass by itself."""
    failures = instance.all_logs(
        run_id, of_type={dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RESOURCE_INIT_FAILURE}
    )
    if not failures:  # the run process died, or the run was canceled
        return "the run ended without a step failure (killed or canceled)", True
    event = failures[0].dagster_event
    error = event.event_specific_data.error
    causes, cause = [], error
    while cause is not None:
        causes.append(cause.cls_name)
        cause = cause.cause
    explained = [c for c in causes if c in TOKENMILL_ERRORS]
    passing = not explained or explained[0] in PASSING_CAUSES
    return f"step {event.step_key or 'run setup'}: {failure_reason(error)}", passing


def request(source: CorpusSource, batch: NextBatch) -> dg.RunRequest:
    tags = {SOURCE_TAG: str(source.location()), "tokenmill/batch_files": str(batch.files)}
    if batch.planned:
        tags[PLANNED_BATCH_TAG] = batch.key
    return dg.RunRequest(run_key=batch.run_key, partition_key=batch.key, tags=tags)


@dg.schedule(
    name="tokenmill_daily",
    job_name=WHOLE_GRAPH_JOB,
    cron_schedule=DAILY_CRON,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=f"On cron '{DAILY_CRON}' (env TOKENMILL_SCHEDULE_CRON; default 03:00 daily): runs the first batch "
    "not yet through the graph, or the source's new files as a new batch; skips, saying why, when nothing is new "
    "or a failed batch waits for a decision.",
)
def daily_refresh(context: dg.ScheduleEvaluationContext, source: CorpusSource, data_root: DataRoot):
    batch = next_batch(source, data_root, context.instance)
    if isinstance(batch, str):
        return dg.SkipReason(batch)
    # a schedule cannot return partition requests: the partition is added here (the registry is still the run's)
    if batch.key not in context.instance.get_dynamic_partitions(PARTITIONS_NAME):
        context.instance.add_dynamic_partitions(PARTITIONS_NAME, [batch.key])
    return request(source, batch)


def source_sensor(source_path: str) -> dg.SensorDefinition:
    """Runs new files under `source_path` as a batch (files the readers skip ignored)."""

    @dg.sensor(
        name="source_files_sensor",
        job_name=WHOLE_GRAPH_JOB,
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Watches {source_path}: new files the readers ingest (.jsonl, .json, .txt, .csv, .parquet, "
        ".gz/.zst of these) become a source batch, registered when its run starts, and one run processes only that "
        "batch. Other files (a README) are ignored; a touched file (same content) changes nothing; a changed or "
        "removed one is reported in every tick and waits for `tokenmill update --rebuild` while new files go on. "
        f"A batch that failed waits for a re-execution or the {RETIRE_JOB} job.",
    )
    def source_files_sensor(context: dg.SensorEvaluationContext, source: CorpusSource, data_root: DataRoot):
        batch = next_batch(source, data_root, context.instance)
        if isinstance(batch, str):
            return dg.SkipReason(batch)
        known = context.instance.get_dynamic_partitions(PARTITIONS_NAME)
        return dg.SensorResult(
            run_requests=[request(source, batch)],
            dynamic_partitions_requests=[]
            if batch.key in known
            else [dg.AddDynamicPartitionsRequest(PARTITIONS_NAME, [batch.key])],
        )

    return source_files_sensor


class RetireConfig(dg.Config):
    batch: str = Field(
        description="The source batch to retire (g<generation>-b<number>), one whose run failed and that never "
        "published: its partial outputs are removed, later batches no longer count it, and its files come in "
        "again as a new batch once corrected"
    )


@dg.op(name="retire_batch")  # an op may not share its job's name
def retire_source_batch_op(context: dg.OpExecutionContext, config: RetireConfig, data_root: DataRoot) -> None:
    """Retires one source batch (the data_root resource holds the data root's lock for the run)."""
    context.log.info(retire(context.instance, data_root.path(""), config.batch, f"run {context.run_id}"))


@dg.job(
    name=RETIRE_JOB,
    executor_def=dg.in_process_executor,
    description="Retire a source batch whose run failed (more rejected records than raw_records.max_rejected_share, "
    "a file deleted after registration): launch it with `ops: retire_batch: config: batch: <key>`. "
    "Later batches then proceed; a corrected file comes in as a new batch, without a rebuild.",
)
def retire_source_batch_job():
    retire_source_batch_op()
