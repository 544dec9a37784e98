"""Discovery: the source files to read, in sorted order, grouped into tasks of whole files."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

READERS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".txt": "txt", ".csv": "csv"}


@dataclass(frozen=True)
class SourceFile:
    rel: str
    """Path relative to the source (POSIX), as records name it."""
    path: str
    """Path to open."""
    size: int
    """Bytes on disk (compressed size for .gz); 0 when it cannot be read."""


@dataclass(frozen=True)
class Listing:
    files: list[SourceFile]
    """Files to read, sorted by relative path."""
    skipped: list[str]
    """Files not read: unknown extension, or a name that is not UTF-8 (shown with ascii())."""


def reader_kind(name: str) -> tuple[str | None, bool]:
    """(reader, gzipped) for a file name; reader None when the extension is not one we read."""
    lower = name.lower()
    gz = lower.endswith(".gz")
    if gz:
        lower = lower[:-3]
    return READERS.get(os.path.splitext(lower)[1]), gz


def _walk(source: Path, exclude: Path | None) -> list[tuple[str, str]]:
    """(relpath, path) of every file under `source`, sorted; hidden files and folders and `exclude` left out."""
    if source.is_file():
        return [(source.name, str(source))]
    items = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")
                       and (exclude is None or Path(dirpath, d).resolve() != exclude)]
        for fn in filenames:
            if not fn.startswith("."):
                full = os.path.join(dirpath, fn)
                items.append((Path(os.path.relpath(full, source)).as_posix(), full))
    return sorted(items)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def list_source(source: Path, exclude: Path | None = None) -> Listing:
    """The files of `source` (a file, or a folder searched recursively) to read and to skip. `exclude` is the
    data root when it lies inside the source: never ingest our own outputs."""
    files, skipped = [], []
    for rel, full in _walk(source, exclude):
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:  # a file name that is not UTF-8 cannot become a record path
            skipped.append(ascii(rel))
            continue
        if reader_kind(rel)[0]:
            files.append(SourceFile(rel, full, _size(full)))
        else:
            skipped.append(rel)
    return Listing(files, skipped)


def plan_tasks(files: list[SourceFile], task_bytes: int) -> list[list[SourceFile]]:
    """Groups sorted files into consecutive tasks of about `task_bytes` (at least one file each)."""
    tasks, cur, cur_bytes = [], [], 0
    for f in files:
        if cur and cur_bytes + f.size > task_bytes:
            tasks.append(cur)
            cur, cur_bytes = [], 0
        cur.append(f)
        cur_bytes += f.size
    if cur:
        tasks.append(cur)
    return tasks
