"""Reader of .warc/.wet (gzipped per record or not): HTML `response` records extracted to their main text
(html_text), WET `conversion` records taken as text; every other record is skipped and counted by reason.

Each record is located by its ordinal in the file (`index`, 0-based, over every WARC record read) and its byte
`offset` (of its gzip member in a .warc.gz), so `source` leads back to the exact record: seek there and read one.

FastWARC parses (benchmarks/bench_extract.py: 2.6-4x warcio's records/s; neither resyncs after a corrupt record).
Resync is ours: after a corrupt gzip member or a bad header the record is rejected at its offset and reading
resumes at the next record start (the next gzip member that decompresses to "WARC/", or the next "WARC/1." line).
A record whose Content-Length disagrees with its bytes (FastWARC trusts the length: too long, it swallows the records
after it; too short, it keeps a cut page and reads the rest as a bad next header) is rejected as
`warc_length_mismatch` and reading resumes where the record really ends: its gzip member's end, or in an uncompressed
file the first "WARC/1." line right after a CRLF CRLF (a page quoting a header mid-line is not one). A record is
given out once the next header is found where its length says: FastWARC found it, and one slice of the mapped file
agrees (the header's CRLF CRLF `length` + 4 bytes before it, or the gzip member before it sized for the record, from
its ISIZE), which catches a length that FastWARC's CR/LF slack lets land near a later record. Only when that fails,
FastWARC fails right after the record or the file ends inside it are the record's bytes read again to tell why.
A length too long by exactly the records it swallows is not caught: it reads as an honest record holding them.
A gzip of the whole file (its first member holds more than one record) is read as its decompressed stream, offsets
being offsets in that stream; its lengths are checked only when FastWARC fails, after it is decompressed into a
temporary file to resync in.

A response's payload is stored as the server sent it: its Transfer-Encoding (chunked) and Content-Encoding (gzip,
deflate, br) are undone here (decode_http_payload), not by FastWARC's auto_decode, whose errors end the iteration
(the record would read as corrupt) and which knows neither x-gzip nor raw deflate.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

from fastwarc.stream_io import BrotliReader, ChunkedReader, GzipReader
from fastwarc.warc import ArchiveIterator, WarcRecordType

from tokenmill.common.remote import is_url, open_object
from tokenmill.stages.raw.html_text import page_text
from tokenmill.stages.raw.records import Mapped
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, Rejected, Skipped, open_regular, snip

GZIP_MAGIC = b"\x1f\x8b\x08"
PLAIN_START = b"WARC/1."
TRAILER = b"\r\n\r\n"  # after each record's block
LINE_START = b"\n" + PLAIN_START  # resync after junk: any "WARC/1." line
# resync after a lying length: only a header right after the previous record's trailer counts
RECORD_START = TRAILER + PLAIN_START
NO_LENGTH = "no Content-Length that is a number (FastWARC reads an empty block)"
MAX_HEADER = 32 << 10  # FastWARC's max_header_len
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


class Misframed(NamedTuple):
    """A record whose Content-Length its bytes contradict (or that has none), and where the next record starts
    (None: nowhere)."""

    reason: str
    detail: str
    resume: int | None


def _member_end(raw, start: int, seen: Callable[[bytes], None] | None = None) -> int | None:
    """Where the gzip member starting at `start` ends, None when it is corrupt or cut short. Its output is
    produced SCAN_CHUNK bytes at a time, passed to `seen` and dropped: a bomb member is walked, never held."""
    raw.seek(start)
    d, fed, pending = zlib.decompressobj(31), 0, b""
    try:
        while not d.eof:
            if not pending:
                pending = raw.read(SCAN_CHUNK)
                if not pending:
                    return None
                fed += len(pending)
            out = d.decompress(pending, SCAN_CHUNK)
            if seen is not None:
                seen(out)
            pending = d.unconsumed_tail
    except zlib.error:
        return None
    return start + fed - len(d.unused_data)  # at the end of the member, unused_data is all the input left


def _framing(head: bytes) -> tuple[int, int | None] | None:
    """(header bytes with their CRLF CRLF, Content-Length: None when missing or not a number) of the record that
    `head` starts; None when its header does not end there."""
    cut = head.find(TRAILER)
    if cut <= 0:
        return None
    for line in head[:cut].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return cut + len(TRAILER), int(value)
    return cut + len(TRAILER), None


def _plain_end(raw, start: int) -> int | None:
    """Where the uncompressed record starting at `start` ends (header, Content-Length bytes, CRLF CRLF)."""
    raw.seek(start)
    frame = _framing(raw.read(SCAN_CHUNK))
    if frame is None or frame[1] is None:
        return None
    return start + frame[0] + frame[1] + len(TRAILER)


def _member_misframed(raw, start: int) -> Misframed | None:
    """How the record in the gzip member at `start` disagrees with its length (its block and trailer must end with
    the member), None when it does not or cannot be told (a corrupt member, a header cut by the member's end)."""
    frame, size, junk = None, 0, False

    def seen(out: bytes) -> None:
        nonlocal frame, size, junk
        if not size:  # the header is in the first output (up to SCAN_CHUNK bytes; FastWARC's cap is 32 KiB)
            frame = _framing(out)
        if frame is not None and frame[1] is not None:  # any bytes but CR and LF past the declared block
            junk = junk or bool(out[max(frame[0] + frame[1] - size, 0) :].strip(b"\r\n"))
        size += len(out)

    end = _member_end(raw, start, seen)
    if end is None or frame is None:
        return None
    if frame[1] is None:
        return Misframed("bad_warc_header", NO_LENGTH, _next_start(raw, end, True))
    if size >= frame[0] + frame[1] and not junk:
        return None
    detail = f"Content-Length {frame[1]}, but its gzip member holds {size - frame[0]} bytes after the header"
    return Misframed("warc_length_mismatch", detail, _next_start(raw, end, True))


def _plain_misframed(raw, start: int, at_end: bool) -> Misframed | None:
    """How the uncompressed record at `start` disagrees with its length, None when it does not or cannot be told:
    its trailer (or, as FastWARC allows, the next header after fewer CR/LF bytes) must follow the declared block, and
    no header may start inside the block. The record read last (`at_end`), with no header after it, lies when the
    file ends with a trailer, else the file was cut inside it."""
    raw.seek(start)
    frame = _framing(raw.read(SCAN_CHUNK))
    if frame is None:
        return None
    block = start + frame[0]
    resume = _next_start(raw, block + 1, False, RECORD_START)
    if frame[1] is None:
        return Misframed("bad_warc_header", NO_LENGTH, resume)
    end, size = block + frame[1], raw.seek(0, os.SEEK_END)
    raw.seek(end)
    after = raw.read(len(TRAILER) + len(PLAIN_START))
    rest = after.lstrip(b"\r\n")  # FastWARC skips CR and LF before the next header or the end of the file
    lands = after.startswith(TRAILER) or rest.startswith(PLAIN_START) or (not rest and end + len(after) == size)
    if lands and (resume is None or resume >= end):
        return None
    if resume is None:
        raw.seek(size - len(TRAILER))
        if at_end and raw.read() != TRAILER:
            return None
        there = size - len(TRAILER) - block
    else:
        there = resume - len(TRAILER) - block
    detail = f"Content-Length {frame[1]}, but the block ends after {there} bytes"
    return Misframed("warc_length_mismatch", detail, resume)


class _RangedView:
    """Slices of an object read from a second handle of it (ranged GETs), where a local file is mapped: the length
    checks read a few bytes before each record, and the handle FastWARC reads never moves."""

    def __init__(self, f):
        self._f = f

    def __getitem__(self, span: slice) -> bytes:
        self._f.seek(span.start)
        return self._f.read(span.stop - span.start)


def _view(raw, path: str, stack: contextlib.ExitStack) -> mmap.mmap | _RangedView | None:
    """What the length checks slice: the file mapped, or an object's second handle; None: lengths are not checked."""
    if is_url(path):
        return _RangedView(stack.enter_context(open_object(path)))
    return _mapped(raw, stack)


def _lands(view: mmap.mmap | _RangedView, gz: bool, length: int, at: int) -> bool:
    """Whether the record before the one at `at`, of declared block `length`, ends right there: the header's CRLF
    CRLF `length` + 4 bytes before `at` (uncompressed), or a gzip member ending at `at` (its ISIZE) that holds the
    block and a header. A length that FastWARC's CR/LF slack lets land near a later record fails both."""
    if gz:
        return 0 < int.from_bytes(view[at - 4 : at], "little") - length <= MAX_HEADER + len(TRAILER)
    header_end = at - length - 2 * len(TRAILER)
    return header_end >= 0 and view[header_end : header_end + len(TRAILER)] == TRAILER


def _mapped(f, stack: contextlib.ExitStack) -> mmap.mmap | None:
    """The file mapped for reading: a slice per record to check lengths, where a read call costs ten times that.
    None when it cannot be (empty, or a file system without mmap): lengths are then not checked."""
    try:
        return stack.enter_context(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    except (OSError, ValueError):
        return None


def _is_member_start(raw, at: int) -> bool:
    raw.seek(at)
    try:
        return zlib.decompressobj(31).decompress(raw.read(4096), 16).startswith(b"WARC/")
    except zlib.error:
        return False


def _next_start(raw, after: int, gz: bool, marker: bytes = LINE_START) -> int | None:
    """The first record start at or after `after`: a gzip member opening with "WARC/", or the "WARC/1." that ends
    `marker` (any such line, or only one right after a record's trailer)."""
    marker = GZIP_MAGIC if gz else marker
    lead = 0 if gz else len(marker) - len(PLAIN_START)
    pos = max(after - lead, 0)
    while True:
        raw.seek(pos)
        chunk = raw.read(SCAN_CHUNK + len(marker))
        if len(chunk) < len(marker):
            return None
        i = chunk.find(marker)
        while i != -1:
            at = pos + i + lead
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
        if rec.is_http:  # parsed here, not by ArchiveIterator: read_warc needs the length it declares first
            rec.parse_http()
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
        return Mapped(text=text, meta=meta)
    http = rec.http_headers
    # one byte over html_max_bytes is enough for page_text to refuse the page as too large
    payload = decode_http_payload(
        payload, http.get("Transfer-Encoding"), http.get("Content-Encoding"), settings.html_max_bytes + 1
    )
    page = page_text(payload, rec.http_charset, settings)
    return Mapped(text=page.text, meta=meta | page.meta, shape=page.shape)


class _Inflated:
    """A gzip of the whole file as its decompressed stream, read forward only: FastWARC reads it as an uncompressed
    WARC, so record offsets are offsets in that stream (read natively, every record gets the same compressed one)."""

    def __init__(self, raw):
        raw.seek(0)
        self._gz = GzipReader(raw)

    def read(self, n: int = -1) -> bytes:
        return self._gz.read(n)

    def tell(self) -> int:
        return self._gz.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (self._gz.tell(), 0):
            raise io.UnsupportedOperation("a whole-file gzip is read forward only")
        return offset

    def close(self) -> None:
        self._gz.close()


def _holds_several_records(raw) -> bool:
    """Whether the gzip member opening the file holds a second record header (a gzip of the whole file), looked
    for in its first SCAN_CHUNK bytes of output; a first record longer than that reads as one member per record."""
    raw.seek(0)
    try:
        return RECORD_START in zlib.decompressobj(31).decompress(raw.read(SCAN_CHUNK), SCAN_CHUNK)
    except zlib.error:
        return False


def _spill(raw, stack: contextlib.ExitStack, limit: int):
    """A whole-file gzip decompressed into a temporary file to resync in (what decodes of it), None when it holds
    more than `limit` bytes."""
    out, src, n = stack.enter_context(tempfile.TemporaryFile()), _Inflated(raw), 0
    with contextlib.suppress(OSError):  # corrupt from there on: what came before
        while n <= limit and (chunk := src.read(SCAN_CHUNK)):
            n += out.write(chunk)
    out.flush()
    return out if n <= limit else None


def _too_large(index: int, settings: RawSettings, of: str, offset: int | None) -> Bad:
    detail = f"more than max_file_bytes ({settings.max_file_bytes}) {of}; the rest of the file was not read"
    return Bad(key="index", at=index, reason="file_too_large", detail=detail, snippet="", offset=offset)


def read_warc(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad | Skipped]:
    index, payload_bytes = 0, 0
    pos: int | None = 0  # where the next pass starts reading; None: nothing left to read
    with open_regular(path) as raw, contextlib.ExitStack() as stack:
        gz = raw.read(2) == GZIP_MAGIC[:2]  # by content, not by `compression`: a .warc may be gzipped
        whole = gz and _holds_several_records(raw)  # a gzip of the whole file: read as its decompressed stream
        stream = _Inflated(raw) if whole else raw
        gz = gz and not whole
        view = None if whole else _view(raw, path, stack)  # None: lengths not checked (until a whole gzip is spilled)
        while pos is not None:
            stream.seek(pos)
            inflated = isinstance(stream, _Inflated)
            # the last record read, given out once the next header is found where its length says
            held: Found | Bad | Skipped | None = None
            last, length, suspect, reading, cut_short, error = None, None, None, False, False, None
            try:
                for rec in ArchiveIterator(stream, parse_http=False):
                    at = rec.stream_pos
                    if held is not None:
                        if view is not None and length is not None and not _lands(view, gz, length, at):
                            suspect = at  # FastWARC found this header, but not where the length says
                            break
                        yield held
                        held = None
                    last, length, reading = at, rec.content_length, True  # the length as declared (HTTP not parsed)
                    payload_bytes += length
                    if payload_bytes > settings.max_file_bytes:
                        yield _too_large(index, settings, "of record payloads", last)
                        return
                    try:
                        got = _record(rec, settings)
                    except Rejected as e:
                        held = Bad(key="index", at=index, reason=e.reason, detail=e.detail, snippet="", offset=last)
                    else:
                        held = (
                            Skipped("index", index, got)
                            if isinstance(got, str)
                            else Found("index", index, got, {"offset": last})
                        )
                    if inflated:  # not checked at its end: note a block that the end of the file cuts
                        block = rec.reader
                        block.consume()  # the rest of the block, as FastWARC would before the next record
                        cut_short = block.tell() < rec.content_length
                    index, reading = index + 1, False
            except (OSError, ValueError) as e:  # a corrupt gzip member, a truncated record, a bad WARC header
                error = e
            at_end = error is None and suspect is None
            # at the end the last record is checked too (its length may run past the end of the file or land on
            # it), but not in a whole-file gzip unless cut: that would take decompressing all of it again
            if at_end and (held is None or inflated and not cut_short):
                if held is not None:
                    yield held
                return
            if inflated:
                spilled = _spill(raw, stack, settings.max_file_bytes)
                if spilled is None:
                    if held is not None:
                        yield held
                    yield _too_large(index, settings, "of decompressed bytes", None)
                    return
                stream, view = spilled, _mapped(spilled, stack)
            if held is not None and last is not None:
                bad = _member_misframed(stream, last) if gz else _plain_misframed(stream, last, at_end)
                if bad is not None:
                    stream.seek(last)
                    snippet = "" if gz else snip(stream.read(SNIPPET_BYTES))
                    yield Bad(
                        key="index", at=held.at, reason=bad.reason, detail=bad.detail, snippet=snippet, offset=last
                    )
                    pos = bad.resume
                    continue
                yield held
            if suspect is not None:  # the length was right after all (FastWARC's CR/LF slack): read on from there
                pos = suspect
                continue
            if error is None:
                return
            if not reading and isinstance(held, Bad) and last is not None and _record_end(stream, last, gz) is None:
                pos = _next_start(stream, last + 1, gz)  # the rejected record's own bytes, misread as the next
                continue
            reason = "bad_warc_header" if "header" in str(error).lower() else "corrupt_warc_record"
            bad_at = _failed_at(stream, pos, last, reading, gz)
            if bad_at is None:
                return
            stream.seek(bad_at)
            snippet = "" if gz else snip(stream.read(SNIPPET_BYTES))
            yield Bad(
                key="index",
                at=index,
                reason=reason,
                detail=f"{type(error).__name__}: {error}",
                snippet=snippet,
                offset=bad_at,
            )
            index += 1
            pos = _next_start(stream, bad_at + 1, gz)
