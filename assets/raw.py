"""raw_records: one source batch read into normalized record JSONL shards (bad input rejected with a reason)."""

import dagster as dg

from assets.batches import SOURCE_BATCHES, batch_output, registered_batch
from assets.checks import RAW_RECORDS_NOT_EMPTY, publish_only_if_passed, raw_records_not_empty
from assets.metadata import compute_metadata, raw_records_metadata
from resources import Compute, CorpusSource, DataRoot
from tokenmill.common.io import staged_output
from tokenmill.stages.raw import RawSettings, ingest


class RawConfig(RawSettings, dg.Config):
    """How the source files are read into records (text field, layout presets, .txt mode, shard size)."""


@dg.asset(
    group_name="ingest",
    kinds={"python", "jsonl"},
    code_version="1",
    partitions_def=SOURCE_BATCHES,
    check_specs=[RAW_RECORDS_NOT_EMPTY],
)
def raw_records(
    context: dg.AssetExecutionContext, config: RawConfig, source: CorpusSource, data_root: DataRoot, compute: Compute
):
    """The records of one source batch (the files of TOKENMILL_SOURCE, a file or a folder of .jsonl/.json/.txt/.csv,
    .gz and .zst too, and .parquet, that were new when the batch was registered) as `{"id", "text", "meta",
    "source"}` JSONL shards with stable ids. Malformed lines, records without text, undecodable bytes and
    unreadable files go to `_rejected.jsonl` with path, line and reason."""
    src = source.resolved()  # a missing source is a clear error before any work
    batch = registered_batch(context, data_root)
    folder = batch_output(data_root, "raw_records", batch.key)
    with compute.activated(context, data_root) as usage, staged_output(folder) as out:
        stats = ingest(src, out, config, log=context.log, exclude=data_root.path(""), only=batch.files)
        check = raw_records_not_empty(out)
        yield from publish_only_if_passed(check)
    yield dg.MaterializeResult(
        metadata={**raw_records_metadata(stats, folder), **compute_metadata(usage)}, check_results=[check]
    )
