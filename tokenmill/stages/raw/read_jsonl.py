"""Reader of .jsonl/.ndjson (and .gz): one JSON value per line, bad lines rejected with their line number."""
from __future__ import annotations

import json
from collections.abc import Iterator

from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, open_source, snip, strip_bom


def read_jsonl(path: str, gz: bool, settings: RawSettings) -> Iterator[Found | Bad]:
    with open_source(path, gz) as f:
        for n, raw in enumerate(f, 1):
            raw = strip_bom(raw, n).rstrip(b"\r\n")
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield Bad("line", n, "undecodable_bytes", f"not UTF-8 at byte {e.start} of the line: {e.reason}",
                          snip(raw))
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield Bad("line", n, "malformed_json", f"{e.msg} at column {e.colno}", snip(line))
                continue
            except RecursionError:
                yield Bad("line", n, "malformed_json", "nested too deeply", snip(line))
                continue
            yield Found("line", n, obj)
