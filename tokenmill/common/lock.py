"""One run at a time per data root: an exclusive ``flock`` on ``<data root>/.tokenmill.lock``.

The lock belongs to the open file, so the OS releases it when the holding process dies (OOM killer, SIGKILL):
a crashed run never leaves the data root locked. The file names the holder (run id, pid, host, start time) so a
refused run can say who holds it; a release empties it, so a holder named in a file whose lock is free died holding
it, and its run (which Dagster still shows STARTED) can be marked failed (`dead_holder`, `holder_gone`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from tokenmill.errors import DataRootBusyError

LOCK_FILE = ".tokenmill.lock"
POLL_SECONDS = 0.5


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


def read_holder(data_root: str | os.PathLike) -> dict:
    """What the data root's lock file names (run_id, pid, host, since, process_start); {} when no run holds it."""
    return _holder(Path(data_root) / LOCK_FILE)


def _process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22): with the pid it names one
    process, whatever process later reuses the pid. None when no such process runs (gone, or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def this_process() -> dict:
    """This process as a lock file (and a run's tags, resources/instance.py) name it: pid, host, process_start."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "process_start": _process_start(os.getpid())}


def holder_gone(holder: dict) -> bool:
    """Whether the process a lock file names has ended: only decidable on its own host with /proc (Linux); a holder
    on another host, or written before process_start was recorded, counts as alive."""
    if holder.get("host") != socket.gethostname() or "process_start" not in holder or not Path("/proc/self").exists():
        return False
    return _process_start(int(holder["pid"])) != holder["process_start"]


class DataRootLock:
    """Exclusive lock of one data root, held from :meth:`acquire` to :meth:`release` (or process death)."""

    def __init__(self, data_root: str | os.PathLike):
        self.path = Path(data_root) / LOCK_FILE
        self._fd: int | None = None
        self.dead_holder: dict = {}  # set by acquire: another run's holder that died holding the lock

    def acquire(self, run_id: str, wait_seconds: float = 0.0) -> DataRootLock:
        """Takes the lock for `run_id`. A holder from the same run (another step process of it) is always waited
        for; another run's is waited for up to `wait_seconds`, then refused with DataRootBusyError naming it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(self.path)
                if holder.get("run_id") != run_id and time.monotonic() >= deadline:
                    os.close(fd)
                    raise DataRootBusyError(
                        f"data root {self.path.parent} is in use by run {holder.get('run_id', '?')} "
                        f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
                        f"since {holder.get('since', '?')}); one run at a time per TOKENMILL_DATA: "
                        "wait for it, or set TOKENMILL_LOCK_WAIT=<seconds> to queue"
                    ) from None
                time.sleep(POLL_SECONDS)
        previous = _holder(self.path)
        self.dead_holder = previous if previous.get("run_id", run_id) != run_id and holder_gone(previous) else {}
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            json.dumps({"run_id": run_id, **this_process(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode(),
            0,
        )
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.release()
