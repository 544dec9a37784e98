"""The whole-graph job, its daily schedule and the sensor that watches the corpus source for changes."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import dagster as dg

from resources import CorpusSource

WHOLE_GRAPH_JOB = "tokenmill_all"
# Runs carry their data root, so the production instance's run queue admits one run per data root
# (deploy/dagster.yaml: tag_concurrency_limits with applyLimitPerUniqueValue).
DATA_ROOT_TAG = "tokenmill/data_root"
DAILY_CRON = os.environ.get("TOKENMILL_SCHEDULE_CRON", "0 3 * * *")


def whole_graph_job(data_root: str) -> dg.UnresolvedAssetJobDefinition:
    """Every asset in one run, tagged with the data root it writes."""
    # In-process: each stage already fans out over worker processes, so a process per step would only add
    # start-up time and SQLite contention on the embedded instance.
    return dg.define_asset_job(
        WHOLE_GRAPH_JOB,
        selection=dg.AssetSelection.all(),
        description="Materialize every tokenmill asset, raw records to funnel telemetry.",
        executor_def=dg.in_process_executor,
        tags={DATA_ROOT_TAG: data_root},
    )


daily_refresh = dg.ScheduleDefinition(
    name="tokenmill_daily",
    job_name=WHOLE_GRAPH_JOB,
    cron_schedule=DAILY_CRON,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=f"Rebuild the whole graph on cron '{DAILY_CRON}' (env TOKENMILL_SCHEDULE_CRON; default 03:00 daily).",
)


def source_state(source: Path) -> dict[str, list[int]]:
    """{relative path: [size, mtime_ns]} of every file under the source (the sensor's cursor)."""
    if source.is_file():
        st = source.stat()
        return {source.name: [st.st_size, st.st_mtime_ns]}
    state = {}
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = Path(root) / name
            st = path.stat()
            state[str(path.relative_to(source))] = [st.st_size, st.st_mtime_ns]
    return state


@dg.sensor(job_name=WHOLE_GRAPH_JOB, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Requests a run of the whole graph when files under TOKENMILL_SOURCE are added, changed or removed.")
def source_files_sensor(context: dg.SensorEvaluationContext, source: CorpusSource):
    path = Path(source.path).expanduser()
    if not path.exists():
        return dg.SkipReason(f"source {path} does not exist")
    state = source_state(path)
    cursor = json.dumps(state, sort_keys=True)
    if cursor == context.cursor:
        return dg.SkipReason(f"no change in {len(state)} source files")
    previous = json.loads(context.cursor) if context.cursor else {}
    changed = sorted(k for k in state if previous.get(k) != state[k])
    removed = sorted(set(previous) - set(state))
    context.update_cursor(cursor)
    return dg.RunRequest(
        run_key=hashlib.sha256(cursor.encode()).hexdigest()[:16],  # one run per distinct file set
        tags={"tokenmill/changed_files": str(len(changed)), "tokenmill/removed_files": str(len(removed))},
    )
