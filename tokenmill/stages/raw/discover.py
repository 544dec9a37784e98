"""Discovery: the source files to read, in sorted order, grouped into tasks of whole files."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tokenmill.common.remote import RETRIES, Location, RemoteLocation, RemoteObject, list_objects
from tokenmill.stages.raw.stream import file_type

READERS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".txt": "txt", ".csv": "csv", ".parquet": "parquet"}
# web inputs: .warc.gz, .wet.gz and .warc.wet.gz end like these once the compression suffix is taken off
READERS |= {".warc": "warc", ".wet": "warc", ".html": "html", ".htm": "html"}


@dataclass(frozen=True, kw_only=True)
class SourceFile:
    rel: str
    """Path relative to the source (POSIX), as records name it; an object's URL (scheme://bucket/key)."""
    path: str
    """Path or URL to open."""
    size: int
    """Bytes on disk or in the store (compressed size for .gz/.zst); 0 when it cannot be read or is refused."""
    refused: str | None = None
    """Why the file is not opened at all ("not_a_regular_file", "outside_source", "unreadable_file": a symlink to
    nothing), None when it is read."""
    detail: str = ""


@dataclass(frozen=True)
class Listing:
    files: list[SourceFile]
    """Files to read, sorted by relative path."""
    skipped: list[str]
    """Files not read: unknown extension (a name that is not UTF-8 shown as `shown_name` gives it)."""


NOT_UTF8_NAME = "the file name is not UTF-8 (its bad bytes shown as \\xNN): rename the file to read its records"
COMPRESSIONS = {".gz": "gz", ".zst": "zst"}  # a compressed file is read by the reader of the extension before


def reader_kind(name: str) -> tuple[str | None, str | None]:
    """(reader, compression) for a file name: compression "gz", "zst" or None (stream.open_source takes it); reader
    None when the extension is not one we read."""
    stem, ext = os.path.splitext(name.lower())
    compression = COMPRESSIONS.get(ext)
    if compression is not None:
        ext = os.path.splitext(stem)[1]
    return READERS.get(ext), compression


def _walk(source: Path, exclude: Path | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(relpath, path) of every file under `source`, sorted; hidden files and folders and `exclude` left out. Then
    the symlinks to folders outside the source, which are not walked (one inside is walked where it lies)."""
    if source.is_file():
        return [(source.name, str(source))], []
    items, linked = [], []
    root = os.path.realpath(source)
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [
            d for d in dirnames if not d.startswith(".") and (exclude is None or Path(dirpath, d).resolve() != exclude)
        ]
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if os.path.islink(full) and os.path.commonpath([root, os.path.realpath(full)]) != root:
                linked.append((Path(os.path.relpath(full, source)).as_posix(), full))
        for fn in filenames:
            if not fn.startswith("."):
                full = os.path.join(dirpath, fn)
                items.append((Path(os.path.relpath(full, source)).as_posix(), full))
    return sorted(items), sorted(linked)


def shown_name(rel: str) -> str:
    """A path as records and the quarantine name it: a name that is not UTF-8 (os.walk gives its bad bytes as
    surrogates) with those bytes written \\xNN."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_SHOWN_BYTE = re.compile(r"\\x[89a-f][0-9a-f]")  # a byte of a name that is not UTF-8, as shown_name writes it


def _not_utf8_name(full: str) -> bool:
    """Whether `full`, missing as spelled, is the shown_name of a path that is not UTF-8 (the registry keeps files by
    the names they are shown with)."""
    return _SHOWN_BYTE.search(full) is not None and not os.path.lexists(full)


def examine(rel: str, full: str, root: str | None, follow_outside_symlinks: bool) -> SourceFile:
    """The file as a task will read it, or refused with a reason: checked with stat before anything opens it
    (opening a FIFO blocks forever). A symlink to nothing is refused as unreadable_file, naming its target; any
    other path that cannot be stat-ed (gone since it was listed) is left to the reader, which rejects it so too."""
    if _not_utf8_name(full):
        return SourceFile(rel=rel, path=full, size=0, refused="bad_file_name", detail=NOT_UTF8_NAME)
    if root is not None and os.path.islink(full):
        target = os.path.realpath(full)
        outside = os.path.commonpath([root, target]) != root
        if outside and os.path.isdir(full):  # never walked, whatever follow_outside_symlinks says
            detail = f"a symlink to the folder {target}, outside the source: linked folders are not walked"
        elif outside and not follow_outside_symlinks:
            detail = f"a symlink to {target}, outside the source (set follow_outside_symlinks to read it)"
        else:
            detail = ""
        if detail:
            return SourceFile(rel=rel, path=full, size=0, refused="outside_source", detail=detail)
    try:
        st = os.stat(full)
    except OSError:
        if os.path.islink(full):
            missing = f"a symlink to {os.readlink(full)}, which does not exist"
            return SourceFile(rel=rel, path=full, size=0, refused="unreadable_file", detail=missing)
        return SourceFile(rel=rel, path=full, size=0)
    kind = file_type(st.st_mode)
    if kind is not None:
        return SourceFile(
            rel=rel, path=full, size=0, refused="not_a_regular_file", detail=f"{kind}: only regular files are read"
        )
    return SourceFile(rel=rel, path=full, size=st.st_size)


def _remote_objects(source: RemoteLocation) -> tuple[list[RemoteObject], list[str]]:
    """(objects of a format we read, URLs of the others) under a prefix or the one object it names; as in a folder,
    an object whose key below the prefix has a part starting with "." (a hidden file or folder) is in neither."""
    prefix = source.url.rstrip("/") + "/"
    read: list[RemoteObject] = []
    skipped: list[RemoteObject] = []
    for found in list_objects(source, RETRIES):
        below = found.url[len(prefix) :] if found.url.startswith(prefix) else found.url.rsplit("/", 1)[-1]
        if any(part.startswith(".") for part in below.split("/")):
            continue
        (read if reader_kind(found.url)[0] else skipped).append(found)
    return read, [found.url for found in skipped]


def list_source(source: Location, exclude: Path | None = None, follow_outside_symlinks: bool = False) -> Listing:
    """The files of `source` (a file, or a folder searched recursively; an object or a prefix, listed recursively)
    to read and to skip. `exclude` is the data root when it lies inside the source: never ingest our own
    outputs."""
    if isinstance(source, RemoteLocation):
        read, skipped = _remote_objects(source)
        return Listing([SourceFile(rel=found.url, path=found.url, size=found.size) for found in read], skipped)
    root = os.path.realpath(source) if source.is_dir() else None
    files, skipped = [], []
    found, linked_folders = _walk(source, exclude)
    for rel, full in found:
        if (shown := shown_name(rel)) != rel:  # not UTF-8: refused by the name it is shown with
            if reader_kind(shown)[0]:
                files.append(SourceFile(rel=shown, path=full, size=0, refused="bad_file_name", detail=NOT_UTF8_NAME))
            else:
                skipped.append(shown)
        elif reader_kind(rel)[0]:
            files.append(examine(rel, full, root, follow_outside_symlinks))
        else:
            skipped.append(rel)
    files += [examine(rel, full, root, follow_outside_symlinks) for rel, full in linked_folders]
    return Listing(sorted(files, key=lambda f: f.rel), skipped)


def source_state(source: Location, exclude: Path | None = None) -> dict[str, list]:
    """{relative path: [size, mtime_ns]} of the files the readers list: one stat each, nothing read. Files the
    readers skip (a README, a hidden file) are not in it, so changing them changes nothing downstream. Files they
    refuse (a FIFO, a socket, a symlink out of the source or to nothing: `examine`) are, with their own stat (not
    followed), so the batch that first sees one lists it in its `_rejected.jsonl`. Objects: {URL: [size, ETag]}
    from the listing alone (the ETag is the store's tag of the content: a new one is new content)."""
    if isinstance(source, RemoteLocation):
        return {found.url: [found.size, found.identity] for found in _remote_objects(source)[0]}
    state: dict[str, list] = {}
    for f in list_source(source, exclude).files:
        try:
            st = os.lstat(f.path) if f.refused else os.stat(f.path)
        except OSError:
            continue
        state[f.rel] = [st.st_size, st.st_mtime_ns]
    return state


def source_fingerprint(state: dict[str, list]) -> str:
    """16 hex of SHA-256 over a `source_state`: equal fingerprints, same listed files (names, sizes, mtimes or
    ETags)."""
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


def plan_tasks(files: list[SourceFile], task_bytes: int) -> list[list[SourceFile]]:
    """Groups sorted files into consecutive tasks of about `task_bytes` (at least one file each)."""
    tasks: list[list[SourceFile]] = []
    cur: list[SourceFile] = []
    cur_bytes = 0
    for f in files:
        if cur and cur_bytes + f.size > task_bytes:
            tasks.append(cur)
            cur, cur_bytes = [], 0
        cur.append(f)
        cur_bytes += f.size
    if cur:
        tasks.append(cur)
    return tasks
