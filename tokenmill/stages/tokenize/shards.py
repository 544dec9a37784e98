"""Writing: encoded records -> the shard folders and dataset.json of each split (docs/format.md).

Every name, key, kind and manifest field comes from `tokenmill_loader.format`, the module the loader reads with.
The run process plans the shards from the encode tasks' record token counts, in task order (PackPlan, ShardCuts),
and a pack task per shard writes it from the tasks' arrays (pack_shard), so the output is byte-identical for any
worker count or task cut. Each shard is written in `.tmp-shard-XXXXX/` and renamed when complete, directly in its
split folder; a shard never holds two input batches. Nothing is published until a version manifest names the shards
(versions.py publishes it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_file, link_atomic
from tokenmill.errors import CapacityError, ConfigError
from tokenmill.stages.tokenize.encode import SplitChunk, check_ids, read_splits
from tokenmill.stages.tokenize.versions import next_shard_index
from tokenmill_loader.format import (
    ALL_TOKEN_KEYS,
    KEYS,
    RECORD_IDS_FILE,
    SHARD_META_FILE,
    SPLITS,
    TOKEN_DTYPES,
    auto_token_dtype,
    data_file,
    dataset_manifest,
    dtype_fits,
    dumps_compact,
    key_dtype,
    key_meta,
    shard_entry,
    shard_folder_name,
    versioned_tokenizer_file,
)

REJECTED_JSON = "_rejected.json"  # not .jsonl: record globbing tools must not take it for records


def token_dtype_for(vocab_size: int, requested: str = "auto") -> np.dtype:
    """The token dtype for a vocabulary; refuses an explicit dtype the vocabulary overflows."""
    dt = np.dtype(auto_token_dtype(vocab_size) if requested == "auto" else requested)
    if not dtype_fits(vocab_size, dt):
        raise ConfigError(
            f"tokenized_bins.token_dtype: a vocabulary of {vocab_size:,} tokens overflows {dt} "
            f"(max {np.iinfo(dt).max + 1:,} ids); use token_dtype uint32 or auto"
        )
    return dt


class _HashingFile:
    def __init__(self, path: Path):
        self.f = open(path, "wb")
        self.h = hashlib.sha256()
        self.bytes = 0

    def write(self, arr: np.ndarray) -> None:
        b = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False))  # written and hashed in place
        self.f.write(b.data)
        self.h.update(b.data)
        self.bytes += b.nbytes

    def close(self) -> dict:
        self.f.close()
        return {"bytes": self.bytes, "sha256": self.h.hexdigest()}


@dataclass(kw_only=True)
class _OpenShard:
    """The shard being written: its name, its temporary folder, its counts so far and its files (per key)."""

    name: str
    tmp: Path
    files: dict[str, _HashingFile]
    offsets: dict[str, list[np.ndarray]]  # per key: 0, then each record's item ends
    ends: dict[str, int]  # per key: elements written
    tokens: int = 0
    ids: list[str] = field(default_factory=list)
    max_token_id: int = -1


@dataclass(kw_only=True)
class ShardCuts:
    """Where one batch's records of a split go, in order: a shard takes records until the next would take it past
    shard_tokens (records never straddle shards; a record larger than a shard gets one of its own). The one rule the
    in-process writer and the pack plan both follow."""

    shard_tokens: int
    tokens: int = 0  # in the open shard
    records: int = 0  # in the open shard

    def cuts(self, rec_tokens: np.ndarray) -> Iterator[tuple[int, int] | None]:
        """A chunk's records [start, end) for the open shard, in order; None: the open shard is complete."""
        cum_tok = np.concatenate([[0], np.cumsum(rec_tokens)])
        i, n = 0, len(rec_tokens)
        while i < n:
            room = self.shard_tokens - self.tokens
            # records [i, j) fit: cum_tok[j] - cum_tok[i] <= room
            j = int(np.searchsorted(cum_tok, cum_tok[i] + room, side="right")) - 1
            if j <= i:
                if self.records:
                    self.tokens = self.records = 0
                    yield None  # the open shard is complete
                    continue
                j = i + 1  # one record larger than a shard gets a shard of its own
            yield i, j
            self.records += j - i
            self.tokens += int(cum_tok[j] - cum_tok[i])
            i = j
            if self.tokens >= self.shard_tokens:
                self.tokens = self.records = 0
                yield None


class _ChunkSpans:
    """Where each record's items and elements start in a SplitChunk's flat arrays, per key."""

    def __init__(self, ch: SplitChunk, keys: Iterable[str]):
        self.chunk = ch
        self.items = {k: np.concatenate([[0], np.cumsum(ch.rec_items[k])]) for k in keys}
        self.elems = {k: np.concatenate([[0], np.cumsum(ch.item_lens[k])]) for k in keys}


class ShardWriter:
    """Writes records into `split_dir/shard-XXXXX/` (in `.tmp-shard-XXXXX/`, renamed when done): `add` cuts
    SplitChunks into shards itself (ShardCuts); a pack task `write`s the pieces of one planned shard."""

    def __init__(
        self,
        split_dir: Path,
        training_type: str,
        vocab_size: int,
        token_dtype: str | np.dtype,
        shard_tokens: int,
        first_index: int = 0,
        batch: str | None = None,
    ):
        self.dir = Path(split_dir)
        self.first_index, self.batch = first_index, batch
        self.vocab = vocab_size
        self.dtype = np.dtype(token_dtype)
        if self.dtype.name not in TOKEN_DTYPES:
            raise ConfigError(f"token dtype must be one of {TOKEN_DTYPES}, not {self.dtype}")
        if not dtype_fits(vocab_size, self.dtype):
            raise CapacityError(f"vocabulary of {vocab_size:,} tokens overflows {self.dtype}; refusing to write")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cuts = ShardCuts(shard_tokens=max(1, int(shard_tokens)))
        self.keys = {k: key_dtype(kind, self.dtype) for k, kind in KEYS[training_type].items()}
        self.shards: list[dict] = []
        self._open: _OpenShard | None = None

    def _start(self) -> _OpenShard:
        name = shard_folder_name(self.first_index + len(self.shards))
        tmp = self.dir / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self._open = _OpenShard(
            name=name,
            tmp=tmp,
            files={k: _HashingFile(tmp / data_file(k)) for k in self.keys},
            offsets={k: [np.zeros(1, dtype=np.int64)] for k in self.keys},
            ends={k: 0 for k in self.keys},
        )
        return self._open

    def _finish(self) -> None:
        sh = self._open
        assert sh is not None  # _start opened it
        files = {data_file(k): f.close() for k, f in sh.files.items()}
        meta = {k: key_meta(dt, np.concatenate(sh.offsets[k])) for k, dt in self.keys.items()}
        for fname, obj in ((SHARD_META_FILE, meta), (RECORD_IDS_FILE, sh.ids)):
            data = dumps_compact(obj)
            (sh.tmp / fname).write_bytes(data)
            files[fname] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        os.replace(sh.tmp, self.dir / sh.name)
        self.shards.append(
            shard_entry(
                sh.name,
                tokens=sh.tokens,
                records=len(sh.ids),
                max_token_id=sh.max_token_id,
                files=files,
                batch=self.batch,
            )
        )
        self._open = None

    def add(self, ch: SplitChunk) -> None:
        spans = _ChunkSpans(ch, self.keys)
        for cut in self.cuts.cuts(ch.rec_tokens):
            if cut is None:
                self._finish()
            else:
                self.write(spans, *cut)

    def write(self, spans: _ChunkSpans, i: int, j: int) -> None:
        """Records [i, j) of a chunk, appended to the open shard (opened if none is)."""
        sh = self._start() if self._open is None else self._open
        ch = spans.chunk
        for k in self.keys:
            a, b = spans.items[k][i], spans.items[k][j]
            ea, eb = spans.elems[k][a], spans.elems[k][b]
            arr = ch.data[k][ea:eb]
            if k in ALL_TOKEN_KEYS and arr.size:
                top = int(arr.max())  # one pass: the shard's max_token_id and the vocabulary check
                if top >= self.vocab:
                    check_ids(arr, self.vocab, str(self.dir))
                sh.max_token_id = max(sh.max_token_id, top)
            if self.keys[k] != arr.dtype:
                arr = arr.astype(self.keys[k])
            sh.files[k].write(arr)
            sh.offsets[k].append(sh.ends[k] + spans.elems[k][a + 1 : b + 1] - ea)
            sh.ends[k] += int(eb - ea)
        sh.ids.extend(ch.ids[i:j])
        sh.tokens += int(spans.chunk.rec_tokens[i:j].sum())

    def write_chunk(self, ch: SplitChunk) -> None:
        """Every record of a chunk, appended to the open shard (a shard re-packed without some records)."""
        self.write(_ChunkSpans(ch, self.keys), 0, ch.records)

    def close(self) -> list[dict]:
        if self._open is not None:
            self._finish()
        return self.shards

    def empty_shard(self) -> list[dict]:
        """One shard without records: a split with no records still gets it, so it loads."""
        self._start()
        self._finish()
        return self.shards

    def abort(self) -> None:
        if self._open is not None:
            for f in self._open.files.values():
                f.f.close()
            shutil.rmtree(self._open.tmp, ignore_errors=True)
            self._open = None


@dataclass(frozen=True, kw_only=True)
class Piece:
    """Records [start, end) of one split of an encode task's arrays (encode.save_splits' folder)."""

    folder: str
    start: int
    end: int


@dataclass(frozen=True, kw_only=True)
class PackTask:
    """One shard of a batch's split: its number and pieces, in order (a task's worth of ShardWriter.write)."""

    split_dir: str
    split: str
    index: int
    pieces: tuple[Piece, ...]
    training_type: str
    vocab_size: int
    token_dtype: str
    batch: str


def pack_shard(task: PackTask) -> dict:
    """Writes one planned shard from its pieces; returns its manifest entry."""
    writer = ShardWriter(
        Path(task.split_dir),
        task.training_type,
        task.vocab_size,
        task.token_dtype,
        shard_tokens=1,  # unused: the plan cut the shard, `write` only appends
        first_index=task.index,
        batch=task.batch,
    )
    try:
        for piece in task.pieces:  # consecutive tasks' arrays: one piece each
            ch = read_splits(piece.folder, only=task.split)[task.split]
            writer.write(_ChunkSpans(ch, writer.keys), piece.start, piece.end)
        return writer.close()[0]
    except BaseException:
        writer.abort()
        raise


class PackPlan:
    """The shards of one run's new batches, planned in the run process from each encode task's record token counts
    (ShardCuts per batch and split); numbered after the shards already in each split folder."""

    def __init__(self, bins_dir: Path, training_type: str, vocab_size: int, token_dtype: np.dtype, shard_tokens: int):
        self.bins_dir = Path(bins_dir)
        self.common = {"training_type": training_type, "vocab_size": vocab_size, "token_dtype": token_dtype.name}
        self.shard_tokens = shard_tokens
        self.next_index = {s: next_shard_index(self.bins_dir / s) for s in SPLITS}
        self.tasks: list[PackTask] = []
        self.batch = ""
        self._cuts: dict[str, ShardCuts] = {}
        self._pieces: dict[str, list[Piece]] = {}

    def start_batch(self, batch: str) -> None:
        self.batch = batch
        self._cuts = {s: ShardCuts(shard_tokens=self.shard_tokens) for s in SPLITS}
        self._pieces = {s: [] for s in SPLITS}

    def add(self, folder: str, splits: dict[str, SplitChunk]) -> None:
        """An encode task's records (its folder and the record token counts per split), in task order."""
        for s, ch in splits.items():
            for cut in self._cuts[s].cuts(ch.rec_tokens):
                if cut is None:
                    self._complete(s)
                else:
                    start, end = cut
                    self._pieces[s].append(Piece(folder=folder, start=start, end=end))

    def finish_batch(self) -> None:
        for s in SPLITS:
            if self._pieces[s]:
                self._complete(s)

    def _complete(self, split: str) -> None:
        self.tasks.append(
            PackTask(
                split_dir=str(self.bins_dir / split),
                split=split,
                index=self.next_index[split],
                pieces=tuple(self._pieces[split]),
                batch=self.batch,
                **self.common,
            )
        )
        self.next_index[split] += 1
        self._pieces[split] = []


def write_tokenizer_copy(split_dir: Path, tokenizer_bytes: bytes, sha256: str) -> None:
    """The immutable, content-named copy of the tokenizer a version is encoded with: a hard link to the other
    split's copy where that holds these bytes (one file on disk for both splits), else written."""
    path = Path(split_dir) / versioned_tokenizer_file(sha256)
    if path.exists():
        return
    for other in SPLITS:
        twin = path.parent.parent / other / path.name
        if twin != path and twin.is_file() and twin.read_bytes() == tokenizer_bytes:
            link_atomic(twin, path)
            return
    with atomic_file(path, "wb") as f:
        f.write(tokenizer_bytes)


def version_manifests(
    *,
    version: dict,
    training_type: str,
    vocab_size: int,
    token_dtype: np.dtype,
    tokenizer: dict,
    special: dict[str, int],
    shards: dict[str, list[dict]],
    supervised: dict[str, int],
) -> dict[str, dict]:
    """Each split's manifest of one version (`version`: its number, generation, batches, encoding settings)."""
    manifests = {}
    for s in SPLITS:
        tokens = sum(sh["tokens"] for sh in shards[s])
        manifests[s] = dataset_manifest(
            training_type=training_type,
            split=s,
            vocab_size=vocab_size,
            token_dtype=token_dtype,
            tokenizer=tokenizer,
            special_tokens=special,
            shards=shards[s],
            totals={
                "tokens": tokens,
                "records": sum(sh["records"] for sh in shards[s]),
                "supervised_tokens": supervised[s],
                "masked_tokens": tokens - supervised[s],
            },
            version=version,
        )
    return manifests


def write_rejected(bins_dir: Path, entries: Iterable[dict]) -> int:
    """`_rejected.json`: a JSON list of the records the training type cannot render; returns how many."""
    path = Path(bins_dir) / REJECTED_JSON
    count = 0
    with atomic_file(path) as f:
        f.write("[")
        for entry in entries:
            f.write(("\n" if count == 0 else ",\n") + json.dumps(entry, ensure_ascii=False))
            count += 1
        f.write("\n]\n" if count else "]\n")
    return count
