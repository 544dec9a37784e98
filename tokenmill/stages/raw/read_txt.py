"""Reader of .txt (and .gz, .zst): one record per blank-line-separated block, or per file (`txt_mode`)."""

from __future__ import annotations

import codecs
from collections.abc import Iterator

from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, Oversized, Rejected, decode_whole, open_source, snip

CHUNK = 1 << 20


def check_utf8(path: str, compression: str | None, settings: RawSettings) -> None:
    """Raises Rejected when the file is not UTF-8 (streaming, so big files are never held in memory)."""
    dec = codecs.getincrementaldecoder("utf-8")()
    consumed, lines = 0, 1
    with open_source(path, compression, settings.max_file_bytes, settings.max_record_bytes) as f:
        while True:
            chunk = f.read(CHUNK)
            try:
                dec.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                start = max(e.start, 0)
                line = lines + chunk.count(b"\n", 0, start)
                raise Rejected(
                    "undecodable_bytes", f"not UTF-8 near byte {consumed + start} (line {line}): {e.reason}", line
                ) from None
            if not chunk:
                return
            consumed += len(chunk)
            lines += chunk.count(b"\n")


def _too_large(settings: RawSettings, what: str) -> str:
    return f"{what} longer than max_record_bytes ({settings.max_record_bytes}); skipped unread"


def _read_whole(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad]:
    with open_source(path, compression, settings.max_file_bytes, settings.max_record_bytes) as f:
        data = f.read_record()
    if isinstance(data, Oversized):
        yield Bad(key="index", at=0, reason="record_too_large", detail=_too_large(settings, "file"), snippet=snip(data))
        return
    try:
        yield Found("index", 0, decode_whole(data))
    except Rejected as e:
        yield Bad(key="index", at=0, reason=e.reason, detail=e.detail, snippet=snip(data))


def _read_blocks(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad]:
    try:
        check_utf8(path, compression, settings)  # a .txt that is not UTF-8 is rejected whole, before any of its blocks
    except Rejected as e:
        yield Bad(key="line", at=e.line, reason=e.reason, detail=e.detail, snippet="")
        return
    # a block over the limit is dropped as it grows (`oversized` keeps its first line for the snippet) and
    # skipped up to its end
    block: list[str] = []
    start, size, previous = 0, 0, 0
    oversized: str | None = None

    def end_of_block() -> Iterator[Found | Bad]:
        nonlocal block, oversized
        if oversized is not None:
            yield Bad(
                key="line", at=start, reason="record_too_large", detail=_too_large(settings, "block"), snippet=oversized
            )
            oversized = None
        elif block:
            yield Found("line", start, "\n".join(block))
            block = []

    with open_source(path, compression, settings.max_file_bytes, settings.max_record_bytes) as f:
        for n, raw in f.content_lines():  # blank lines are not yielded: a gap in the numbers is one
            if n > previous + 1:
                yield from end_of_block()
            previous = n
            if isinstance(raw, Oversized):
                line = raw.decode("utf-8", errors="replace")
            else:
                line = raw.decode("utf-8")
                if n == 1 and line.startswith("\ufeff"):
                    line = line[1:]
                line = line.rstrip("\r\n")
            if not line.strip():  # blank but for Unicode spaces (or a lone BOM)
                yield from end_of_block()
                continue
            if not block and oversized is None:
                start, size = n, 0
            size += len(raw)
            if oversized is None and (isinstance(raw, Oversized) or size > settings.max_record_bytes):
                oversized, block = snip(block[0] if block else line), []
            if oversized is None:
                block.append(line)
    yield from end_of_block()


def read_txt(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad]:
    return (
        _read_whole(path, compression, settings)
        if settings.txt_mode == "file"
        else _read_blocks(path, compression, settings)
    )
