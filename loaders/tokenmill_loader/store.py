"""Store: memory-mapped, validated access to tokenmill token shards (see docs/format.md).

A Store presents every key of a dataset as one concatenated stream across shards (stream mode,
`fetch`) and as records through the `offsets` of each key (record mode, `fetch_record`).
Sources: a dataset folder (`dataset.json`), a single shard folder (`meta.json`), a headerless
nanoGPT-style `.bin` file (given its dtype) or token-id JSONL (a file or a folder of `*.jsonl`).

Files are memory-mapped lazily, on first access, in each process. A Store reads the real path it resolved at
open (the data root publishes stage folders as symlinks swapped per run: a reader keeps the version it opened),
and remembers a fingerprint of what it opened (the SHA-256 of its manifest, which lists every file's hash). A
versioned split is read through the immutable manifest of the version opened (dataset.v<K>.json; the latest is the
one tokenized_bins/current.json names, so train and val open the same one, else the split's dataset.json): a new
version published meanwhile never reaches this Store or its workers.
Pickling keeps only the real path, version, options and fingerprint: a DataLoader worker re-opens that version and
refuses a dataset that differs from its parent's; a forked worker checks the fingerprint before it maps its first
file.
Every read of a mapped file first compares the file's size with what was mapped (a truncated file would kill the
process with SIGBUS), and token ids read are checked against the dataset's vocab_size.
A split in object storage (`s3://bucket/prefix/train`) is read through its local mirror (remote.py): the same
Store over the cache folder, whose data files are fetched as shards are first touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

from .format import (
    ALL_TOKEN_KEYS,
    DATASET_FILE,
    GROUP_KEY,
    KIND_DTYPES,
    MASK,
    MASK_OF,
    PLAIN_NAME,
    RECORD_KEY,
    RESPONSE_KEYS,
    SHARD_META_FILE,
    TOKENIZER_FILE,
    VALUES,
    DatasetError,
    KeyData,
    Shard,
    auto_token_dtype,
    check_records,
    current_version,
    data_file,
    infer_training_type,
    manifest_path,
    read_manifest,
    read_shard,
    sha256_file,
    validate_dataset,
)
from .remote import RemoteSpec, RemoteSplit, is_url, remote_spec


def to_torch(a: np.ndarray) -> torch.Tensor:
    """numpy -> torch with widely supported dtypes: uint16 -> int32, uint32 -> int64, others kept."""
    import torch  # here, not at import: numpy readers of a Store (checks, exports) skip torch's slow import

    if a.dtype == np.uint16:
        a = a.astype(np.int32)
    elif a.dtype == np.uint32:
        a = a.astype(np.int64)
    elif not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a)
    return torch.from_numpy(a)


class _Part:
    """One shard (or the single in-memory part of a .bin / JSONL source)."""

    __slots__ = ("name", "folder", "dtypes", "lengths", "offsets", "records", "arrays", "maps")

    def __init__(self, name: str, folder: Path):
        self.name = name
        self.folder = folder
        self.dtypes: dict[str, np.dtype] = {}
        self.lengths: dict[str, int] = {}
        self.offsets: dict[str, np.ndarray] = {}
        self.records = 0
        self.arrays: dict[str, np.ndarray | None] = {}  # filled lazily (mmap; None until then) or eagerly (JSONL)
        self.maps: dict[str, tuple[mmap.mmap, int, Path]] = {}  # key -> (its mmap, bytes mapped, file)

    @classmethod
    def of(cls, shard: Shard) -> _Part:
        part = cls(shard.name, shard.folder)
        for key, spec in shard.keys.items():
            part.dtypes[key], part.lengths[key], part.offsets[key] = spec.dtype, spec.length, spec.offsets
        part.records = shard.records
        return part


def _map_file(path: Path, dtype: np.dtype, length: int) -> tuple[np.ndarray, mmap.mmap | None]:
    """Read-only mmap of a headerless little-endian file as a plain ndarray (cheap slicing), and the mmap (whose
    size() is the file's current size: the guard against reading past a truncation)."""
    if length == 0:
        return np.empty(0, dtype=dtype), None
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != length * dtype.itemsize:
            raise DatasetError(
                f"{path}: {size} bytes, expected {length * dtype.itemsize} "
                f"({length} x {dtype}); the file changed or is truncated"
            )
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mm, dtype=dtype.newbyteorder("<"), count=length), mm


def _stat_fingerprint(paths: list[Path]) -> str:
    """Identity of files a Store reads without a manifest (.bin, JSONL): inode, size and mtime of each."""
    h = hashlib.sha256()
    for p in paths:
        st = os.stat(p)
        h.update(f"{p.name}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class Store:
    """Validated, lazily memory-mapped view of a token dataset. Build it with `open_store`."""

    def __init__(
        self,
        path: str | os.PathLike,
        dtype=None,
        verify: bool = False,
        version: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_bytes: int | None = None,
    ):
        self.path = str(path)
        # a URL: its local mirror (remote.py), which the Store reads as it reads a local folder
        self._remote_spec: RemoteSpec | None = remote_spec(self.path, cache_dir, cache_bytes) if is_url(path) else None
        local = path if self._remote_spec is None else self._remote_spec.folder
        self.real_path = os.path.realpath(local)  # read from here on, whatever the symlinks on the way point to later
        self.fingerprint: str | None = None  # set by the first open; a later open must find the same
        # the dataset version read (None: the latest, fixed by the first open; stays None for unversioned sources)
        self.version: int | None = version
        self._dtype_arg = None if dtype is None else np.dtype(dtype).str
        self.verify = bool(verify)
        self._loaded = False
        self._load()

    # -- pickling: only the paths, options and fingerprint travel; the receiving process re-opens lazily
    _STATE = ("path", "real_path", "fingerprint", "version", "_dtype_arg", "_remote_spec")

    def __getstate__(self):
        return {**{k: self.__dict__[k] for k in self._STATE}, "verify": False}  # the parent verified

    def __setstate__(self, state):
        self.__dict__.update({k: state[k] for k in self._STATE})
        self.verify = state["verify"]
        self._loaded = False

    def __getattr__(self, name):
        # lazily loaded attributes (after unpickling): load on first use
        if name.startswith("__") or self.__dict__.get("_loaded", True):
            raise AttributeError(name)
        self._load()
        return object.__getattribute__(self, name)

    def __repr__(self):
        return (
            f"Store({self.path!r}, kind={self.kind!r}, type={self.training_type!r}, version={self.version}, "
            f"shards={len(self.parts)})"
        )

    # ------------------------------------------------------------------ loading
    def _load(self):
        if self.fingerprint is None:
            self._open()
        else:  # a re-open (a DataLoader worker): it must find what the parent opened
            try:
                try:
                    self._open()
                except DatasetError as e:
                    raise DatasetError(
                        f"{self.real_path}: the dataset changed under the reader since it was opened ({e})"
                    ) from None
                self._check_fingerprint(self._fingerprint_now)
            except DatasetError:
                # nothing half-loaded stays usable: the next use re-opens and checks again
                kept = {k: self.__dict__[k] for k in (*self._STATE, "verify")}
                self.__dict__.clear()
                self.__dict__.update(kept, _loaded=False)
                raise
        self.fingerprint = self._fingerprint_now
        self._pid = os.getpid()
        self._loaded = True

    def _check_fingerprint(self, found: str) -> None:
        if found != self.fingerprint:
            raise DatasetError(
                f"{self.real_path}: the dataset changed under the reader since it was opened "
                f"(opened with fingerprint {(self.fingerprint or '')[:16]}, this process finds {found[:16]}): "
                f"a published dataset must not be rewritten in place; open it again"
            )

    def _current_fingerprint(self) -> str:
        """The fingerprint of what is at real_path now (its manifest's hash; stat of .bin and JSONL files)."""
        p = Path(self.real_path)
        try:
            if self.kind == "dataset":
                return sha256_file(manifest_path(p, self.version))
            if self.kind == "shard":
                return sha256_file(p / SHARD_META_FILE)
            return _stat_fingerprint(self._source_files(p))
        except OSError as e:
            raise DatasetError(
                f"{self.real_path}: the dataset changed under the reader since it was opened "
                f"({e.strerror or e}: {e.filename})"
            ) from None

    def _source_files(self, p: Path) -> list[Path]:
        return sorted(p.glob("*.jsonl")) if p.is_dir() else [p]

    def _open(self):
        p = Path(self.real_path)
        self.info: dict = {}
        self._remote = None if self._remote_spec is None else RemoteSplit(self._remote_spec)
        if self._remote is not None:
            # the version resolved once, from the remote current.json (a worker re-opens the parent's, from the cache)
            self.version = self._remote.sync(self.version)
            if self.verify:  # checksums and ids of every file: every shard fetched now
                self._remote.fetch_all()
        if p.is_dir() and (self.version is not None or current_version(p) or (p / DATASET_FILE).exists()):
            self.kind = "dataset"
            parts = self._load_dataset(p)
        elif p.is_dir() and (p / SHARD_META_FILE).exists():
            self.kind = "shard"
            shard = read_shard(p, digest=True)
            self._fingerprint_now = shard.meta_sha256
            parts = [_Part.of(shard)]
            # a shard alone still knows its dataset's type, vocabulary and special tokens
            dataset_info = read_manifest(p.parent)[1] if (p.parent / DATASET_FILE).exists() else {}
            self.info = {k: dataset_info[k] for k in ("vocab_size", "special_tokens") if k in dataset_info}
            self.info["training_type"] = dataset_info.get("training_type") or infer_training_type(parts[0].dtypes)
            if (p.parent / TOKENIZER_FILE).exists():
                self.info["tokenizer"] = {"file": f"../{TOKENIZER_FILE}"}
        elif p.is_file() and p.suffix == ".bin":
            self.kind = "bin"
            self._fingerprint_now = _stat_fingerprint([p])
            parts = [self._load_bin(p)]
            self.info = {"training_type": "seq"}
        elif (p.is_file() and p.suffix == ".jsonl") or (p.is_dir() and any(p.glob("*.jsonl"))):
            self.kind = "jsonl"
            self._fingerprint_now = _stat_fingerprint(self._source_files(p))
            parts = [self._load_jsonl(p)]
            self.info = {"training_type": infer_training_type(parts[0].dtypes)}
        elif p.is_dir():
            splits = sorted(d.name for d in p.iterdir() if (d / DATASET_FILE).exists())
            hint = (
                f"; splits here: {', '.join(splits)} (open one of them)"
                if splits
                else f"; no {SHARD_META_FILE} or *.jsonl either"
            )
            raise DatasetError(
                f"{p / DATASET_FILE}: missing (not a tokenmill dataset, or written only "
                f"partly: dataset.json is written last){hint}"
            )
        else:
            raise DatasetError(f"{p}: not found, or not a dataset folder, shard folder, .bin or .jsonl file")
        self.parts: list[_Part] = parts
        self.training_type: str = self.info.get("training_type") or infer_training_type(
            parts[0].dtypes if parts else ()
        )
        keys: list[str] = []
        for part in parts:
            for k in part.dtypes:
                if k not in keys:
                    keys.append(k)
        declared = self.info.get("keys") or {}
        for k in declared:  # an empty split still knows its keys
            if k not in keys:
                keys.append(k)
        self.keys = keys
        self.dtypes = {}
        for k in keys:
            found = [pt.dtypes[k] for pt in parts if k in pt.dtypes]
            self.dtypes[k] = found[0] if found else np.dtype(declared[k]["dtype"])
        self._cum = {
            k: np.concatenate([[0], np.cumsum([pt.lengths.get(k, 0) for pt in parts])]).astype(np.int64) for k in keys
        }
        self._rec_cum = np.concatenate([[0], np.cumsum([pt.records for pt in parts])]).astype(np.int64)
        self._doc_starts: dict[str, np.ndarray] = {}
        # token ids at or above it never reach a batch (checked per read: a shard's recorded maximum, checked
        # at open, cannot see bytes changed in place when verify is off)
        self.vocab_size: int | None = self.info.get("vocab_size")

    def _load_dataset(self, root: Path) -> list[_Part]:
        # the latest version is resolved once, by the first open; every later open (a worker) reads its manifest
        dataset = validate_dataset(
            root, checksums=self.verify, scan=self.verify, version=self.version, lazy_data=self._remote is not None
        )
        self.info = dataset.manifest
        self.version = dataset.manifest.get("version")
        self._fingerprint_now = dataset.manifest_sha256
        return [_Part.of(shard) for shard in dataset.shards]

    def _load_bin(self, p: Path) -> _Part:
        if self._dtype_arg is None:
            raise DatasetError(f"{p}: a headerless .bin needs its dtype: open_store(path, dtype=np.uint16)")
        dt = np.dtype(self._dtype_arg)
        size = p.stat().st_size
        if size % dt.itemsize:
            raise DatasetError(f"{p}: {size} bytes is not a multiple of {dt} itemsize {dt.itemsize} (truncated?)")
        n = size // dt.itemsize
        part = _Part(p.name, p.parent)
        part.dtypes["sequence"] = dt
        part.lengths["sequence"] = n
        part.offsets["sequence"] = np.array([0, n], dtype=np.int64)  # document boundaries unknown
        part.records = 1
        part.arrays["sequence"] = None  # mapped lazily from the file itself
        self._bin_file = p
        return part

    def _load_jsonl(self, p: Path) -> _Part:
        files = [p] if p.is_file() else sorted(p.glob("*.jsonl"))
        cols: dict[str, list] = {}
        nrec = 0
        for fp in files:
            with open(fp, encoding="utf-8") as f:
                for ln, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except (ValueError, RecursionError) as e:  # also numbers over 4300 digits, deep nesting
                        raise DatasetError(f"{fp}:{ln}: not JSON ({str(e)[:200]})") from None
                    if not isinstance(rec, dict):
                        raise DatasetError(f"{fp}:{ln}: not a JSON object")
                    row = _jsonl_row(rec)
                    if not row:
                        raise DatasetError(
                            f"{fp}:{ln}: no token-id list (expected input_ids, sequence, "
                            f"chosen/rejected or prompts/responses)"
                        )
                    if nrec and set(row) != set(cols):
                        raise DatasetError(f"{fp}:{ln}: keys {sorted(row)} differ from earlier records {sorted(cols)}")
                    for k, v in row.items():
                        cols.setdefault(k, []).append(v)
                    nrec += 1
        if not nrec:
            raise DatasetError(f"{p}: no JSONL records")
        shard = Shard(p.name, p if p.is_dir() else p.parent, {})
        arrays = {}
        for k, items in cols.items():
            nested = k in RESPONSE_KEYS
            flat_items = [x for it in items for x in it] if nested else items
            lens = np.fromiter((len(x) for x in flat_items), dtype=np.int64, count=len(flat_items))
            offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            flat = [v for x in flat_items for v in x]
            if k == GROUP_KEY:
                arr = np.asarray(flat, dtype=KIND_DTYPES[VALUES])
            elif k in MASK_OF:
                arr = np.asarray(flat, dtype=KIND_DTYPES[MASK])
            else:
                arr = np.asarray(flat, dtype=np.int64)
                if k in ALL_TOKEN_KEYS and arr.size and arr.min() >= 0:
                    arr = arr.astype(auto_token_dtype(int(arr.max()) + 1))
                elif not arr.size:
                    arr = arr.astype(np.uint16)
            arrays[k] = arr
            shard.keys[k] = KeyData(arr.dtype, len(arr), offs)
        check_records(shard, None, p)
        part = _Part.of(shard)
        part.arrays.update(arrays)
        return part

    # ------------------------------------------------------------------ arrays
    def _array(self, i: int, key: str) -> np.ndarray:
        """The array of `key` in part i, mapped on first use; a mapped file is checked to still have its size
        (one fstat), as reading mapped pages past a truncation kills the process with SIGBUS."""
        part = self.parts[i]
        a = part.arrays.get(key)
        if a is None:
            if self._pid != os.getpid():  # a forked worker maps its first file: is it still the parent's dataset?
                self._check_fingerprint(self._current_fingerprint())
                self._pid = os.getpid()
            if self._remote is not None:
                self._fetch({i})
            path = self._bin_file if self.kind == "bin" else part.folder / data_file(key)
            a, mm = _map_file(path, part.dtypes[key], part.lengths[key])
            part.arrays[key] = a
            if mm is not None:
                part.maps[key] = (mm, a.nbytes, path)
        guard = part.maps.get(key)
        if guard is not None and guard[0].size() != guard[1]:
            raise DatasetError(
                f"{guard[2]}: {guard[0].size()} bytes, {guard[1]} when it was mapped: the file was "
                f"truncated or rewritten in place under the reader"
            )
        return a

    def _fetch(self, parts: set[int]) -> None:
        """A remote store: the data files of `parts` made local (those not mapped yet, fetched together); mappings
        of files evicted meanwhile (by this or another process) are dropped, to be fetched again when touched."""
        remote = self._remote
        unmapped = [
            self.parts[i]
            for i in sorted(parts)
            if any(self.parts[i].lengths[k] and self.parts[i].arrays.get(k) is None for k in self.parts[i].dtypes)
        ]
        if remote is None or not unmapped:
            return
        remote.fetch(part.name for part in unmapped)
        for part in self.parts:
            for key, (_, _, path) in list(part.maps.items()):
                if not path.exists():
                    del part.maps[key]
                    part.arrays[key] = None

    # ------------------------------------------------------------------ prefetch plans (remote stores)
    @property
    def is_remote(self) -> bool:
        """True for a split read from object storage through a cache folder."""
        return self._remote_spec is not None

    def follow_plan(self) -> None:
        """A remote store: prefetching follows `plan` from now on (in this process and in the workers it is
        pickled or forked to, which then prefetch nothing themselves), not the stream. Local: nothing."""
        if self._remote_spec is not None and not self._remote_spec.planned:
            self._remote_spec = dataclasses.replace(self._remote_spec, planned=True)
            if self._remote is not None:
                self._remote.spec = self._remote_spec

    def plan(self, upcoming, in_flight=()) -> None:
        """A remote store: download the shards `upcoming` (part indices, in the order the next batches need them;
        repeats ignored) ahead of their first touch, evicting none of them nor of `in_flight` (parts batches handed
        out and not read yet need) to make room. Local: nothing."""
        if self._remote is None:
            return
        names = [self.parts[i].name for i in _first_seen(upcoming)]
        self._remote.plan(names, [self.parts[i].name for i in _first_seen(in_flight)])

    def parts_of_windows(self, key: str, starts, length: int) -> np.ndarray:
        """The parts windows [s, s + length) of `key` read, each window's first then last (equal unless it
        straddles a boundary), int64 (one np.searchsorted per end)."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        cum = self._cum[key]
        first = np.searchsorted(cum, starts, "right") - 1
        last = np.searchsorted(cum, starts + max(int(length), 1) - 1, "right") - 1
        return np.stack([first, last], axis=1).reshape(-1)

    def parts_of_records(self, indices) -> np.ndarray:
        """The part of each record in `indices` (non-negative), int64."""
        return np.searchsorted(self._rec_cum, np.asarray(indices, dtype=np.int64).reshape(-1), "right") - 1

    def _check_ids(self, key: str, ids: np.ndarray, where) -> None:
        """Refuses token ids >= vocab_size (one max over what was read)."""
        if self.vocab_size is not None and key in ALL_TOKEN_KEYS and ids.size and int(ids.max()) >= self.vocab_size:
            raise DatasetError(
                f"{where}: token id {int(ids.max())} >= vocab_size {self.vocab_size} of "
                f"{Path(self.real_path) / DATASET_FILE} (corrupted in place, or another vocabulary)"
            )

    def _file(self, key: str, stream_pos: int) -> Path:
        """The file holding stream position `stream_pos` of `key` (for messages)."""
        s = int(np.searchsorted(self._cum[key], stream_pos, "right")) - 1
        return self._bin_file if self.kind == "bin" else self.parts[s].folder / data_file(key)

    # ------------------------------------------------------------------ sizes
    @property
    def num_records(self) -> int:
        return int(self._rec_cum[-1])

    def num_items(self, key: str = "sequence") -> int:
        """Length of the concatenated stream of `key` across shards (tokens for a token key)."""
        self._need(key)
        return int(self._cum[key][-1])

    def __len__(self) -> int:
        return self.num_records

    def _need(self, key):
        if key not in self._cum:
            raise KeyError(f"{self.path}: no key {key!r} (keys: {self.keys})")

    def doc_starts(self, key: str = "sequence") -> np.ndarray:
        """Global stream positions where each item (document) of `key` starts, int64, sorted."""
        ds = self._doc_starts.get(key)
        if ds is None:
            self._need(key)
            cum = self._cum[key]
            counts = [len(pt.offsets[key]) - 1 for pt in self.parts]
            ds = np.empty(sum(counts), dtype=np.int64)  # filled in place: one pass over ~10M items at 10B tokens
            at = 0
            for i, (pt, n) in enumerate(zip(self.parts, counts)):
                np.add(pt.offsets[key][:-1], cum[i], out=ds[at : at + n])
                at += n
            self._doc_starts[key] = ds
        return ds

    def record_lengths(self, key: str | None = None) -> np.ndarray:
        """Items per record for `key` (default: the record key), without reading token data."""
        key = key or RECORD_KEY[self.training_type]
        self._need(key)
        return np.concatenate([np.diff(pt.offsets[key]) for pt in self.parts]).astype(np.int64)

    # ------------------------------------------------------------------ stream mode
    def read(self, key: str, begin: int, end: int) -> np.ndarray:
        """Stream items [begin, end) of `key` across shards as a numpy copy (native dtype)."""
        self._need(key)
        cum = self._cum[key]
        total = int(cum[-1])
        if not 0 <= begin <= end <= total:
            raise IndexError(f"stream range [{begin}, {end}) outside [0, {total}) of key {key!r}")
        if begin == end:
            return np.empty(0, dtype=self.dtypes[key])
        s0 = int(np.searchsorted(cum, begin, "right")) - 1
        s1 = int(np.searchsorted(cum, end, "left")) - 1
        if s0 == s1:
            base = int(cum[s0])
            out = np.array(self._array(s0, key)[begin - base : end - base])
        else:
            pieces = []
            for s in range(s0, s1 + 1):
                base = int(cum[s])
                lo, hi = max(begin, base) - base, min(end, int(cum[s + 1])) - base
                if hi > lo:
                    pieces.append(self._array(s, key)[lo:hi])
            out = np.concatenate(pieces)
        self._check_ids(key, out, f"{self._file(key, begin)} (stream items {begin}..{end})")
        return out

    def gather(
        self, key: str, starts, length: int, out: np.ndarray | None = None, in_bounds: bool = False
    ) -> np.ndarray:
        """Windows [s, s+length) of the stream of `key` for each s in `starts`, as one (B, length) array.

        The shard of every window comes from one np.searchsorted over the cumulative counts; each window
        is then one contiguous slice copy into `out` (converted to out's dtype during the copy), which
        is faster than a fancy-indexed gather. Only windows that straddle a shard boundary
        (rare) are assembled piecewise. `in_bounds=True`: the caller has checked that every window lies in the
        stream (TokenDataset checks its window indices), so its bounds are not checked again
        (docs/profile.md, 'The loader against Megatron-Core, OLMo-core and LitData').
        """
        self._need(key)
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        cum = self._cum[key]
        if out is None:
            out = np.empty((len(starts), length), dtype=self.dtypes[key])
        if not len(starts):
            return out
        if not in_bounds and (starts.min() < 0 or starts.max() + length > cum[-1]):
            raise IndexError(f"window outside the stream of {key!r} (0..{int(cum[-1])})")
        if len(cum) == 2:
            a = self._array(0, key)
            for i, s in enumerate(starts.tolist()):
                out[i] = a[s : s + length]
        else:
            sh = np.searchsorted(cum, starts, "right") - 1
            local = starts - cum[sh]
            inside = (local + length <= cum[sh + 1] - cum[sh]).tolist()
            sh = sh.tolist()
            if self._remote is not None:
                self._fetch(set(sh))  # a batch's missing shards fetched together
            arrays = {s: self._array(s, key) for s in set(sh)}  # each file's size checked once per batch
            for i, (s, lo, ok) in enumerate(zip(sh, local.tolist(), inside)):
                if ok:
                    out[i] = arrays[s][lo : lo + length]
                else:
                    out[i] = self.read(key, int(starts[i]), int(starts[i]) + length)
        if self.vocab_size is not None and key in ALL_TOKEN_KEYS and int(out.max()) >= self.vocab_size:
            row = int(np.argmax(out.max(axis=1)))
            self._check_ids(
                key, out[row], f"{self._file(key, int(starts[row]))} (window at stream item {int(starts[row])})"
            )
        return out

    def fetch(self, begin: int, end: int, keys: str | Sequence[str] = "sequence"):
        """Stream mode: items [begin, end) of the concatenated stream of each key across shards.

        One key gives a tensor, several a dict of tensors. Token ids come back as int32 (uint16 data) or
        int64 (uint32 data); masks as uint8; rewards as float32.
        """
        if isinstance(keys, str):
            return to_torch(self.read(keys, begin, end))
        return {k: to_torch(self.read(k, begin, end)) for k in keys}

    # ------------------------------------------------------------------ record mode
    def locate(self, index: int) -> tuple[int, int]:
        """(shard, local record) of dataset record `index` (np.searchsorted over cumulative counts)."""
        n = self.num_records
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"record {index} out of range (0..{n - 1})")
        s = int(np.searchsorted(self._rec_cum, index, "right")) - 1
        return s, index - int(self._rec_cum[s])

    def read_record(self, index: int, key: str):
        s, j = self.locate(index)
        part = self.parts[s]
        if key not in part.offsets:
            raise KeyError(f"{self.path}: no key {key!r} (keys: {self.keys})")
        a = self._array(s, key)
        offs = part.offsets[key]
        where = f"{part.folder / data_file(key)} (record {j} of {part.name})"
        if key in RESPONSE_KEYS and GROUP_KEY in part.offsets:
            r0, r1 = part.offsets[GROUP_KEY][j], part.offsets[GROUP_KEY][j + 1]
            items = [np.array(a[offs[r] : offs[r + 1]]) for r in range(int(r0), int(r1))]
            for item in items:
                self._check_ids(key, item, where)
            return items
        out = np.array(a[offs[j] : offs[j + 1]])
        self._check_ids(key, out, where)
        return out

    def fetch_record(self, index: int, keys: str | Sequence[str] | None = None):
        """Record mode: record `index` of each key via its offsets (one key: a tensor; several: a dict).

        grpo: `responses` and `masks` give a list of tensors, one per response of the record (grouped by
        the `rewards` offsets); `rewards` gives the record's float32 rewards.
        """

        def conv(v):
            return [to_torch(x) for x in v] if isinstance(v, list) else to_torch(v)

        if keys is None:
            keys = self.keys
        if isinstance(keys, str):
            return conv(self.read_record(index, keys))
        return {k: conv(self.read_record(index, k)) for k in keys}

    # ------------------------------------------------------------------ misc
    def tokenizer_path(self) -> Path | None:
        """The dataset's tokenizer.json (a plain name next to dataset.json; a shard's is its dataset's)."""
        root = Path(self.real_path) if Path(self.real_path).is_dir() else Path(self.real_path).parent
        name = (self.info.get("tokenizer") or {}).get("file", TOKENIZER_FILE)
        if self.kind == "shard":
            root, name = root.parent, TOKENIZER_FILE
        cand = root / name
        return cand if PLAIN_NAME.fullmatch(name) and cand.is_file() else None


def _first_seen(parts) -> list[int]:
    """`parts` without repeats, in the order each first appears."""
    parts = np.asarray(parts, dtype=np.int64).reshape(-1)
    unique, first = np.unique(parts, return_index=True)
    return unique[np.argsort(first, kind="stable")].tolist()


def _jsonl_row(rec: dict) -> dict:
    """Token-id columns of one JSONL record, with format.md key names."""
    row = {}
    if "input_ids" in rec and "sequence" not in rec:
        row["sequence"] = rec["input_ids"]
        if "loss_mask" not in rec and isinstance(rec.get("labels"), list):
            row["loss_mask"] = [0 if x == -100 else 1 for x in rec["labels"]]
    for k in ALL_TOKEN_KEYS + tuple(MASK_OF) + (GROUP_KEY,):
        v = rec.get(k)
        if k in rec and isinstance(v, list):
            row[k] = v
    if "prompts" not in row and "prompt" in rec and "responses" in row and isinstance(rec["prompt"], list):
        row["prompts"] = rec["prompt"]
    return row


def open_store(
    path: str | os.PathLike,
    dtype=None,
    verify: bool = False,
    version: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_bytes: int | None = None,
) -> Store:
    """Open a dataset folder, a shard folder, a headerless `.bin` (with `dtype`) or token-id JSONL, or a split
    published to object storage (`s3://bucket/prefix/train`, with `cache_dir`: docs/publish.md).

    A dataset folder opens its latest version (resolved once, through tokenized_bins/current.json where there is
    one, else dataset.json: `Store.version` is the version it holds, None for a folder written before versions
    existed); `version=K` pins version K (dataset.v<K>.json), a DatasetError listing the available versions when K
    was never published or has been removed by retention.
    Raises DatasetError (naming the file) when a file does not match its metadata; `verify=True` also
    checks the SHA-256 of every file listed in dataset.json and that every token id < vocab_size.
    A URL's files are fetched into `cache_dir` on first touch, each checked against the manifest's SHA-256, and
    `cache_bytes` bounds what stays there (remote.py; `verify=True` fetches every shard at open).
    """
    if isinstance(path, Store):
        if version is not None and path.version != version:
            raise DatasetError(f"{path.real_path}: this Store reads version {path.version}, not {version}")
        return path
    return Store(path, dtype=dtype, verify=verify, version=version, cache_dir=cache_dir, cache_bytes=cache_bytes)
