"""cleaned_jsonl: repaired, normalized records with metadata extracted, boilerplate stripped, garbage rejected."""

import dagster as dg

from assets.batches import SOURCE_BATCHES, batch_output, registered_batch
from assets.checks import CLEANED_RECORDS_VALID, cleaned_records_valid, publish_only_if_passed
from assets.metadata import cleaned_jsonl_metadata, compute_metadata
from assets.raw import raw_records
from resources import Compute, DataRoot
from tokenmill.common.disk import records_bytes
from tokenmill.common.io import REJECTED_FILE, gather_batch_files, shards_version, staged_output
from tokenmill.stages import clean
from tokenmill.stages.clean import CleanSettings, clean_corpus


class CleanConfig(CleanSettings, dg.Config):
    """Which repairs run, how boilerplate is detected, and the limits of the garbage filters."""


@dg.asset(
    group_name="prepare",
    kinds={"python", "jsonl"},
    deps=[raw_records],
    code_version=clean.VERSION,
    partitions_def=SOURCE_BATCHES,
    check_specs=[CLEANED_RECORDS_VALID],
)
def cleaned_jsonl(context: dg.AssetExecutionContext, config: CleanConfig, data_root: DataRoot, compute: Compute):
    """One batch of raw_records cleaned: mojibake repaired, Unicode normalized, control characters and extra
    whitespace gone (runs of spaces inside lines too, unless the text is code-like or collapse_inner_spaces is
    off), title/author/dynasty header lines moved into meta, boilerplate lines stripped by a batch-wide
    detector (document frequency x positional consistency x template look x shortness, so frequent genuine lines
    stay), and empty, too short, garbled or repetitive records rejected to `_rejected.jsonl` with a reason (the
    stage folder's `_rejected.jsonl` gathers every batch's)."""
    key = registered_batch(context, data_root).key
    folder = batch_output(data_root, "cleaned_jsonl", key)
    raw = data_root.path("raw_records") / key
    with compute.activated(context, data_root) as usage, staged_output(folder, records_bytes(raw)) as out:
        result = clean_corpus(raw, out, config, log=context.log)
        check = cleaned_records_valid(out)
        yield from publish_only_if_passed(check)
    gather_batch_files(data_root.path("cleaned_jsonl"), REJECTED_FILE)
    yield dg.MaterializeResult(
        metadata={**cleaned_jsonl_metadata(result, folder), **compute_metadata(usage)},
        check_results=[check],
        data_version=dg.DataVersion(shards_version(folder)),  # another quality model's records: downstream stale
    )
