"""raw_records: one source batch read into normalized record JSONL shards (bad input rejected with a reason)."""

import os
import shutil

import dagster as dg

from assets.batches import SOURCE_BATCHES, batch_output, registered_batch
from assets.checks import RAW_RECORDS_NOT_EMPTY, raw_records_not_empty
from assets.metadata import compute_metadata, raw_records_metadata
from resources import Compute, CorpusSource, DataRoot
from tokenmill.batches import quarantine, retire_hint, source_file
from tokenmill.common.io import REJECTED_FILE, gather_batch_files, staged_output
from tokenmill.common.results import write_result
from tokenmill.errors import CheckFailedError, SourceError
from tokenmill.stages import raw
from tokenmill.stages.raw import RawSettings, ingest


class RawConfig(RawSettings, dg.Config):
    """How the source files are read into records (text field, layout presets, .txt mode, shard size)."""


@dg.asset(
    group_name="ingest",
    kinds={"python", "jsonl"},
    code_version=raw.VERSION,
    partitions_def=SOURCE_BATCHES,
    check_specs=[RAW_RECORDS_NOT_EMPTY],
)
def raw_records(
    context: dg.AssetExecutionContext, config: RawConfig, source: CorpusSource, data_root: DataRoot, compute: Compute
):
    """The records of one source batch (the files of TOKENMILL_SOURCE, a file or a folder of .jsonl/.json/.txt/.csv,
    .gz and .zst too, .parquet, and web inputs: .warc/.wet and .html, plain or .gz, whose HTML is reduced to its
    main text, that were new when the batch was registered) as `{"id", "text", "meta", "source"}` JSONL shards
    with stable ids. Malformed lines, records without text, undecodable bytes, unreadable files and the files the
    readers refuse (FIFOs, sockets, symlinks out of the source) go to `_rejected.jsonl` with path, line and reason
    (the stage folder's `_rejected.jsonl` gathers every batch's); WARC records that hold no document are counted by
    reason."""
    src = source.resolved()  # a missing source is a clear error before any work
    batch = registered_batch(context, data_root, source)
    folder = batch_output(data_root, "raw_records", batch.key)
    held = quarantine(data_root.path(""), batch.key)
    if missing := sorted(f for f in batch.files if not source_file(src, f).exists()):
        raise SourceError(
            f"files of source batch {batch.key} are gone from {src}: {', '.join(missing[:5])}"
            f"{f' and {len(missing) - 5} more' if len(missing) > 5 else ''}; restore them, or {retire_hint(batch.key)}"
        )
    with compute.activated(context, data_root) as usage, staged_output(folder) as out:
        result = ingest(
            src, out, config, log=context.log, exclude=data_root.path(""), only=batch.files, refused=batch.refused
        )
        check = raw_records_not_empty(out, config.max_rejected_share)
        if not check.passed:  # the rejected records stay readable: the staged folder goes with the failed step
            held.mkdir(parents=True, exist_ok=True)
            os.replace(out / REJECTED_FILE, held / REJECTED_FILE)
            write_result(held, result)
            yield check
            read = result.docs_in - result.refused_files
            refused = f" (and {result.refused_files:,} refused files)" if result.refused_files else ""
            raise CheckFailedError(
                f"raw_records: {read - result.docs_out:,} of the {read:,} records read from batch {batch.key} were "
                f"rejected{refused}, {result.docs_out:,} kept (bound raw_records.max_rejected_share "
                f"{config.max_rejected_share:g}); "
                f"each one and its reason is in {held / REJECTED_FILE}. Fix the files and {retire_hint(batch.key)}: "
                "the corrected files come in as a new batch; or raise the bound"
            )
    shutil.rmtree(held, ignore_errors=True)  # an earlier failed attempt's, superseded by the published batch
    gather_batch_files(data_root.path("raw_records"), REJECTED_FILE)
    yield dg.MaterializeResult(
        metadata={**raw_records_metadata(result, folder), **compute_metadata(usage)}, check_results=[check]
    )
