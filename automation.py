"""The whole-graph job, its daily schedule and the sensor that watches the corpus source for changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg

from resources import CorpusSource, DataRoot
from tokenmill.stages.raw.discover import source_fingerprint, source_state

WHOLE_GRAPH_JOB = "tokenmill_all"
# Runs carry their data root, so the production instance's run queue admits one run per data root
# (deploy/dagster.yaml: tag_concurrency_limits with applyLimitPerUniqueValue).
DATA_ROOT_TAG = "tokenmill/data_root"
SOURCE_TAG = "tokenmill/source"
FINGERPRINT_TAG = "tokenmill/source_fingerprint"
DAILY_CRON = os.environ.get("TOKENMILL_SCHEDULE_CRON", "0 3 * * *")


def whole_graph_job(data_root: str, source: str) -> dg.UnresolvedAssetJobDefinition:
    """Every asset in one run, tagged with the data root it writes and the source it reads."""
    # In-process: each stage already fans out over worker processes, so a process per step would only add
    # start-up time and SQLite contention on the embedded instance.
    return dg.define_asset_job(
        WHOLE_GRAPH_JOB,
        selection=dg.AssetSelection.all(),
        description="Materialize every tokenmill asset, raw records to funnel telemetry.",
        executor_def=dg.in_process_executor,
        tags={DATA_ROOT_TAG: data_root, SOURCE_TAG: source},
    )


daily_refresh = dg.ScheduleDefinition(
    name="tokenmill_daily",
    job_name=WHOLE_GRAPH_JOB,
    cron_schedule=DAILY_CRON,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=f"Rebuild the whole graph on cron '{DAILY_CRON}' (env TOKENMILL_SCHEDULE_CRON; default 03:00 daily).",
)


def last_ingested_fingerprint(instance: dg.DagsterInstance) -> str | None:
    """The source fingerprint raw_records recorded at its latest materialization (None if never)."""
    event = instance.get_latest_materialization_event(dg.AssetKey("raw_records"))
    entry = event.asset_materialization.metadata.get("source_fingerprint") if event else None
    return entry.value if entry is not None else None


def source_sensor(source_path: str) -> dg.SensorDefinition:
    """Requests a run of the whole graph when the files the readers ingest under `source_path` change."""

    @dg.sensor(
        name="source_files_sensor",
        job_name=WHOLE_GRAPH_JOB,
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Requests a run of the whole graph when files the readers ingest (.jsonl, .json, .txt, "
        f".csv, .gz of these) under {source_path} are added, changed or removed; other files "
        f"(a README) are ignored.",
    )
    def source_files_sensor(context: dg.SensorEvaluationContext, source: CorpusSource, data_root: DataRoot):
        path = Path(source.path).expanduser()
        if not path.exists():
            return dg.SkipReason(f"source {path} does not exist")
        state = source_state(path, exclude=data_root.path(""))
        fingerprint = source_fingerprint(state)
        previous = json.loads(context.cursor) if context.cursor else None
        if previous is None and fingerprint == last_ingested_fingerprint(context.instance):
            context.update_cursor(json.dumps(state, sort_keys=True))  # switched on with nothing new since the last run
            return dg.SkipReason(f"{len(state)} source files unchanged since raw_records was last materialized")
        if previous == state:
            return dg.SkipReason(f"no change in {len(state)} source files")
        previous = previous or {}
        changed = sorted(k for k in state if previous.get(k) != state[k])
        removed = sorted(set(previous) - set(state))
        context.update_cursor(json.dumps(state, sort_keys=True))
        return dg.RunRequest(
            run_key=fingerprint,  # one run per distinct file set
            tags={
                "tokenmill/changed_files": str(len(changed)),
                "tokenmill/removed_files": str(len(removed)),
                SOURCE_TAG: str(path),
                FINGERPRINT_TAG: fingerprint,
            },
        )

    return source_files_sensor
