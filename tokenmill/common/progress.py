"""Throttled progress lines (done, rate, ETA) for long stages; the asset passes its Dagster logger."""

from __future__ import annotations

import logging
import time

# work shorter than this ends without a line: a small run's log stays short (each line is an event the Dagster instance
# stores, a SQLite write each: a one-file update's steps went largely to such lines; docs/profile.md, 'A one-file update
# of the demo corpus')
QUIET_SECONDS = 1.0


class Progress:
    """Call `advance(n)`; logs at most every `interval` seconds, and once at the end via `finish()` when the work
    took QUIET_SECONDS or more."""

    def __init__(
        self,
        what: str,
        total: int | None = None,
        unit: str = "records",
        log: logging.Logger | None = None,
        interval: float = 10.0,
    ):
        self.what, self.total, self.unit = what, total, unit
        self.log = log or logging.getLogger("tokenmill")
        self.interval = interval
        self.done = 0
        self.start = self._last = time.perf_counter()
        self._reported = False

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self._last >= self.interval:
            self._last = now
            self._reported = True
            self.log.info(self.line())

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.what}: {self.done:,} {self.unit}"
        if self.total:
            eta = (self.total - self.done) / rate if rate else float("inf")
            text += f" of {self.total:,} ({100 * self.done / self.total:.0f}%), ETA {eta:.0f} s"
        return text + f", {rate:,.0f} {self.unit}/s"

    def finish(self) -> None:
        if self._reported or time.perf_counter() - self.start >= QUIET_SECONDS:
            self.log.info(self.line() + " - done")
