"""A full disk said in one line: which file or folder, the bytes needed when known, the bytes free. A stage checks
the room for what it can estimate before it writes (`require_room`), and any write that still runs out of room
(ENOSPC or EDQUOT, or numpy's short write that carries no errno) becomes a DiskFullError (`as_disk_full`)."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from tokenmill.errors import DiskFullError

_FULL = {errno.ENOSPC, errno.EDQUOT}
_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")  # numpy's tofile/save on a full disk


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes free to this user on the file system of `path` (its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _message(where: Path, needed: int | None) -> str:
    need = f"{needed:,} bytes needed, " if needed is not None else ""
    return (
        f"no space left on device writing {where}: {need}{free_bytes(where):,} free; any previous output stays "
        "published (free some space, or point TOKENMILL_DATA at a larger disk, and run again)"
    )


def require_room(where: str | os.PathLike, needed: int) -> None:
    """Raises DiskFullError before anything is written when the file system of `where` has fewer than `needed`
    bytes free."""
    if free_bytes(where) < needed:
        raise DiskFullError(_message(Path(where), needed))


def _causes(error: BaseException):
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]  # Ray's RayTaskError keeps it in .cause


def as_disk_full(error: BaseException, where: Path, staging: Path | None = None) -> DiskFullError | None:
    """The DiskFullError for `error` (or an error in its chain) when it is the disk running full, else None;
    `where` names the output when the error names no file, and stands for `staging` in a file name under it."""
    for e in _causes(error):
        if isinstance(e, DiskFullError):
            return e
        if isinstance(e, OSError) and e.errno in _FULL:
            named = Path(e.filename) if e.filename else where
            if staging is not None and named.is_relative_to(staging):
                named = where / named.relative_to(staging)
            return DiskFullError(_message(named, None))
        if isinstance(e, OSError) and (short := _SHORT_WRITE.search(str(e))):
            requested, written = int(short.group(1)), int(short.group(2))
            return DiskFullError(_message(where, requested - written))
    return None
