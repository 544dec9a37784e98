"""The tokenmill code location: one Definitions for `dagster dev`, `dagster ... -m definitions` and `dg`."""

import dagster as dg

from assets.clean import cleaned_jsonl
from assets.dedup import dedup_batch_assets, deduped_jsonl
from assets.exports import EXPORT_ASSETS
from assets.raw import raw_records
from assets.telemetry import funnel_telemetry
from assets.tokenize import tokenized_bins, tokenizer
from automation import daily_refresh, retire_source_batch_job, source_sensor, whole_graph_job
from resources import Compute, CorpusSource, DataRoot, compute_from_env, data_root_from_env, source_from_env

ASSETS = [raw_records, cleaned_jsonl, dedup_batch_assets, deduped_jsonl, tokenizer, tokenized_bins, funnel_telemetry]


def build_defs(source: CorpusSource, data_root: DataRoot, compute: Compute | None = None) -> dg.Definitions:
    """The code location for one source, data root and compute engine (tests build their own)."""
    return dg.Definitions(
        assets=[*ASSETS, *EXPORT_ASSETS],
        jobs=[whole_graph_job(str(data_root.path("")), source.path), retire_source_batch_job],
        schedules=[daily_refresh],
        sensors=[source_sensor(source.path)],
        resources={"source": source, "data_root": data_root, "compute": compute or Compute()},
        # one process per run, whatever launches it (job, UI "Materialize all", dg launch, schedule, sensor):
        # each stage fans out over its own workers, and the data root's lock is held by that one process
        executor=dg.in_process_executor,
    )


defs = build_defs(source_from_env(), data_root_from_env(), compute_from_env())
