"""Reader of .jsonl/.ndjson (and .gz, .zst): one JSON value per line, bad lines rejected with their line number."""

from __future__ import annotations

import json
from collections.abc import Iterator

from tokenmill.common.io import json_parser
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import (
    MAX_JSON_DEPTH,
    TOO_DEEP,
    Bad,
    Found,
    Oversized,
    open_source,
    snip,
    strip_bom,
    too_deep,
)


def parse_json_line(line: str, raw: bytes):
    """The JSON value of one line; raises JSONDecodeError, or RecursionError when it nests too deeply."""
    obj = json_parser(raw)(line)
    # a line with few brackets cannot nest deeply: only suspicious lines are walked
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and too_deep(obj):
        raise RecursionError
    return obj


def read_jsonl(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad]:
    with open_source(path, compression, settings.max_file_bytes, settings.max_record_bytes) as f:
        for n, raw in f.content_lines():
            if isinstance(raw, Oversized):
                yield Bad(
                    key="line",
                    at=n,
                    reason="record_too_large",
                    detail=f"line longer than max_record_bytes ({settings.max_record_bytes}); skipped unread",
                    snippet=snip(raw),
                )
                continue
            raw = strip_bom(raw, n).rstrip(b"\r\n")
            if not raw.strip():  # a first line of nothing but the BOM
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield Bad(
                    key="line",
                    at=n,
                    reason="undecodable_bytes",
                    detail=f"not UTF-8 at byte {e.start} of the line: {e.reason}",
                    snippet=snip(raw),
                )
                continue
            try:
                obj = parse_json_line(line, raw)
            except json.JSONDecodeError as e:
                yield Bad(
                    key="line", at=n, reason="malformed_json", detail=f"{e.msg} at column {e.colno}", snippet=snip(line)
                )
                continue
            except RecursionError:
                yield Bad(key="line", at=n, reason="malformed_json", detail=TOO_DEEP, snippet=snip(line))
                continue
            yield Found("line", n, obj)
