"""Reader of .warc/.wet (gzipped per record or not): HTML `response` records extracted to their main text
(html_text), WET `conversion` records taken as text; every other record is skipped and counted by reason.

Each record is located by its ordinal in the file (`index`, 0-based, over every WARC record read) and its byte
`offset` (of its gzip member in a .warc.gz), so `source` leads back to the exact record: seek there and read one.

FastWARC parses (benchmarks/bench_extract.py: 2.6-4x warcio's records/s; neither resyncs after a corrupt record).
Resync is ours: after a corrupt gzip member or a bad header the record is rejected at its offset and reading
resumes at the next record start (the next gzip member that decompresses to "WARC/", or the next "WARC/1." line).

A response's payload is stored as the server sent it: its Transfer-Encoding (chunked) and Content-Encoding (gzip,
deflate, br) are undone here (decode_http_payload), not by FastWARC's auto_decode, whose errors end the iteration
(the record would read as corrupt) and which knows neither x-gzip nor raw deflate.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator

from fastwarc.stream_io import BrotliReader, ChunkedReader
from fastwarc.warc import ArchiveIterator, WarcRecordType

from tokenmill.stages.raw.html_text import page_text
from tokenmill.stages.raw.records import Mapped
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, Rejected, Skipped, open_regular, snip

GZIP_MAGIC = b"\x1f\x8b\x08"
PLAIN_START = b"WARC/1."
SCAN_CHUNK = 1 << 20
SNIPPET_BYTES = 200
HTML_TYPES = ("text/html", "application/xhtml+xml")
# record types that hold no document, by their int value (fastwarc's WarcRecordType is not hashable)
SKIPPED_TYPES = {
    int(WarcRecordType.request): "request_record",
    int(WarcRecordType.metadata): "metadata_record",
    int(WarcRecordType.warcinfo): "warcinfo_record",
    int(WarcRecordType.revisit): "revisit_record",
    int(WarcRecordType.resource): "resource_record",
}


def _member_end(raw, start: int) -> int | None:
    """Where the gzip member starting at `start` ends, None when it is corrupt or cut short. Its output is
    produced SCAN_CHUNK bytes at a time and dropped: a bomb member is walked, never held."""
    raw.seek(start)
    d, fed, pending = zlib.decompressobj(31), 0, b""
    try:
        while not d.eof:
            if not pending:
                pending = raw.read(SCAN_CHUNK)
                if not pending:
                    return None
                fed += len(pending)
            d.decompress(pending, SCAN_CHUNK)
            pending = d.unconsumed_tail
    except zlib.error:
        return None
    return start + fed - len(d.unused_data)  # at the end of the member, unused_data is all the input left


def _plain_end(raw, start: int) -> int | None:
    """Where the uncompressed record starting at `start` ends (header, Content-Length bytes, CRLF CRLF)."""
    raw.seek(start)
    head = raw.read(SCAN_CHUNK)
    cut = head.find(b"\r\n\r\n")
    for line in head[:cut].split(b"\r\n") if cut > 0 else ():
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return start + cut + 4 + int(value) + 4
    return None


def _is_member_start(raw, at: int) -> bool:
    raw.seek(at)
    try:
        return zlib.decompressobj(31).decompress(raw.read(4096), 16).startswith(b"WARC/")
    except zlib.error:
        return False


def _next_start(raw, after: int, gz: bool) -> int | None:
    """The first record start at or after `after`: a gzip member opening with "WARC/", or a "WARC/1." line."""
    marker = GZIP_MAGIC if gz else b"\n" + PLAIN_START
    pos = max(after - (0 if gz else 1), 0)
    while True:
        raw.seek(pos)
        chunk = raw.read(SCAN_CHUNK + len(marker))
        if len(chunk) < len(marker):
            return None
        i = chunk.find(marker)
        while i != -1:
            at = pos + i + (0 if gz else 1)
            if not gz or _is_member_start(raw, at):
                return at
            i = chunk.find(marker, i + 1)
        pos += SCAN_CHUNK


def _failed_at(raw, pos: int, last: int | None, reading: bool, gz: bool) -> int | None:
    """The offset of the record that failed: the one being read, else the one after the last good record (where
    it ends, or the next record start when its end cannot be told), else where this pass started."""
    if last is None or reading:
        return pos if last is None else last
    end = _record_end(raw, last, gz)
    return end if end is not None else _next_start(raw, last + 1, gz)


def _record_end(raw, start: int, gz: bool) -> int | None:
    return (_member_end if gz else _plain_end)(raw, start)


def _read_upto(reader, limit: int) -> bytes:
    """Up to `limit` bytes of a FastWARC reader (it may return less than asked before its end)."""
    parts, n = [], 0
    while n < limit:
        part = reader.read(min(SCAN_CHUNK, limit - n))
        if not part:
            break
        parts.append(part)
        n += len(part)
    return b"".join(parts)


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    """zlib/gzip/raw deflate data, at most `limit` bytes out; a stream cut short gives what it holds (crawlers
    truncate large responses, and browsers show the part that came)."""
    return zlib.decompressobj(wbits).decompress(data, limit)


def _undo_coding(coding: str, data: bytes, limit: int) -> bytes:
    if coding in ("identity", ""):
        return data
    if coding in ("gzip", "x-gzip"):
        return _inflate(data, 31, limit)
    if coding == "deflate":  # RFC 9110 says zlib-wrapped; servers also send raw deflate, which browsers accept
        try:
            return _inflate(data, 15, limit)
        except zlib.error:
            return _inflate(data, -15, limit)
    if coding == "br":
        return _read_upto(BrotliReader(io.BytesIO(data)), limit)
    raise Rejected("undecodable_bytes", f"unknown HTTP content coding {coding!r}")


def decode_http_payload(payload: bytes, transfer_encoding: str | None, content_encoding: str | None, limit: int):
    """The payload as the page's bytes: the chunked transfer coding removed (a payload already de-chunked, which
    some crawlers store while keeping the header, is taken as it is), then every other coding undone, the last
    applied first. At most `limit` bytes come out (decoding a bomb stops there); raises Rejected
    ('undecodable_bytes') naming the coding that is unknown or does not decode."""
    transfer = [c.strip().lower() for c in (transfer_encoding or "").split(",") if c.strip()]
    if "chunked" in transfer:
        try:
            payload = _read_upto(ChunkedReader(io.BytesIO(payload)), len(payload))
        except OSError:
            pass
    content = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    for coding in reversed(content + [c for c in transfer if c != "chunked"]):
        try:
            payload = _undo_coding(coding, payload, limit)
        except (zlib.error, OSError) as e:
            raise Rejected("undecodable_bytes", f"the payload's {coding} coding does not decode: {e}") from None
    return payload


def _decode_text(payload: bytes) -> str:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as e:  # WET conversions are UTF-8 by definition
        raise Rejected("undecodable_bytes", f"not UTF-8 at byte {e.start} of the payload: {e.reason}") from None


def _record(rec, settings: RawSettings) -> Mapped | str:
    """One WARC record as record fields, or the reason it is skipped; raises Rejected when it is bad."""
    kind = rec.record_type
    if int(kind) in SKIPPED_TYPES:
        return SKIPPED_TYPES[int(kind)]
    if kind not in (WarcRecordType.response, WarcRecordType.conversion):
        return "other_record"
    if kind == WarcRecordType.response:
        if rec.http_headers is None or rec.http_headers.status_code is None:
            raise Rejected("bad_warc_header", "the response's HTTP header cannot be parsed")
        if not 200 <= rec.http_headers.status_code < 300:
            return "http_status_not_ok"
        content_type = rec.http_headers.get("Content-Type") or ""
        if (rec.http_content_type or "").lower() not in HTML_TYPES:
            return "non_html_response"
    else:
        content_type = rec.headers.get("Content-Type") or ""
    if rec.content_length > settings.max_record_bytes:
        raise Rejected(
            "record_too_large",
            f"payload of {rec.content_length} bytes, more than max_record_bytes ({settings.max_record_bytes})",
        )
    payload = rec.reader.read()
    if len(payload) < rec.content_length:
        raise Rejected("corrupt_warc_record", f"payload cut short: {len(payload)} of {rec.content_length} bytes")
    headers = rec.headers
    meta = {"url": headers.get("WARC-Target-URI"), "date": headers.get("WARC-Date"), "content_type": content_type}
    if kind == WarcRecordType.conversion:
        text = _decode_text(payload)
        if not text.strip():
            raise Rejected("extraction_empty", "the conversion record holds no text")
        return Mapped(text, meta)
    http = rec.http_headers
    # one byte over html_max_bytes is enough for page_text to refuse the page as too large
    payload = decode_http_payload(
        payload, http.get("Transfer-Encoding"), http.get("Content-Encoding"), settings.html_max_bytes + 1
    )
    page = page_text(payload, rec.http_charset, settings)
    return Mapped(page.text, meta | page.meta, shape=page.shape)


def read_warc(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad | Skipped]:
    index, payload_bytes = 0, 0
    pos: int | None = 0  # where the next pass starts reading; None: nothing left to read
    with open_regular(path) as raw:
        gz = raw.read(2) == GZIP_MAGIC[:2]  # by content, not by `compression`: a .warc may be gzipped
        while pos is not None:
            raw.seek(pos)
            last, reading, last_rejected = None, False, False
            try:
                for rec in ArchiveIterator(raw, parse_http=True):
                    last, reading, last_rejected = rec.stream_pos, True, False
                    payload_bytes += rec.content_length
                    if payload_bytes > settings.max_file_bytes:
                        yield Bad(
                            "index",
                            index,
                            "file_too_large",
                            f"more than max_file_bytes ({settings.max_file_bytes}) of record payloads; the rest "
                            "of the file was not read",
                            "",
                            last,
                        )
                        return
                    try:
                        got = _record(rec, settings)
                    except Rejected as e:
                        last_rejected = True
                        yield Bad("index", index, e.reason, e.detail, "", last)
                    else:
                        if isinstance(got, str):
                            yield Skipped("index", index, got)
                        else:
                            yield Found("index", index, got, {"offset": last})
                    index, reading = index + 1, False
                return
            except (OSError, ValueError) as e:  # a corrupt gzip member, a truncated record, a bad WARC header
                if not reading and last_rejected and last is not None and _record_end(raw, last, gz) is None:
                    pos = _next_start(raw, last + 1, gz)  # the rejected record's own bytes, misread as the next
                    continue
                reason = "bad_warc_header" if "header" in str(e).lower() else "corrupt_warc_record"
                bad_at = _failed_at(raw, pos, last, reading, gz)
                if bad_at is None:
                    return
                raw.seek(bad_at)
                snippet = "" if gz else snip(raw.read(SNIPPET_BYTES))
                yield Bad("index", index, reason, f"{type(e).__name__}: {e}", snippet, bad_at)
                index += 1
                pos = _next_start(raw, bad_at + 1, gz)
