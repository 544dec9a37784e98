"""The stage folder: file names, input chunks, and read access to what the per-chunk step wrote.

Every step reads and writes files here, so any step can run as tasks in another process or machine; the task
inputs are small dataclasses naming files. A document is known everywhere by its global index: the index of its
chunk's first record (`Chunk.first`) plus its ordinal (0-based non-blank line) within the chunk.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import BlockReader, json_parser, record_shards
from tokenmill.errors import CorruptOutputError
from tokenmill.stages.dedup.minhash import fold8, natural_key

REPORT_FILE = "report.json"
CLUSTERS_FILE = "clusters.jsonl"
SIGNATURE_DIR = "signatures"  # per chunk: <stem>.npy signatures, <stem>.bands.npy band hashes, <stem>.items.npz
DOCS_DIR = "docs"  # per chunk: <stem>.npy document table, <stem>.paths.json its source paths
KEYS_DIR = "keys"  # per chunk: the keys (<stem>.key.bin + offsets) and the digest index sorted by digest
KEY_ZST = ".key.zst"  # an index segment's keys (format 4): io.write_zstd_blocks of what .key.bin holds
EXACT_DIR = "exact"  # per digest range: members of exact groups (doc, rep), sorted by doc
LSH_DIR = "lsh"  # per chunk: (bands, items) band hashes, ordinals, order words of group representatives, a fence
CANDIDATE_DIR = "candidates"  # per band, hash range and batch: (2, pairs) candidate pairs sorted by first doc
VERIFIED_DIR = "verified"  # per first-doc range: verified pairs (a, b, similarity)
DECISION_DIR = "decisions"  # per chunk with removals: ordinal, id, kept id, level, similarity
CLUSTER_PART_DIR = "cluster_parts"  # per part of the clustering: its clusters' lines, decisions, clustering
LEVEL_NAMES = ("exact", "near")
LOC_KIND = ("line", "index", None)
VERIFIED_DTYPE = np.dtype([("a", "<i8"), ("b", "<i8"), ("sim", "<f8")])


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """A line-aligned byte range of one input shard; `first` is the global index of its first record."""

    shard: int
    name: str
    path: str
    start: int
    end: int
    chunk: int
    first: int = 0
    records: int = 0
    root: str = ""  # an index segment holding this chunk's step files (an earlier batch's); "": the stage folder

    @classmethod
    def of_segment(cls, entry: dict, root: str = "", first: int = 0) -> Chunk:
        """A chunk of an index segment from its segment.json entry: no source bytes, its step files in `root`."""
        return cls(
            shard=-1,
            name=entry["name"],
            path="",
            start=0,
            end=0,
            chunk=entry["chunk"],
            first=first,
            records=entry["records"],
            root=root,
        )

    @property
    def stem(self) -> str:
        return f"{Path(self.name).stem}-c{self.chunk:04d}"

    def step_file(self, out_dir: Path, step: str, suffix: str) -> Path:
        """The chunk's file `<step>/<stem><suffix>` (step: DOCS_DIR, KEYS_DIR, ...), in the stage folder or in the
        index segment the chunk belongs to."""
        return Path(self.root or out_dir) / step / f"{self.stem}{suffix}"


def plan_chunks(in_dir: Path, chunk_bytes: int) -> list[Chunk]:
    chunks: list[Chunk] = []
    for s, path in enumerate(record_shards(in_dir)):
        size = path.stat().st_size
        bounds = [0]
        with open(path, "rb") as f:
            while bounds[-1] + chunk_bytes < size:
                f.seek(bounds[-1] + chunk_bytes)
                f.readline()
                pos = f.tell()
                if pos >= size:
                    break
                bounds.append(pos)
        bounds.append(size)
        chunks.extend(
            Chunk(shard=s, name=path.name, path=str(path), start=bounds[c], end=bounds[c + 1], chunk=c)
            for c in range(len(bounds) - 1)
        )
    return chunks


def _read(chunk: Chunk) -> bytes:
    with open(chunk.path, "rb") as f:
        f.seek(chunk.start)
        return f.read(chunk.end - chunk.start)


def _raw_lines(chunk: Chunk) -> list[bytes]:
    return _read(chunk).split(b"\n")


def chunk_lines(chunk: Chunk) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines of a chunk with their 0-based record ordinal within the chunk."""
    ordinal = 0
    for line in _raw_lines(chunk):
        if line.strip():
            yield ordinal, line
            ordinal += 1


def chunk_records(chunk: Chunk) -> list:
    """The records of a chunk in order, as `parse` reads each non-blank line (json_parser: the same values as
    json.loads); where that fails, the chunk is parsed line by line with `parse`, which names a corrupt line."""
    try:
        data = _read(chunk)
        decode = json_parser(data)
        return [decode(line) for line in data.split(b"\n") if line.strip()]
    except ValueError:  # UnicodeDecodeError, json.JSONDecodeError
        return [parse(chunk, ordinal, line) for ordinal, line in chunk_lines(chunk)]


def parse(chunk: Chunk, ordinal: int, line: bytes) -> dict:
    """One record of cleaned_jsonl (a stage's own output: a line that does not parse is corruption)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        with open(chunk.path, "rb") as f:
            before = f.read(chunk.start).count(b"\n")
        raw = [i for i, x in enumerate(_raw_lines(chunk)) if x.strip()][ordinal]
        raise CorruptOutputError(
            f"{chunk.path}:{before + raw + 1}: not a JSON record ({e.msg}); rematerialize cleaned_jsonl"
        ) from e


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None without glibc."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _release_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def releases_memory(task_fn):
    """Decorates a task function: the heap memory freed before and during the task goes back to the system when
    it starts and ends. glibc keeps freed heap pages (and raises its mmap threshold up to 32 MiB as large blocks are
    freed, so numpy temporaries come from the heap), so without this a long-lived pool worker's RSS ratchets up task
    after task (the same bucket tasks in a pool worker peaked far above one alone). Trimming between tasks, rather
    than fixing the mmap threshold low, lets a task reuse its freed pages: mapping every large temporary afresh cost
    CPU seconds of page faults (docs/profile.md, 'What changed in this round'). A no-op without glibc."""

    @functools.wraps(task_fn)
    def task(arg):
        _release_freed_memory()
        try:
            return task_fn(arg)
        finally:
            _release_freed_memory()

    return task


def folder(out_dir: Path, name: str) -> Path:
    path = Path(out_dir) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


HEADER_CACHE = 1 << 16  # array headers a process keeps: a bucket task opens every chunk's LSH files, and parsing a
# header cost more than the reads (at 10M documents)
_HEADERS: dict[tuple, tuple[tuple[int, ...], np.dtype, int]] = {}  # (path, inode, mtime, size) -> shape, dtype, offset


class NpyRows:
    """Positioned reads of slices of a saved array (np.save, C order): `read(lead, start, stop)` is
    `array[*lead, start:stop]`, `searchsorted(lead, value)` a binary search of the sorted `array[*lead]`, one element
    read per step.

    Not mapped: the pages a task maps count in its resident memory, and the kernel maps page-cache folios of up to
    2 MiB whole, so a mapped slice of 100 KB cost ~2 MiB per file; a bucket task reading its slice of every chunk's
    LSH files that way held hundreds of MiB at 1.5M documents (60 chunks), and the count of files grows with the
    corpus. Read, a task holds exactly its slices."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            st = os.fstat(self.fd)
            key = (str(self.path), st.st_ino, st.st_mtime_ns, st.st_size)
            header = _HEADERS.get(key)
            if header is None:
                if len(_HEADERS) >= HEADER_CACHE:
                    _HEADERS.clear()
                header = _HEADERS[key] = self._header()
        except BaseException:
            os.close(self.fd)
            raise
        self.shape, self.dtype, self.offset = header

    def _header(self) -> tuple[tuple[int, ...], np.dtype, int]:
        with open(self.path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = header(f)
            if fortran and len(shape) > 1:
                raise CorruptOutputError(f"{self.path}: a Fortran-order array; the dedup step files are C order")
            return shape, dtype, f.tell()

    def __enter__(self) -> NpyRows:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def _position(self, lead: tuple[int, ...], index: int) -> tuple[int, int]:
        """(byte offset of array[*lead, index], bytes per element of that axis)."""
        depth = len(lead)
        row = math.prod(self.shape[depth + 1 :]) * self.dtype.itemsize
        flat = 0  # np.ravel_multi_index(lead, shape[:depth]) in Python ints (numpy's call costs more)
        for i, n in zip(lead, self.shape[:depth]):
            flat = flat * n + int(i)
        return self.offset + (flat * self.shape[depth] + index) * row, row

    def read(self, lead: tuple[int, ...], start: int, stop: int) -> np.ndarray:
        out = np.empty((max(stop - start, 0),) + tuple(self.shape[len(lead) + 1 :]), dtype=self.dtype)
        view = out.reshape(-1).view(np.uint8).data  # a memoryview of its bytes
        pos, _ = self._position(lead, start)
        done = 0
        while done < len(view):  # a single read returns at most ~2 GiB
            n = os.preadv(self.fd, [view[done:]], pos + done)
            if n <= 0:
                raise CorruptOutputError(f"{self.path}: truncated (expected shape {self.shape})")
            done += n
        return out

    def searchsorted(self, lead: tuple[int, ...], value: int, field: str | None = None) -> int:
        """First index of the sorted 1-D `array[*lead]` (or of its `field`) whose value is >= `value` (a Python
        int, so 2**64 is past every uint64)."""
        lo, hi = 0, self.shape[len(lead)]
        while lo < hi:
            mid = (lo + hi) // 2
            v = self.read(lead, mid, mid + 1)[0]
            if int(v[field] if field else v) < value:
                lo = mid + 1
            else:
                hi = mid
        return lo


# the numeric document-table fields (signatures._document_table) the clusters read
TABLE_FIELDS = ("meta_count", "text_len", "key_len", "loc", "loc_kind", "garbage", "bad_case", "repeats")


@dataclass(frozen=True, kw_only=True)
class DocumentTable:
    """The document-table fields of some documents (Corpus.rows), an array each, in the order asked for."""

    meta_count: np.ndarray
    text_len: np.ndarray
    key_len: np.ndarray
    loc: np.ndarray
    loc_kind: np.ndarray
    garbage: np.ndarray
    bad_case: np.ndarray
    repeats: np.ndarray
    ids: np.ndarray  # bytes
    path: np.ndarray  # an index into `paths`
    paths: list[str]  # the source paths in natural order, so comparing indices compares paths
    chunk: np.ndarray  # index of the document's chunk
    ordinal: np.ndarray  # its record within the chunk
    indexed: np.ndarray  # in an index segment (an earlier batch's record, dedup_batch)


class Corpus:
    """Read access by global document index to the per-chunk document tables and keys, so a task holds only the
    documents it asks for."""

    def __init__(self, out_dir: Path, chunks: list[Chunk]):
        self.out_dir = Path(out_dir)
        self.chunks = chunks
        self.firsts = np.asarray([c.first for c in chunks], dtype=np.int64)

    def locate(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chunk index, ordinal) of each global document index."""
        c = np.searchsorted(self.firsts, docs, side="right") - 1
        return c, docs - self.firsts[c]

    def per_chunk(self, docs: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(chunk index, positions in `docs`, ordinals) for each chunk holding some of `docs` (any order), so a
        task maps one chunk's files at a time."""
        c, o = self.locate(docs)
        by_chunk = np.argsort(c, kind="stable")
        bounds = np.searchsorted(c[by_chunk], np.arange(len(self.chunks) + 1))
        for ci in np.flatnonzero(np.diff(bounds)).tolist():
            pos = by_chunk[bounds[ci] : bounds[ci + 1]]
            yield ci, pos, o[pos]

    def _file(self, c: int, step: str, suffix: str) -> Path:
        return self.chunks[c].step_file(self.out_dir, step, suffix)

    def _paths(self, c: int) -> list[str]:
        return json.loads(self._file(c, DOCS_DIR, ".paths.json").read_text(encoding="utf-8"))

    def rows(self, docs: np.ndarray) -> DocumentTable:
        """The document-table fields of `docs` (ascending global indices) as arrays."""
        c, o = self.locate(docs)
        parts = []
        for ci in np.unique(c).tolist():
            sel = c == ci
            # read whole (one chunk's table, ~40 bytes a record) rather than mapped: mapped pages a task touched
            # would count in its resident memory, and the involved documents are spread over every page
            part = np.load(self._file(ci, DOCS_DIR, ".npy"))[o[sel]]
            parts.append((sel, part, self._paths(ci)))
        fields = {k: np.empty(len(docs), dtype=np.int64) for k in (*TABLE_FIELDS, "path")}  # filled chunk by chunk
        width = max([p.dtype["id"].itemsize for _, p, _ in parts] + [1])
        ids = np.empty(len(docs), dtype=f"S{width}")
        path_names: list[str] = []
        for sel, part, names in parts:
            for k in TABLE_FIELDS:
                fields[k][sel] = part[k]
            ids[sel] = part["id"]
            fields["path"][sel] = part["path"] + len(path_names)
            path_names.extend(names)
        paths = sorted(set(path_names), key=lambda p: (natural_key(p), p))
        rank = {p: i for i, p in enumerate(paths)}
        remap = np.asarray([rank[p] for p in path_names] + [0], dtype=np.int64)
        return DocumentTable(
            **{k: fields[k] for k in TABLE_FIELDS},
            ids=ids,
            path=remap[fields["path"]],
            paths=paths,
            chunk=c,
            ordinal=o,
            indexed=np.asarray([bool(ch.root) for ch in self.chunks], dtype=bool)[c],
        )

    def shingle_units(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(units, by_word): each document's key length in shingle units (code points, or words) and the unit."""
        units, by_word = np.empty(len(docs), dtype=np.int64), np.empty(len(docs), dtype=bool)
        for ci, pos, o in self.per_chunk(docs):
            table = np.load(self._file(ci, DOCS_DIR, ".npy"), mmap_mode="r")
            units[pos], by_word[pos] = table["key_len"][o], table["by_word"][o]
        return units, by_word

    def signature_bytes(self, docs: np.ndarray, sizes: np.ndarray, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, found): each document's MinHash signature at its shingle size, a byte per position (the value
        folded: two equal values give equal bytes, two different ones with probability 1/256), and whether the
        document was sketched at that size. One chunk's signature file is mapped at a time; an index segment's
        holds them folded already (index.py)."""
        out = np.zeros((len(docs), num_perm), dtype=np.uint8)
        found = np.zeros(len(docs), dtype=bool)
        for ci, pos, o in self.per_chunk(docs):
            items = np.load(self._file(ci, SIGNATURE_DIR, ".items.npz"))
            code = items["item_doc"].astype(np.int64) * 256 + items["item_n"]  # sorted by (doc, size)
            if len(code) == 0:
                continue
            want = o * 256 + sizes[pos]
            row = np.minimum(np.searchsorted(code, want), len(code) - 1)
            hit = code[row] == want
            sig = np.load(self._file(ci, SIGNATURE_DIR, ".npy"), mmap_mode="r")
            v = np.asarray(sig[row[hit]])
            del sig
            out[pos[hit]] = v if v.dtype == np.uint8 else fold8(v)
            found[pos[hit]] = True
        return out, found

    def keys(self, docs: np.ndarray) -> list[str]:
        """The dedup keys of documents as shingled (signatures.shingle_keys), in the order given: a chunk's offsets
        read once for all its documents, then one positioned read per key (not mapped, so a task's resident memory
        holds the keys it asks for, not the pages of the key files it touched). An index segment of format 4 holds
        them compressed in frames (index.py): read in ascending order, each frame is decompressed once."""
        out = [""] * len(docs)
        for ci, pos, o in self.per_chunk(np.asarray(docs, dtype=np.int64)):
            offsets = np.load(self._file(ci, KEYS_DIR, ".key_offsets.npy"), mmap_mode="r")
            ascending = np.argsort(offsets[o], kind="stable")
            pos, o = pos[ascending], o[ascending]
            starts, ends = offsets[o].tolist(), offsets[o + 1].tolist()
            del offsets
            with _key_file(self._file(ci, KEYS_DIR, "")) as f:
                for p, start, end in zip(pos.tolist(), starts, ends):
                    out[p] = f.read(start, end).decode("utf-8")
        return out


class _PlainFile:
    """Byte ranges of an uncompressed file (BlockReader's interface)."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY)

    def __enter__(self) -> _PlainFile:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def read(self, start: int, end: int) -> bytes:
        return os.pread(self.fd, end - start, start)


def _key_file(base: Path) -> _PlainFile | BlockReader:
    """A chunk's key stream: <stem>.key.zst in an index segment of format 4, else <stem>.key.bin."""
    compressed = Path(f"{base}{KEY_ZST}")
    return BlockReader(compressed) if compressed.exists() else _PlainFile(Path(f"{base}.key.bin"))
