"""Record JSONL and atomic file helpers shared by every stage."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterable, Iterator

STATS_FILE = "_stats.json"
REJECTED_FILE = "_rejected.jsonl"
REMOVED_FILE = "removed.jsonl"


def dumps(obj) -> str:
    """One JSONL line; ensure_ascii=False keeps CJK readable and files small; sort_keys off to keep field order."""
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def iter_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Records of one JSONL file written by a tokenmill stage (trusted: a bad line is a bug, so it raises)."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not a JSON record ({e.msg})") from e


def record_shards(folder: str | os.PathLike) -> list[Path]:
    """The record shards of a stage folder in order (part-*.jsonl; rejected/removed files excluded)."""
    return sorted(Path(folder).glob("part-*.jsonl"))


def shard_name(index: int) -> str:
    return f"part-{index:05d}.jsonl"


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class JsonlWriter:
    """Writes lines to `path` through a temporary file renamed into place on close (never half a file)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp-{uuid.uuid4().hex[:8]}")
        self._f = open(self._tmp, "w", encoding="utf-8")
        self.count = 0

    def write(self, obj: dict) -> None:
        self._f.write(dumps(obj))
        self._f.write("\n")
        self.count += 1

    @property
    def buffer(self):
        """The binary stream, for lines that are already encoded JSON (the caller adds the newline)."""
        return self._f.buffer

    def close(self) -> None:
        self._f.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._f.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        self.abort() if exc_type else self.close()


def concat_files(parts: Iterable[str | os.PathLike], dest: str | os.PathLike, remove: bool = True) -> None:
    """Concatenates per-shard side files (rejected/removed) in order into one file, atomically."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
            if remove:
                os.unlink(part)
    os.replace(tmp, dest)


@contextlib.contextmanager
def staged_output(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Yields an empty staging folder next to `final_dir`; on success swaps it into place.

    A failed or interrupted stage leaves the previous output untouched (the staging folder is removed),
    so readers never see a mix of two runs.
    """
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:8]
    staging = final_dir.with_name(f".{final_dir.name}.staging-{token}")
    old = final_dir.with_name(f".{final_dir.name}.old-{token}")
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(staging, final_dir)
    shutil.rmtree(old, ignore_errors=True)


def record_id(path: str, line: int | None = None, index: int | None = None) -> str:
    """Stable record id: 16 hex chars of blake2b(relative source path, locator). Same input, same id."""
    import hashlib

    locator = f"line:{line}" if line is not None else f"index:{index}"
    return hashlib.blake2b(f"{path}\0{locator}".encode("utf-8"), digest_size=8).hexdigest()
