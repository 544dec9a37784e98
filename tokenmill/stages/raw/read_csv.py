"""Reader of .csv (and .gz, .zst): the first row is the header, each later row a record keyed by it."""

from __future__ import annotations

import csv
from collections.abc import Iterator

from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, Oversized, open_source, snip, strip_bom


class _LineFeed:
    """Decoded lines for csv.reader, remembering which physical lines the current row used."""

    def __init__(self, lines: Iterator[bytes], max_record_bytes: int):
        self.lines, self.max_record_bytes = lines, max_record_bytes
        self.n = 0
        self.used: list[int] = []
        self.bad: list[Bad] = []

    def __iter__(self):
        return self

    def __next__(self) -> str:
        while True:
            raw = next(self.lines)
            self.n += 1
            if isinstance(raw, Oversized):
                self.bad.append(
                    Bad(
                        key="line",
                        at=self.n,
                        reason="record_too_large",
                        detail=f"line longer than max_record_bytes ({self.max_record_bytes}); skipped unread",
                        snippet=snip(raw),
                    )
                )
                continue
            raw = strip_bom(raw, self.n)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                self.bad.append(
                    Bad(
                        key="line",
                        at=self.n,
                        reason="undecodable_bytes",
                        detail=f"not UTF-8 at byte {e.start} of the line: {e.reason}",
                        snippet=snip(raw),
                    )
                )
                continue
            self.used.append(self.n)
            return line


def read_csv(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad]:
    # a quoted field spanning lines grows inside the csv module: bounded by the record limit too
    csv.field_size_limit(settings.max_record_bytes)
    with open_source(path, compression, settings.max_file_bytes, settings.max_record_bytes) as f:
        feed = _LineFeed(f.lines(), settings.max_record_bytes)
        reader = csv.reader(feed, delimiter=settings.csv_delimiter)
        header = None
        while True:
            feed.used = []
            before = feed.n
            try:
                row = next(reader)
                err = None
            except StopIteration:
                row, err = None, None
            except csv.Error as e:
                row, err = [], str(e)
            yield from feed.bad
            feed.bad = []
            if row is None:
                return
            at = feed.used[0] if feed.used else feed.n
            if err is not None:
                yield Bad(key="line", at=at, reason="malformed_csv_row", detail=err, snippet="")
                if feed.n == before:  # the reader consumed nothing: stop rather than loop
                    return
                continue
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            if header is None:
                header = row
                continue
            if len(row) != len(header):
                yield Bad(
                    key="line",
                    at=at,
                    reason="malformed_csv_row",
                    detail=f"{len(row)} fields, header has {len(header)}",
                    snippet=snip(settings.csv_delimiter.join(row)),
                )
                continue
            yield Found("line", at, dict(zip(header, row)))
