"""raw_records' quarantine (`_rejected.jsonl`), bounded per source file: every rejection is counted (the stage's
`dropped`), but a file's entries may not outgrow the file. A 500-byte `.jsonl.zst` of two million `{}` lines would
otherwise write hundreds of MB of quarantine, and a file at the decompression cap hundreds of GB (docs/profile.md,
'Tiny hostile files').

Per file, each rejected line or record is written in full (path, line or index, reason, detail, snippet) while the
file's entries stay within its budget, max(BUDGET_FLOOR, BUDGET_PER_INPUT_BYTE x its size on disk), and always for
the first FULL_PER_REASON of each reason. Past that, consecutive rejections of one reason (no kept record and no
other reason between them) become one run entry: `line` (or `index`) .. `last_line` (`last_index`), `count`, the
first one's detail and snippet. Past twice the budget, the rest of each reason is one entry with `"scattered": true`:
its lines lie between `line` and `last_line`, mixed with records kept or rejected otherwise. So a file's entries stay
under 2 x budget + a few entries per reason, whatever the file holds, and `tokenmill explain PATH:LINE` still answers
for a line past the cap (from its run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from tokenmill.common.io import dumps

BUDGET_FLOOR = 256 * 1024  # bytes of entries every file may write in full, however small it is
BUDGET_PER_INPUT_BYTE = 1  # and per byte of the file as stored (compressed, for .gz and .zst)
FULL_PER_REASON = 10  # entries written in full for each reason of a file, past the budget too


@dataclass(kw_only=True)
class _Run:
    """Consecutive rejections of one reason, written as one entry when another record breaks the run."""

    entry: dict
    """The first rejection's entry."""
    last: int
    count: int = 1
    scattered: bool = False


class FileQuarantine:
    """The rejected entries of one source file, written to the task's `_rejected.jsonl` within the file's budget."""

    def __init__(self, out: IO[str], path: str, size: int):
        self.out, self.path = out, path
        self.budget = max(BUDGET_FLOOR, BUDGET_PER_INPUT_BYTE * size)
        self.written = 0
        self.full: dict[str, int] = {}
        self.run: _Run | None = None
        self.tails: dict[str, _Run] = {}  # reason -> its scattered rest, past twice the budget

    def _write(self, entry: dict) -> None:
        line = dumps(entry) + "\n"
        self.out.write(line)
        self.written += len(line)

    def reject(self, entry: dict, key: str, at: int | None) -> None:
        """One rejected line or record (`at` its line or index under `key`; None: the whole file)."""
        reason = entry["reason"]
        if at is None or self.written < self.budget or self.full.get(reason, 0) < FULL_PER_REASON:
            self.kept()
            self.full[reason] = self.full.get(reason, 0) + 1
            self._write(entry)
            return
        if self.run is not None and self.run.entry["reason"] == reason and self.run.entry.get(key) is not None:
            self.run.last, self.run.count = at, self.run.count + 1
            return
        self.kept()
        if self.written < 2 * self.budget:
            self.run = _Run(entry=entry, last=at)
        elif (tail := self.tails.get(reason)) is not None:
            tail.last, tail.count = at, tail.count + 1
        else:
            self.tails[reason] = _Run(entry=entry, last=at, scattered=True)

    def kept(self) -> None:
        """A record was kept (or the file ends): the open run, if any, is written."""
        if self.run is not None:
            self._write(run_entry(self.run))
            self.run = None

    def close(self) -> None:
        self.kept()
        for tail in self.tails.values():
            self._write(run_entry(tail))
        self.tails = {}


def run_entry(run: _Run) -> dict:
    key = "line" if "line" in run.entry else "index"
    entry = {**run.entry, f"last_{key}": run.last, "count": run.count}
    if run.scattered:
        entry["scattered"] = True
    return entry


def covers(entry: dict, key: str, at: int) -> bool:
    """Whether a run entry (one with `count`) holds the rejection at `key` (line or index) `at`."""
    first, last = entry.get(key), entry.get(f"last_{key}")
    return first is not None and last is not None and first <= at <= last
