"""Reader of .json (and .gz): one JSON document, an object (one record) or a list of them."""
from __future__ import annotations

import json
from collections.abc import Iterator

from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, Rejected, decode_whole, read_all, snip


def read_json(path: str, gz: bool, settings: RawSettings) -> Iterator[Found | Bad]:
    data = read_all(path, gz)
    try:
        text = decode_whole(data)
    except Rejected as e:
        yield Bad("line", e.line, e.reason, e.detail, snip(data))
        return
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        lines = text.splitlines()
        at = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else text
        yield Bad("line", e.lineno, "malformed_json", f"{e.msg} at line {e.lineno} column {e.colno}", snip(at))
        return
    except RecursionError:
        yield Bad("line", 1, "malformed_json", "nested too deeply", snip(text))
        return
    del data, text
    if isinstance(value, dict):
        yield Found("index", 0, value)
    elif isinstance(value, list):
        for i, obj in enumerate(value):
            yield Found("index", i, obj)
    else:
        yield Bad("index", 0, "not_an_object", f"top-level JSON is {type(value).__name__}, not an object or a list",
                  snip(json.dumps(value, ensure_ascii=False)))
