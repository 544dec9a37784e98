"""Reader of .parquet (the layout Hugging Face datasets and FineWeb ship: columns `text`, `id`, `url`, ...): each
row becomes an object keyed by column name, mapped like a JSON record (text_field, presets, meta), located by its
0-based row number (`source.index`).

Memory stays bounded by one batch of `parquet_batch_rows` rows: row groups are read one after another, a batch at
a time, and column chunks are read in PAGE_BUFFER_BYTES pieces instead of whole (a row group can be gigabytes).
Bad input is rejected, never raised: a file that is not Parquet (or whose footer is corrupt) as a whole, a file
whose rows cannot hold a text (no `text_field` column and no preset's column) as a whole with its row count, a row
group that fails to decode from the failing row to its end; the other row groups are still read.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenmill.stages.raw.records import BODY_KEYS
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, open_regular, snip

PAGE_BUFFER_BYTES = 1 << 20  # column chunks are streamed through a 1 MiB buffer, not read whole
READ_ERRORS = (pa.ArrowException, OSError)  # what pyarrow raises on a corrupt file, footer, page or value
# types whose values to_pylist gives as JSON values already; any other (timestamps, decimals, binary, maps, ...)
# goes through json_value
_JSON_TYPES = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_boolean,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_string_view,
    pa.types.is_null,
)
_TEXT_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def needs_json_value(t: pa.DataType) -> bool:
    """True when a column of this type holds values that are not JSON values as to_pylist gives them."""
    if pa.types.is_dictionary(t):
        return needs_json_value(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return needs_json_value(t.value_type)
    if pa.types.is_struct(t):
        return any(needs_json_value(t.field(i).type) for i in range(t.num_fields))
    return not any(test(t) for test in _JSON_TYPES)


def json_value(v):
    """A Parquet value as a JSON value, the same on every run: timestamps, dates and times in ISO 8601, durations
    in seconds, decimals as exact strings, bytes as text when UTF-8 (else {"base64": ...}), map entries as
    [key, value] pairs, anything else as its str."""
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, dict):  # a struct: its fields in schema order
        return {k: json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):  # a list, or a map's (key, value) entry
        return [json_value(x) for x in v]
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):  # pandas' Timestamp too (ns kept)
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(v).decode("ascii")}
    return str(v)


def may_have_text(columns: list[str], settings: RawSettings) -> bool:
    """Whether a row with these columns can map to a record (records.map_record): the text column, or a column
    one of the presets reads."""
    if settings.text_field in columns:
        return True
    return settings.presets and any(c in BODY_KEYS or c in ("messages", "prompt") for c in columns)


def _oversized(batch: pa.RecordBatch, settings: RawSettings) -> set[int]:
    """Rows of the batch whose text is longer than max_record_bytes (UTF-8 bytes), as batch positions."""
    if settings.text_field not in batch.schema.names:
        return set()
    text = batch.column(settings.text_field)
    if not any(test(text.type) for test in _TEXT_TYPES):
        return set()
    over = pc.greater(pc.binary_length(text), settings.max_record_bytes).fill_null(False)
    return set(np.flatnonzero(over.to_numpy(zero_copy_only=False)).tolist()) if pc.any(over).as_py() else set()


def _rows(batch: pa.RecordBatch, first: int, settings: RawSettings) -> Iterator[Found | Bad]:
    """The batch's rows as objects (columns as lists, then zipped: cheaper than a dict per row from Arrow)."""
    names = batch.schema.names
    columns = [
        [json_value(v) for v in col.to_pylist()] if needs_json_value(col.type) else col.to_pylist()
        for col in batch.columns
    ]
    oversized = _oversized(batch, settings)
    for i, values in enumerate(zip(*columns)):
        if i in oversized:
            text = values[names.index(settings.text_field)]
            detail = f"text longer than max_record_bytes ({settings.max_record_bytes}); row skipped"
            yield Bad(
                key="index",
                at=first + i,
                reason="record_too_large",
                detail=detail,
                snippet=snip(text) if isinstance(text, str) else "",
            )
        else:
            yield Found("index", first + i, dict(zip(names, values)))


def _read_row_groups(pf: pq.ParquetFile, settings: RawSettings) -> Iterator[Found | Bad]:
    total, first, decoded = pf.metadata.num_rows, 0, 0
    for group in range(pf.num_row_groups):
        end = first + pf.metadata.row_group(group).num_rows
        at = first
        try:
            for batch in pf.iter_batches(settings.parquet_batch_rows, row_groups=[group], use_threads=False):
                decoded += batch.nbytes
                if decoded > settings.max_file_bytes:
                    yield Bad(
                        key="index",
                        at=at,
                        reason="file_too_large",
                        detail=f"more than max_file_bytes ({settings.max_file_bytes}) decoded bytes; rows {at} to "
                        f"{total - 1} ({total - at} rows) were not read",
                        snippet="",
                    )
                    return
                yield from _rows(batch, at, settings)
                at += batch.num_rows
        except READ_ERRORS as e:
            yield Bad(
                key="index",
                at=at,
                reason="unreadable_file",
                detail=f"row group {group} cannot be read from row {at}: rows {at} to {end - 1} ({end - at} rows) "
                f"skipped, the other row groups read ({type(e).__name__}: {e})",
                snippet="",
            )
        first = end


def read_parquet(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad]:
    if compression is not None:  # Parquet needs seeking to its footer; a compressed stream has none
        yield Bad(
            key="index",
            at=None,
            reason="unreadable_file",
            detail=f"a .parquet.{compression} is not read: "
            "Parquet compresses its own pages, store the file uncompressed",
            snippet="",
        )
        return
    with open_regular(path) as raw:
        try:
            pf = pq.ParquetFile(raw, buffer_size=PAGE_BUFFER_BYTES)
        except READ_ERRORS as e:
            yield Bad(
                key="index",
                at=None,
                reason="unreadable_file",
                detail=f"not a Parquet file, or its footer is corrupt: {e}",
                snippet="",
            )
            return
        columns = pf.schema_arrow.names
        if not may_have_text(columns, settings):
            yield Bad(
                key="index",
                at=None,
                reason="no_text_field",
                detail=f"no '{settings.text_field}' column (columns: {', '.join(columns)}); its "
                f"{pf.metadata.num_rows} rows were not read (set text_field to the text column)",
                snippet="",
            )
            return
        yield from _read_row_groups(pf, settings)
