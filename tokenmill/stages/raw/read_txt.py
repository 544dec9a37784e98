"""Reader of .txt (and .gz): one record per blank-line-separated block, or per file (`txt_mode`)."""
from __future__ import annotations

import codecs
from collections.abc import Iterator

from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, Rejected, decode_whole, open_source, read_all, snip


def check_utf8(path: str, gz: bool) -> None:
    """Raises Rejected when the file is not UTF-8 (streaming, so big files are never held in memory)."""
    dec = codecs.getincrementaldecoder("utf-8")()
    consumed, lines = 0, 1
    with open_source(path, gz) as f:
        while True:
            chunk = f.read(1 << 20)
            try:
                dec.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                start = max(e.start, 0)
                line = lines + chunk.count(b"\n", 0, start)
                raise Rejected("undecodable_bytes", f"not UTF-8 near byte {consumed + start} (line {line}): {e.reason}",
                               line) from None
            if not chunk:
                return
            consumed += len(chunk)
            lines += chunk.count(b"\n")


def _read_whole(path: str, gz: bool) -> Iterator[Found | Bad]:
    data = read_all(path, gz)
    try:
        yield Found("index", 0, decode_whole(data))
    except Rejected as e:
        yield Bad("index", 0, e.reason, e.detail, snip(data))


def _read_blocks(path: str, gz: bool) -> Iterator[Found | Bad]:
    try:
        check_utf8(path, gz)  # a .txt that is not UTF-8 is rejected whole, before any of its blocks is emitted
    except Rejected as e:
        yield Bad("line", e.line, e.reason, e.detail, "")
        return
    block, start = [], 0
    with open_source(path, gz) as f:
        for n, raw in enumerate(f, 1):
            line = raw.decode("utf-8")
            if n == 1 and line.startswith("\ufeff"):
                line = line[1:]
            line = line.rstrip("\r\n")
            if line.strip():
                if not block:
                    start = n
                block.append(line)
            elif block:
                yield Found("line", start, "\n".join(block))
                block = []
    if block:
        yield Found("line", start, "\n".join(block))


def read_txt(path: str, gz: bool, settings: RawSettings) -> Iterator[Found | Bad]:
    return _read_whole(path, gz) if settings.txt_mode == "file" else _read_blocks(path, gz)
