"""raw_records: read a file or folder of .jsonl/.json/.txt/.csv (and .gz, .zst of these), .parquet, and web inputs
(.warc/.wet and .html/.htm, plain or .gz) into record JSONL shards.

Every input record becomes `{"id", "text", "meta", "source": {"path", "line"|"index"}}` (docs/format.md).
Bad input never stops the run and is never dropped silently: each bad line, record or file goes to
`_rejected.jsonl` with a reason and is counted, so docs_in = docs_out + sum(rejected). WARC records that hold
no document (request, metadata, warcinfo, revisit, non-HTML or non-2xx responses) are not input records: they
are counted in skipped_records_by_reason, outside docs_in. A WARC record's source adds its byte `offset`.

Steps, one module each:
  discover     the source's files in sorted order (hidden ones and the data root left out), each checked with
               stat before anything opens it (FIFOs, sockets, devices and symlinks leaving the source are
               refused with a reason), grouped into tasks of whole files (bounded input bytes, fixed: the same
               layout for any worker count); a URL source's objects listed recursively (common/remote.py), each
               named by its URL in records
  stream       opening (plain, gzip or zstd; an object by ranged reads, transient errors retried) with bounded
               reads (max_record_bytes per record, max_file_bytes per file, JSON nesting depth) and what every
               reader yields: Found values or Bad input with a reason
  read_jsonl, read_json, read_txt, read_csv, read_parquet
               one reader per format (read_parquet: row groups in bounded batches of rows)
  read_warc, read_html
               web inputs: WARC/WET records (FastWARC; resync after a corrupt record), HTML files
  html_text    HTML payload -> main text and title (charset, the chosen extractor, size and tag caps)
  extract      tokenmill's own main-text extractor (lxml: blocks, furniture hints, the prose container)
  records      one input object -> text, meta and the sft/dpo/grpo fields (presets for common layouts)
  ingest       each task writes its own shards into a private folder; the parent renames them into one global
               sequence in task order, so the output is byte-identical for any worker count
"""

from tokenmill.stages.raw.ingest import REASONS, RawResult, ingest
from tokenmill.stages.raw.settings import RawSettings

# code_version of raw_records (Dagster shows what an older one built as stale): the date of the last change to the
# output's bytes (web readers, Parquet, zstd, refused files); bump it with such a change, not with a refactor.
VERSION = "2026-12-07.2"  # charset meta, bounded quarantine, bad_file_name, warc_length_mismatch

__all__ = ["REASONS", "VERSION", "RawResult", "RawSettings", "ingest"]
