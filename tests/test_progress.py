"""Progress lines: throttled while work runs, a closing line only for work long enough to be worth one."""

import logging

from tokenmill.common import progress as progress_module
from tokenmill.common.progress import Progress


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def logger() -> tuple[logging.Logger, Lines]:
    log = logging.getLogger("test_progress")
    log.setLevel(logging.INFO)
    lines = Lines()
    log.handlers = [lines]
    return log, lines


def test_quick_work_ends_silently_long_or_reported_work_says_done(monkeypatch):
    log, lines = logger()
    quick = Progress("quick", total=3, log=log)
    quick.advance(3)
    quick.finish()
    assert lines.lines == []  # each line would be one more event in the Dagster instance

    reported = Progress("reported", total=3, log=log, interval=0.0)
    reported.advance(2)
    reported.advance(1)
    reported.finish()
    assert len(lines.lines) == 3 and lines.lines[-1].startswith("reported: 3 records of 3 (100%)")
    assert lines.lines[-1].endswith(" - done")

    monkeypatch.setattr(progress_module, "QUIET_SECONDS", 0.0)  # as long as the threshold: the closing line
    slow = Progress("slow", log=log)
    slow.advance(5)
    slow.finish()
    assert lines.lines[-1].startswith("slow: 5 records") and lines.lines[-1].endswith(" - done")
