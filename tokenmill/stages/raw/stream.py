"""Opening source files (plain or gzip) and what every reader yields: a value found, or a bad one with a reason."""
from __future__ import annotations

import codecs
import gzip
from dataclasses import dataclass

SNIPPET_CHARS = 200


@dataclass(frozen=True)
class Found:
    """One input value (a JSON value, or a text for .txt) at `key` ("line" or "index") `at`."""

    key: str
    at: int
    value: object


@dataclass(frozen=True)
class Bad:
    """One bad line, record or file (`at` None: the whole file), with its reason."""

    key: str
    at: int | None
    reason: str
    detail: str
    snippet: str


class Rejected(Exception):
    """A line, record or file that cannot become a record; `line` locates it when known."""

    def __init__(self, reason: str, detail: str, line: int | None = None):
        super().__init__(detail)
        self.reason, self.detail, self.line = reason, detail, line


def open_source(path: str, gz: bool):
    """The file as a binary stream, decompressed when gzipped."""
    return gzip.open(path, "rb") if gz else open(path, "rb")


def snip(raw) -> str:
    """The start of a bad input as valid text, for the rejected entry."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return raw[:SNIPPET_CHARS].encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates -> "?"


def read_all(path: str, gz: bool) -> bytes:
    with open_source(path, gz) as f:
        return f.read()


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
