"""Reader of .json (and .gz, .zst): one JSON document, an object (one record) or a list of them. The document is
parsed whole, so it is bounded by `max_record_bytes` like one record (bigger collections belong in .jsonl)."""

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
    Rejected,
    decode_whole,
    nesting_depth,
    open_source,
    snip,
    too_deep,
)


def read_json(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad]:
    with open_source(path, compression, settings.max_file_bytes, settings.max_record_bytes) as f:
        data = f.read_record()
    if isinstance(data, Oversized):
        yield Bad(
            key="line",
            at=None,
            reason="record_too_large",
            detail=f"JSON document longer than max_record_bytes "
            f"({settings.max_record_bytes}): .json is parsed whole; write "
            "big collections as .jsonl",
            snippet=snip(data),
        )
        return
    try:
        text = decode_whole(data)
    except Rejected as e:
        yield Bad(key="line", at=e.line, reason=e.reason, detail=e.detail, snippet=snip(data))
        return
    try:
        value = json_parser(data)(text)
    except json.JSONDecodeError as e:
        lines = text.splitlines()
        at = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else text
        yield Bad(
            key="line",
            at=e.lineno,
            reason="malformed_json",
            detail=f"{e.msg} at line {e.lineno} column {e.colno}",
            snippet=snip(at),
        )
        return
    except RecursionError:
        yield Bad(key="line", at=1, reason="malformed_json", detail=TOO_DEEP, snippet=snip(text))
        return
    # records are walked one by one only when the whole document nests too deeply (+1: the top-level list)
    deep = nesting_depth(data) > MAX_JSON_DEPTH + 1
    del data, text
    if isinstance(value, dict):
        value = [value]  # one object: the record at index 0
    elif not isinstance(value, list):
        yield Bad(
            key="index",
            at=0,
            reason="not_an_object",
            detail=f"top-level JSON is {type(value).__name__}, not an object or a list",
            snippet=snip(json.dumps(value, ensure_ascii=False)),
        )
        return
    for i, obj in enumerate(value):
        if deep and too_deep(obj):
            yield Bad(key="index", at=i, reason="malformed_json", detail=TOO_DEEP, snippet="")
        else:
            yield Found("index", i, obj)
