"""Record JSONL and atomic file helpers shared by every stage."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tokenmill.common.failpoints import failpoint
from tokenmill.common.space import as_disk_full, require_room
from tokenmill.errors import CorruptOutputError

if sys.version_info >= (3, 14):  # the stdlib's; backports.zstd is installed for older Pythons only
    from compression import zstd
else:
    from backports import zstd

STATS_FILE = "_stats.json"
TIMINGS_FILE = (
    "_timings.json"  # how the run went (seconds, workers): apart, so every data file is identical across reruns
)
REJECTED_FILE = "_rejected.jsonl"
# each record shard as its stage wrote it (name, bytes, records, CRC-32), with what the stage found about the records
# while writing them: an asset check reads these figures instead of re-parsing every record (the checks)
SHARDS_FILE = "_shards.json"
READ_BLOCK = 1 << 20  # bytes per read when checksumming a file (memory stays flat whatever the shard size)
REMOVED_FILE = "removed.jsonl"


# ensure_ascii=False keeps CJK readable and files small; sort_keys off to keep field order. One encoder for every
# line: json.dumps with these options builds a new one per call (a third of the time of a short record).
_LINE_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "))


def dumps(obj) -> str:
    """One JSONL line."""
    return _LINE_ENCODER.encode(obj)


# orjson reads an integer beyond 64 bits as a float where json keeps it exact: text holding a run of 19+ digits
# (anywhere, strings included: a cheap, conservative test) is parsed by json instead
_DIGITS_ONLY = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_NUMBER = b"0" * 19


def _orjson_loads(text: str | bytes):
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # NaN, lone surrogates, deep nesting, bad JSON: json accepts it or names the error
        return json.loads(text)


def json_parser(data: bytes) -> Callable[[str | bytes], Any]:
    """json.loads for JSON text cut from `data` (a line, a block of lines, a file), 2-3x faster where it can be:
    orjson gives the same values and rejects what json rejects (tests/test_raw.py), except for integers beyond 64
    bits, so `data` holding a long run of digits gets json.loads itself."""
    return json.loads if _LONG_NUMBER in data.translate(_DIGITS_ONLY) else _orjson_loads


def loads(line: bytes):
    """json.loads of one line, through json_parser."""
    return json_parser(line)(line)


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
    """The record shards of a stage folder in order (part-*.jsonl; rejected/removed files excluded). A stage
    partitioned by source batch holds one folder per batch: every published batch's shards, in batch order (not
    the hidden version folders the batch names link to, nor a run's staging folder)."""
    folder = Path(folder)
    direct = sorted(folder.glob("part-*.jsonl"))
    return direct or sorted(p for p in folder.glob("*/part-*.jsonl") if not p.parent.name.startswith("."))


def batch_folders(stage_dir: str | os.PathLike) -> list[Path]:
    """The published batch folders of a stage partitioned by source batch, in batch order."""
    stage_dir = Path(stage_dir)
    if not stage_dir.is_dir() or stage_dir.is_symlink():  # unbuilt, or one folder for the whole corpus
        return []
    return sorted(p for p in stage_dir.iterdir() if not p.name.startswith(".") and (p / STATS_FILE).exists())


def gather_batch_files(stage_dir: str | os.PathLike, name: str) -> None:
    """`stage_dir/name`: every batch folder's `name` (rejected or removed records) in batch order, so the stage
    folder lists what it dropped in one place, as an unpartitioned stage does: one batch's file is hard-linked, not
    copied (link_atomic; the batch folder's files are never written in place)."""
    parts = [p / name for p in batch_folders(stage_dir) if (p / name).exists()]
    if len(parts) == 1:
        link_atomic(parts[0], Path(stage_dir) / name)
    else:
        concat_files(parts, Path(stage_dir) / name, False)


def shard_name(index: int) -> str:
    return f"part-{index:05d}.jsonl"


def temporary_path(path: str | os.PathLike) -> Path:
    """Where a file is written before it is renamed to `path`: beside it (one file system, so the rename is atomic),
    hidden and unique per writer. Readers list no hidden file; recovery removes what a killed writer left
    (`.<name>.tmp-<8 hex>`, TEMPORARY_GLOB)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")


TEMPORARY_GLOB = ".*.tmp-*"  # every temporary_path


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator:
    """A file open for writing ("w": UTF-8 text, "wb": bytes) that becomes `path` when the block ends without an
    error, renamed into place, so a reader sees the old file or the whole new one, never a part; on an error it is
    removed."""
    tmp = temporary_path(path)
    try:
        with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def link_atomic(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """`dst` becomes `src`'s bytes as a hard link to it (one copy on disk; `src` must never be written in place),
    renamed into place like atomic_file; a plain copy where the file system refuses the link (another device, no
    links)."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and os.path.samefile(src, dst):
        return  # already one file (renaming a link over itself would leave the temporary name)
    tmp = temporary_path(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class JsonlWriter:
    """Writes lines to `path` through a temporary file renamed into place on close (never half a file)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._tmp = temporary_path(self.path)
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


def concat_files(parts: Iterable[str | os.PathLike], dest: str | os.PathLike, remove: bool = True) -> tuple[int, int]:
    """Concatenates files (a shard's pieces, per-shard side files) in order into one file, atomically; returns its
    (bytes, CRC-32), computed as it is written."""
    size, crc = 0, 0
    with atomic_file(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(READ_BLOCK):
                    out.write(block)
                    size, crc = size + len(block), zlib.crc32(block, crc)
            if remove:
                os.unlink(part)
    return size, crc


def shard_figures(name: str, size: int, records: int, crc: int) -> dict:
    """One shard's entry in SHARDS_FILE."""
    return {"name": name, "bytes": size, "records": records, "crc32": crc}


def file_crc32(path: str | os.PathLike) -> tuple[int, int]:
    """(bytes, CRC-32) of a file. CRC-32 (zlib, ~1.5 GB/s) rather than SHA-256 (~0.6 GB/s here): it detects any
    change to a shard after its stage wrote it, and a check reads every shard."""
    size, crc = 0, 0
    with open(path, "rb") as f:
        while block := f.read(READ_BLOCK):
            size, crc = size + len(block), zlib.crc32(block, crc)
    return size, crc


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def shards_as_written(folder: str | os.PathLike) -> dict | None:
    """The folder's SHARDS_FILE when its record shards are exactly the ones it lists, each with the size and CRC-32
    recorded when it was written (read on threads: zlib and file reads release the GIL); None otherwise (no
    figures: an older output; figures that are not what a stage writes; a shard added, removed or changed since):
    callers then read the shards themselves."""
    folder = Path(folder)
    if not (folder / SHARDS_FILE).exists():
        return None
    try:
        figures = read_json(folder / SHARDS_FILE)
        listed = [(f["name"], f["bytes"], f["crc32"], f["records"]) for f in figures["shards"]]
    except (ValueError, KeyError, TypeError):
        return None
    shards = record_shards(folder)
    if [s.name for s in shards] != [name for name, *_ in listed]:
        return None
    if any(s.stat().st_size != size for s, (_, size, _, _) in zip(shards, listed)):
        return None
    with ThreadPoolExecutor(max(1, min(len(shards), os.cpu_count() or 1))) as pool:
        found = list(pool.map(file_crc32, shards))
    return figures if found == [(size, crc) for _, size, crc, _ in listed] else None


def shards_version(folder: str | os.PathLike) -> str:
    """The records' version: a digest of the folder's SHARDS_FILE (each shard's name, size and CRC-32), so the same
    records give the same version and any changed byte (a record another quality model kept, a score it gave)
    a new one. Dagster's data version of a record stage: what is downstream of it turns stale exactly then."""
    listed = [(f["name"], f["bytes"], f["crc32"]) for f in read_json(Path(folder) / SHARDS_FILE)["shards"]]
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:24]


STAGING_MARK = ".staging-"  # .<stage>.staging-<token>: being written; removable whenever no run holds the lock
VERSION_MARK = ".v-"  # .<stage>.v-<token>: complete; <stage> is a symlink to the current one
LEGACY_OLD_MARK = ".old-"  # .<stage>.old-<token>: left by the two-rename swap of earlier releases


def _token() -> str:
    """Sorts in creation order (recovery picks the newest complete version) and never repeats."""
    return time.strftime("%Y%m%dT%H%M%S") + f"{time.time_ns() % 10**9:09d}-{uuid.uuid4().hex[:6]}"


def _point(final_dir: Path, version: Path) -> None:
    """Makes `final_dir` a symlink to `version` in one atomic rename (readers see old or new, never neither)."""
    link = final_dir.with_name(f".{final_dir.name}.link-{uuid.uuid4().hex[:8]}")
    os.symlink(version.name, link)
    os.replace(link, final_dir)


def _versions(final_dir: Path, mark: str) -> list[Path]:
    return sorted(final_dir.parent.glob(f".{final_dir.name}{mark}*"))


@contextlib.contextmanager
def staged_output(final_dir: str | os.PathLike, expected_bytes: int | None = None) -> Iterator[Path]:
    """Yields an empty staging folder next to `final_dir`; on success publishes it as the stage's output.

    Publishing is two atomic renames, each safe to interrupt: the staging folder becomes a complete version,
    then the `final_dir` symlink is renamed over to point at it; the previous version is removed last. A failed
    or interrupted stage leaves the previous output in place, and `recover_stage` cleans up after a kill. With
    `expected_bytes` (what the stage estimates it writes), a disk without that much room is refused before any
    write; a write that still finds the disk full fails as one DiskFullError line.
    """
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    if expected_bytes is not None:
        require_room(final_dir, expected_bytes)
    token = _token()
    staging = final_dir.with_name(f".{final_dir.name}{STAGING_MARK}{token}")
    staging.mkdir()
    try:
        yield staging
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        if (full := as_disk_full(e, final_dir, staging)) is not None and full is not e:
            raise full from e
        raise
    failpoint(f"{final_dir.name}:staged", f"{final_dir.parent.name}:staged")
    version = final_dir.with_name(f".{final_dir.name}{VERSION_MARK}{token}")
    os.replace(staging, version)
    failpoint(f"{final_dir.name}:versioned", f"{final_dir.parent.name}:versioned")
    if final_dir.exists() and not final_dir.is_symlink():  # a plain folder from an earlier release
        os.replace(final_dir, final_dir.with_name(f".{final_dir.name}{VERSION_MARK}0-legacy-{token}"))
    _point(final_dir, version)
    failpoint(f"{final_dir.name}:pointed", f"{final_dir.parent.name}:pointed")
    recover_stage(final_dir)


def recover_stage(final_dir: str | os.PathLike) -> list[str]:
    """Cleans up what an interrupted run left around one stage folder; returns what it did, one line each.

    Staging folders are removed; a stage left without its pointer gets the newest complete version back (the
    legacy `.old-*` folder counts as one); every version the pointer does not name is removed. Only call it while
    holding the data root's lock (another run's staging folder would look abandoned).
    """
    final_dir = Path(final_dir)
    actions = []
    for staging in _versions(final_dir, STAGING_MARK) + list(final_dir.parent.glob(f".{final_dir.name}.link-*")):
        shutil.rmtree(staging) if staging.is_dir() and not staging.is_symlink() else staging.unlink()
        actions.append(f"removed unfinished {staging.name}")
    complete = _versions(final_dir, VERSION_MARK) + _versions(final_dir, LEGACY_OLD_MARK)
    if not final_dir.exists() and complete:
        newest = max(complete, key=lambda p: p.name.split(VERSION_MARK)[-1] if VERSION_MARK in p.name else "")
        if LEGACY_OLD_MARK in newest.name:
            os.replace(newest, final_dir)
        else:
            if final_dir.is_symlink():  # dangling pointer
                final_dir.unlink()
            _point(final_dir, newest)
        actions.append(f"restored {final_dir.name} from {newest.name}")
    current = final_dir.resolve() if final_dir.is_symlink() else None
    for old in complete:
        if old.exists() and old.resolve() != current and old != final_dir:
            shutil.rmtree(old)
            actions.append(f"removed superseded {old.name}")
    return actions


def remove_stage(final_dir: str | os.PathLike) -> None:
    """Removes a stage folder and every version, staging folder and pointer of it (hold the data root's lock)."""
    final_dir = Path(final_dir)
    for leftover in final_dir.parent.glob(f".{final_dir.name}.*"):
        shutil.rmtree(leftover) if leftover.is_dir() and not leftover.is_symlink() else leftover.unlink()
    if final_dir.is_symlink() or final_dir.is_file():
        final_dir.unlink()
    elif final_dir.exists():
        shutil.rmtree(final_dir)


def recover_data_root(data_root: str | os.PathLike) -> list[str]:
    """`recover_stage` for every stage folder under the data root, including ones only leftovers still name, and
    for every batch folder of the stages partitioned by source batch."""
    data_root = Path(data_root)
    if not data_root.is_dir():
        return []
    actions = _recover_folders(data_root)
    for entry in sorted(data_root.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("."):
            actions += [f"{entry.name}/{action}" for action in _recover_folders(entry)]
    return actions


def _recover_folders(parent: Path) -> list[str]:
    """`recover_stage` for every published folder in `parent` that leftovers name."""
    stages = set()
    for entry in parent.iterdir():
        name = entry.name
        for mark in (STAGING_MARK, VERSION_MARK, LEGACY_OLD_MARK, ".link-"):
            if name.startswith(".") and mark in name:
                stages.add(name[1 : name.index(mark)])
    return [f"{stage}: {action}" for stage in sorted(stages) for action in recover_stage(parent / stage)]


def record_id(path: str, line: int | None = None, index: int | None = None) -> str:
    """Stable record id: 16 hex chars of blake2b(relative source path, locator). Same input, same id."""
    import hashlib

    locator = f"line:{line}" if line is not None else f"index:{index}"
    return hashlib.blake2b(f"{path}\0{locator}".encode(), digest_size=8).hexdigest()


ID_HEAD = b'{"id": "'  # how a record line starts as tokenmill writes it ({"id", "text", ...}), then the record_id
_NIBBLE = np.full(256, 16, dtype=np.uint8)  # hex digit -> value; 16: not a (lowercase) hex digit
_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)


def line_ids(lines: list[bytes]) -> np.ndarray | None:
    """The ids of record lines as uint64 (id_values), read where record_id puts them (after ID_HEAD: 16 hex digits,
    then a quote) without parsing the lines; None when a line is not of that form."""
    head = np.frombuffer(b"".join(line[:25] for line in lines), dtype=np.uint8)
    if len(head) != 25 * len(lines):
        return None
    head = head.reshape(-1, 25)
    if not ((head[:, :8] == np.frombuffer(ID_HEAD, dtype=np.uint8)).all() and (head[:, 24] == ord('"')).all()):
        return None
    return id_values(head[:, 8:24])


def id_values(digits: np.ndarray) -> np.ndarray | None:
    """record_id ids, as rows of 16 hex digits (uint8 ASCII), to the uint64 they spell; None when one is not."""
    nibbles = _NIBBLE[digits]
    if (nibbles > 15).any():
        return None
    return np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).view(">u8").ravel().astype(np.uint64)


def all_distinct(values: np.ndarray) -> bool:
    """Whether no value occurs twice."""
    ordered = np.sort(values)
    return not (ordered[1:] == ordered[:-1]).any()


class DistinctValues:
    """Whether the uint64 values `add`ed, in pieces, are all distinct, holding at most HELD of them: past that they
    go to SPILL_FILES files by their top bits (they are ids and key digests, hashes that fill the files evenly) in a
    temporary folder under `spill_dir`, and each file is checked alone. A batch's record ids or key digests at any
    corpus size, in the run process, in bounded memory."""

    HELD = 1 << 22  # 32 MiB of values before they are spilled
    SPILL_BITS = 8  # 2**8 files: 100M values are ~400k (3 MiB) a file

    def __init__(self, spill_dir: Path | None = None):
        self.spill_dir = spill_dir
        self._held: list[np.ndarray] = []
        self._count = 0
        self._spilled: tempfile.TemporaryDirectory | None = None

    def add(self, values: np.ndarray) -> None:
        self._held.append(np.asarray(values, dtype=np.uint64))
        self._count += len(values)
        if self._count > self.HELD:
            self._spill()

    def all_distinct(self) -> bool:
        """The answer; the spilled files are removed."""
        if self._spilled is None:
            return all_distinct(np.concatenate(self._held or [np.zeros(0, np.uint64)]))
        try:
            self._spill()
            return all(all_distinct(np.fromfile(f, dtype=np.uint64)) for f in Path(self._spilled.name).iterdir())
        finally:
            self._spilled.cleanup()

    def _spill(self) -> None:
        if self._spilled is None:
            self._spilled = tempfile.TemporaryDirectory(prefix=".distinct-", dir=self.spill_dir)
        values = np.sort(np.concatenate(self._held or [np.zeros(0, np.uint64)]))  # each file's values: one slice
        self._held, self._count = [], 0
        edges = np.arange(1, 1 << self.SPILL_BITS, dtype=np.uint64) << np.uint64(64 - self.SPILL_BITS)
        bounds = [0, *np.searchsorted(values, edges).tolist(), len(values)]
        for part, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            if hi > lo:
                with open(Path(self._spilled.name) / f"{part:03d}.u64", "ab") as f:
                    f.write(values[lo:hi].tobytes())


ZSTD_BLOCK = 1 << 16  # uncompressed bytes per frame of a block-compressed file: a read of a few bytes decompresses
# at most a frame or two (~50 us each), and frames this long compress within ~5% of one whole-file frame


def write_zstd_blocks(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` as frames of ZSTD_BLOCK bytes each compressed alone, and beside it
    `<path>.blocks.npy`, the frames' offsets in the file, so BlockReader reads any range without the rest."""
    frames = [zstd.compress(data[i : i + ZSTD_BLOCK]) for i in range(0, len(data), ZSTD_BLOCK)]
    Path(path).write_bytes(b"".join(frames))
    np.save(f"{path}.blocks.npy", np.cumsum([0] + [len(f) for f in frames], dtype=np.int64))


class BlockReader:
    """Byte ranges of a file written by write_zstd_blocks, given in the uncompressed data. Keeps the last frame it
    decompressed: ranges read in ascending order decompress each frame once."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self.offsets = np.load(f"{path}.blocks.npy").tolist()
        self.fd = os.open(path, os.O_RDONLY)
        self.last: tuple[int, bytes] = (-1, b"")

    def __enter__(self) -> BlockReader:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def read(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        frames = range(start // ZSTD_BLOCK, -(-end // ZSTD_BLOCK))
        data = b"".join(self._frame(k) for k in frames)
        return data[start - frames.start * ZSTD_BLOCK : end - frames.start * ZSTD_BLOCK]

    def _frame(self, k: int) -> bytes:
        if self.last[0] != k:
            a, b = self.offsets[k], self.offsets[k + 1]
            try:
                self.last = (k, zstd.decompress(os.pread(self.fd, b - a, a)))
            except zstd.ZstdError as e:  # truncated or overwritten: name the file, not just the codec's complaint
                raise CorruptOutputError(f"{self.path}: frame {k} (bytes {a}..{b}) does not decompress: {e}") from e
        return self.last[1]
