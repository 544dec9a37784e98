"""Bytes on disk of a data root and of its stages, each file counted once, and per byte of input.

A stage folder is a symlink to a hidden version folder, or a folder of per-batch symlinks beside their hidden
version folders; a file may also be hard-linked from two names (tokenized_bins' tokenizer copies). `tree_bytes`
counts what is really on disk: links are not followed inside a tree, and a (device, inode) counts once. The input
is what raw_records read of the source (its `bytes_read`: the files' bytes, compressed as they were), per batch.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tokenmill.common.io import STATS_FILE, batch_folders, read_json, record_shards
from tokenmill.stages.registry import stage_keys

STAGES = stage_keys()  # the stages of `tokenmill update`, in graph order


def tree_bytes(path: str | os.PathLike, seen: set[tuple[int, int]] | None = None) -> int:
    """Bytes of the regular files under `path` (resolved when it is a link; links inside not followed), each file
    once: pass one `seen` to several calls to count a file they share once (0 when `path` is not there)."""
    seen = set() if seen is None else seen
    root = os.path.realpath(path)
    if os.path.isfile(root):
        listing: list[tuple[str, list[str], list[str]]] = [(os.path.dirname(root), [], [os.path.basename(root)])]
    else:
        listing = list(os.walk(root))  # os.walk follows no link to a folder
    total = 0
    for folder, _, files in listing:
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:  # removed while walking (a temporary file)
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def records_bytes(folder: str | os.PathLike) -> int:
    """Bytes of a stage folder's record shards: what a stage that writes a copy of them needs at most."""
    return sum(p.stat().st_size for p in record_shards(folder))


def batch_input_bytes(data_root: str | os.PathLike, batch: str) -> int | None:
    """The source bytes raw_records read for `batch` (None when that batch has no raw_records stats)."""
    stats = Path(data_root) / "raw_records" / batch / STATS_FILE
    return int(read_json(stats).get("bytes_read", 0)) if stats.is_file() else None


def input_bytes(data_root: str | os.PathLike) -> int:
    """The source bytes raw_records read, over every published batch."""
    return sum(
        int(read_json(f / STATS_FILE).get("bytes_read", 0)) for f in batch_folders(Path(data_root) / "raw_records")
    )


def stage_bytes(data_root: str | os.PathLike) -> dict[str, int]:
    """{stage: bytes on disk} of the stages present (STAGES order), a file linked from two stages counted in the
    first."""
    seen: set[tuple[int, int]] = set()
    root = Path(data_root)
    return {s: tree_bytes(root / s, seen) for s in STAGES if (root / s).exists()}


def per_input(n: int, of: int) -> float:
    """Bytes per input byte, to 3 decimals (0.0 without input)."""
    return round(n / of, 3) if of else 0.0


def human(n: float) -> str:
    """1.5 MB: decimal units, one decimal from kB on."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
