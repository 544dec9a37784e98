"""The whole-graph job, and the schedule and sensor that register new source files as a batch and run it."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from assets.exports import EXPORTS_GROUP
from resources import CorpusSource, DataRoot
from tokenmill.batches import read_registry
from tokenmill.errors import SourceChangedError, SourceError
from tokenmill.update import register_batches

WHOLE_GRAPH_JOB = "tokenmill_all"
# Runs carry their data root, so the production instance's run queue admits one run per data root
# (deploy/dagster.yaml: tag_concurrency_limits with applyLimitPerUniqueValue).
DATA_ROOT_TAG = "tokenmill/data_root"
SOURCE_TAG = "tokenmill/source"
DAILY_CRON = os.environ.get("TOKENMILL_SCHEDULE_CRON", "0 3 * * *")


def whole_graph_job(data_root: str, source: str) -> dg.UnresolvedAssetJobDefinition:
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


def next_batch_request(
    source: CorpusSource, data_root: DataRoot, instance: dg.DagsterInstance
) -> dg.RunRequest | dg.SkipReason:
    """Registers the source's new ingestible files (if any) as a batch, then requests a run of the first batch
    not yet through the whole graph (one at a time: each batch is deduplicated against the ones before it).
    Changed or removed files are reported, never rebuilt silently."""
    path = Path(source.path).expanduser()
    if not path.exists():
        return dg.SkipReason(f"source {path} does not exist")
    root = data_root.path("")
    try:
        pending = register_batches(instance, root, path.resolve())  # as `tokenmill update` does
    except (SourceChangedError, SourceError) as e:
        return dg.SkipReason(str(e))
    if not pending:
        return dg.SkipReason(f"no new files among the files the readers ingest under {path}")
    return dg.RunRequest(
        run_key=pending[0],  # one run per batch
        partition_key=pending[0],
        tags={SOURCE_TAG: str(path), "tokenmill/batch_files": str(len(read_registry(root).batch(pending[0]).files))},
    )


@dg.schedule(
    name="tokenmill_daily",
    job_name=WHOLE_GRAPH_JOB,
    cron_schedule=DAILY_CRON,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=f"On cron '{DAILY_CRON}' (env TOKENMILL_SCHEDULE_CRON; default 03:00 daily): registers the source's "
    "new files as a batch and runs it through the graph; skips when nothing is new.",
)
def daily_refresh(context: dg.ScheduleEvaluationContext, source: CorpusSource, data_root: DataRoot):
    return next_batch_request(source, data_root, context.instance)


def source_sensor(source_path: str) -> dg.SensorDefinition:
    """Registers new files under `source_path` as a batch and requests its run (files the readers skip ignored)."""

    @dg.sensor(
        name="source_files_sensor",
        job_name=WHOLE_GRAPH_JOB,
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Watches {source_path}: new files the readers ingest (.jsonl, .json, .txt, .csv, .gz and "
        ".zst of these, .parquet) become a source batch, and one run processes only that batch. Other files (a "
        "README) are ignored; changed or removed files are reported and need `tokenmill update --rebuild`.",
    )
    def source_files_sensor(context: dg.SensorEvaluationContext, source: CorpusSource, data_root: DataRoot):
        return next_batch_request(source, data_root, context.instance)

    return source_files_sensor
