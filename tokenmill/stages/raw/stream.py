"""Opening source files (plain, gzip or zstd) with bounded reads, and what every reader yields: a value found, or a bad
one with a reason.

Hostile input must not hang the run or exhaust memory: a file is opened only when it is a regular file (a FIFO
would block), every read counts the decompressed bytes against `max_file_bytes` (a .gz or .zst bomb stops there), lines
are read at most `max_record_bytes` at a time (a longer one is skipped in chunks, never held whole), and JSON
nested deeper than MAX_JSON_DEPTH is refused before any stage recurses into it. Compressed data that cannot be
decoded (corrupt, truncated, not of its format) raises CorruptInput naming where it failed; what was read before
stays read.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tokenmill.common.io import zstd
from tokenmill.common.remote import is_url, open_object

SNIPPET_CHARS = 200
SKIP_CHUNK = 1 << 20  # bytes read at a time while skipping the rest of an oversized line
# bytes read at a time by content_lines: small enough that a corrupt stream loses little of what came before it
LINE_BLOCK = 1 << 16
_CONTENT = re.compile(rb"[^ \t\n\r\x0b\x0c]")  # a byte that is not ASCII whitespace: the line is not blank
# deeper JSON is malformed for us: every later stage parses and writes records recursively (Python's limit is
# 1000 frames, and a Dagster run already sits a few hundred deep), while real records nest a handful of levels
MAX_JSON_DEPTH = 100
TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels"


class Found(NamedTuple):
    """One input value (a JSON value, or a text for .txt) at `key` ("line" or "index") `at`. A named tuple: one
    per record, built ~5x faster than a frozen dataclass."""

    key: str
    at: int
    value: object
    where: dict | None = None
    """More of the record's `source` locator beside key/at (a WARC record's byte `offset`)."""


@dataclass(frozen=True, kw_only=True)
class Bad:
    """One bad line, record or file (`at` None: the whole file), with its reason."""

    key: str
    at: int | None
    reason: str
    detail: str
    snippet: str
    offset: int | None = None
    """Byte offset of a bad WARC record in its file (None for other formats)."""


class Skipped(NamedTuple):
    """An input unit that is not a document (a WARC request or metadata record, a non-HTML response): counted by
    reason, neither a record nor rejected."""

    key: str
    at: int
    reason: str


class Rejected(Exception):
    """A line, record or file that cannot become a record; `line` locates it when known."""

    def __init__(self, reason: str, detail: str, line: int | None = None):
        super().__init__(detail)
        self.reason, self.detail, self.line = reason, detail, line


class FileTooLarge(Exception):
    """More than `max_file_bytes` decompressed bytes were read from one file."""


class CorruptInput(OSError):
    """Compressed data that cannot be decoded, with the compressed and decompressed byte where it failed."""


# what a decompressor raises on bad data: truncated (EOFError), corrupt gzip (BadGzipFile, zlib.error), corrupt zstd
DECODE_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, zstd.ZstdError)


class Oversized(bytes):
    """The start of a line longer than the record limit (the rest was skipped unread into memory)."""


class SourceStream:
    """A source file's decompressed bytes, read in bounded pieces and counted against a per-file limit."""

    def __init__(self, f, max_file_bytes: int, max_record_bytes: int, raw=None):
        self._f, self.max_file_bytes, self.max_record_bytes = f, max_file_bytes, max_record_bytes
        self._raw = raw
        """The compressed file under `f` (None when `f` is plain): its position locates a decoding error."""
        self.bytes_read = 0
        self._failed: Exception | None = None  # bad compressed data met by content_lines, raised after the lines before

    def _corrupt(self, e: Exception) -> CorruptInput:
        return CorruptInput(
            f"{type(e).__name__}: {e} (near compressed byte {self._raw.tell()}, after {self.bytes_read} "
            "decompressed bytes); the rest of the file was not read"
        )

    def _count(self, data: bytes) -> bytes:
        self.bytes_read += len(data)
        if self.bytes_read > self.max_file_bytes:
            raise FileTooLarge(
                f"more than max_file_bytes ({self.max_file_bytes}) decompressed bytes; the rest "
                "of the file was not read"
            )
        return data

    def read(self, n: int) -> bytes:
        """Up to n bytes (fewer only at the end of the file)."""
        try:
            return self._count(self._f.read(min(n, self.max_file_bytes - self.bytes_read + 1)))
        except DECODE_ERRORS as e:
            raise self._corrupt(e) from e

    def read_record(self) -> bytes | Oversized:
        """The rest of the file as one record, or its start as Oversized when it exceeds `max_record_bytes`."""
        data = self.read(self.max_record_bytes + 1)
        return Oversized(data[:SNIPPET_CHARS]) if len(data) > self.max_record_bytes else data

    def lines(self) -> Iterator[bytes | Oversized]:
        """Each line with its line break; a line over `max_record_bytes` (break excluded) comes as Oversized."""
        try:
            yield from self._lines()
        except DECODE_ERRORS as e:
            raise self._corrupt(e) from e

    def content_lines(self) -> Iterator[tuple[int, bytes | Oversized]]:
        """(line number, line with its break) of each line holding a byte that is not ASCII whitespace; a line over
        `max_record_bytes` (break excluded) comes as Oversized. Blank lines cost what reading them costs: a run of
        them is counted at C speed, never a Python step per line (a file of nothing but newlines is read, not
        parsed)."""
        try:
            yield from self._content_lines()
        except DECODE_ERRORS as e:
            raise self._corrupt(e) from e

    def _block(self, size: int = LINE_BLOCK) -> tuple[bytes, bool]:
        """The next block of the file (at least LINE_BLOCK bytes but at its end), and whether the file ends with it
        (its end, or `max_file_bytes`). Past the limit or bad compressed data, the next call raises: the lines
        before stay read."""
        if self._failed is not None:
            raise self._failed
        self._count(b"")  # raises FileTooLarge once the limit was passed
        want = min(max(size, LINE_BLOCK), self.max_file_bytes - self.bytes_read + 1)
        parts, got = [], 0
        try:
            while got < want and (part := self._f.read1(want - got)):
                parts.append(part)
                got += len(part)
        except DECODE_ERRORS as e:
            if not parts:
                raise
            self._failed = e
        data = b"".join(parts)
        self.bytes_read += len(data)
        if self.bytes_read > self.max_file_bytes:
            return data[: len(data) - (self.bytes_read - self.max_file_bytes)], True
        return data, not data

    def _content_lines(self) -> Iterator[tuple[int, bytes | Oversized]]:
        limit = self.max_record_bytes
        snippet = min(SNIPPET_CHARS, limit + 1)  # as much of an oversized line as `lines` shows
        n, buf, pos, last = 1, b"", 0, False  # n: the number of the line starting at buf[pos]
        while True:
            found = _CONTENT.search(buf, pos)
            if found is None:  # the rest of the block is blank lines (and maybe the start of one more)
                n += buf.count(b"\n", pos)
                tail = buf.rfind(b"\n", pos) + 1 or pos
                if last:
                    self._count(b"")  # FileTooLarge when the file limit ended it
                    return
                block, last = self._block()
                buf, pos = buf[tail:] + block, 0
                continue
            start = buf.rfind(b"\n", pos, found.start()) + 1 or pos
            n += buf.count(b"\n", pos, start)
            end = buf.find(b"\n", found.start())
            if end < 0 and not last and len(buf) - start <= limit:  # the line goes on in the next block
                block, last = self._block(len(buf) - start)  # reads as long as the line so far: linear, not square
                buf, pos = buf[start:] + block, 0
                continue
            if end < 0 and not last:  # longer than the limit: skipped to its end, never held whole
                head = Oversized(buf[start : start + snippet])
                while True:
                    skip, last = self._block(SKIP_CHUNK)
                    if (i := skip.find(b"\n")) >= 0 or last:
                        break
                if i < 0:
                    self._count(b"")  # the file limit cut the line: FileTooLarge, not a line too large
                buf, pos = skip[i + 1 :] if i >= 0 else b"", 0
                yield n, head
                n += 1
                continue
            stop = len(buf) if end < 0 else end + 1
            line = buf[start:stop]
            if stop - start - (end >= 0) > limit:
                yield n, Oversized(line[:snippet])
            elif end >= 0 or not (last and self.bytes_read > self.max_file_bytes):  # not cut by the file limit
                yield n, line
            n, pos = n + 1, stop

    def _lines(self) -> Iterator[bytes | Oversized]:
        limit = self.max_record_bytes
        readline = self._f.readline
        while True:
            raw = self._count(readline(limit + 1))
            if not raw:
                return
            if len(raw) <= limit or (len(raw) == limit + 1 and raw.endswith(b"\n")):
                yield raw
                continue
            head = Oversized(raw[:SNIPPET_CHARS])
            del raw
            while True:  # skip to the end of the line without holding it
                chunk = self._count(readline(SKIP_CHUNK))
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield head


def file_type(mode: int) -> str | None:
    """What a stat mode is when it is not a regular file (None for a regular file)."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


@contextlib.contextmanager
def open_regular(path: str) -> Iterator:
    """The file opened for binary reading, non-blocking and checked again after opening, so a file swapped for a
    FIFO after discovery fails (OSError) instead of blocking the run. A URL: the object, buffered and seekable over
    ranged reads (remote.open_object), never copied whole to disk."""
    if is_url(path):
        with open_object(path) as remote_file:
            yield remote_file
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as raw:
        kind = file_type(os.fstat(fd).st_mode)
        if kind is not None:
            raise OSError(f"{path} is {kind}, not a regular file")
        yield raw


@contextlib.contextmanager
def open_source(
    path: str, compression: str | None, max_file_bytes: int, max_record_bytes: int
) -> Iterator[SourceStream]:
    """The file as a bounded stream, decompressed when `compression` is "gz" or "zst" (discover.reader_kind). A
    .zst file may hold several frames (Dolma, RedPajama); a frame needing a window over 128 MiB (zstd's default
    limit) is refused as corrupt rather than allocated."""
    with open_regular(path) as raw:
        if compression is None:
            yield SourceStream(raw, max_file_bytes, max_record_bytes)
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gz" else zstd.ZstdFile(raw, mode="rb") as f:
            yield SourceStream(f, max_file_bytes, max_record_bytes, raw)


def too_deep(value, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when a parsed JSON value nests containers deeper than `limit`: a walk level by level over the
    containers only (no recursion of ours), each level one C-speed comprehension."""
    level, depth = ([value] if isinstance(value, (dict, list)) else []), 1
    while level:
        if depth > limit:
            return True
        level = [c for v in level for c in (v.values() if type(v) is dict else v) if isinstance(c, (dict, list))]
        depth += 1
    return False


# every byte but the quote and the brackets, deleted by bytes.translate when measuring nesting depth
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_STEP = np.zeros(256, np.int8)  # +1 opens a container, -1 closes one
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1


def nesting_depth(data: bytes) -> int:
    """How deeply the containers of a valid JSON document nest (0: a scalar), as too_deep counts them, from its
    bytes at C speed: escapes dropped (so no quote is escaped), everything but quotes and brackets dropped,
    brackets inside strings (after an odd number of quotes) ignored, then the deepest running balance."""
    if b"\\" in data:  # escaped backslashes first: then every \" left is an escaped quote
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = np.frombuffer(data.translate(None, _NOT_STRUCTURE), np.uint8)
    outside = (np.cumsum(skeleton == ord('"'), dtype=np.int64) & 1) == 0
    return int(np.cumsum(_STEP[skeleton[outside]], dtype=np.int64).max(initial=0))


def snip(raw) -> str:
    """The start of a bad input as valid text, for the rejected entry."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return raw[:SNIPPET_CHARS].encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates -> "?"


def decode_whole(data: bytes) -> str:
    """A whole file's bytes as text (a leading BOM dropped), or Rejected naming the line of the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise Rejected("undecodable_bytes", f"not UTF-8 at byte {e.start} (line {line}): {e.reason}", line) from None
    return text[1:] if text.startswith("\ufeff") else text


def strip_bom(raw: bytes, n: int) -> bytes:
    """The line without the UTF-8 byte order mark when it is the file's first line."""
    return raw[3:] if n == 1 and raw.startswith(codecs.BOM_UTF8) else raw
