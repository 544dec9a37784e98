"""Writing: encoded records -> the shard folders and dataset.json of each split (docs/format.md).

Every name, key, kind and manifest field comes from `tokenmill_loader.format`, the module the loader reads with.
The parent packs the per-task chunks, in task order, into shards, so the output is byte-identical for any worker
count or task cut. Each shard is written in `.tmp-shard-XXXXX/` and renamed when complete, directly in its split
folder; a shard never holds two input batches. Nothing is published until a version manifest names the shards
(versions.py publishes it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_file
from tokenmill.errors import CapacityError, ConfigError
from tokenmill.stages.tokenize.encode import SplitChunk, check_ids
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


@dataclass
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


class ShardWriter:
    """Packs SplitChunks into `split_dir/shard-XXXXX/` (written in `.tmp-shard-XXXXX/`, renamed when done)."""

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
        self.shard_tokens = max(1, int(shard_tokens))
        self.keys = {k: key_dtype(kind, self.dtype) for k, kind in KEYS[training_type].items()}
        self.shards: list[dict] = []
        self.bytes_per_key: dict[str, int] = {}
        self._open: _OpenShard | None = None

    def _start(self) -> _OpenShard:
        name = shard_folder_name(self.first_index + len(self.shards))
        tmp = self.dir / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self._open = _OpenShard(
            name,
            tmp,
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
        for fname, info in files.items():
            self.bytes_per_key[fname] = self.bytes_per_key.get(fname, 0) + info["bytes"]
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
        for k in ALL_TOKEN_KEYS:
            if k in ch.data:
                check_ids(ch.data[k], self.vocab, str(self.dir))
        cum_tok = np.concatenate([[0], np.cumsum(ch.rec_tokens)])
        cum_items = {k: np.concatenate([[0], np.cumsum(ch.rec_items[k])]) for k in self.keys}
        cum_elems = {k: np.concatenate([[0], np.cumsum(ch.item_lens[k])]) for k in self.keys}
        i, n = 0, ch.records
        while i < n:
            sh = self._start() if self._open is None else self._open
            room = self.shard_tokens - sh.tokens
            # records [i, j) fit: cum_tok[j] - cum_tok[i] <= room
            j = int(np.searchsorted(cum_tok, cum_tok[i] + room, side="right")) - 1
            if j <= i:
                if sh.ids:
                    self._finish()
                    continue
                j = i + 1  # one record larger than a shard gets a shard of its own
            for k in self.keys:
                a, b = cum_items[k][i], cum_items[k][j]
                ea, eb = cum_elems[k][a], cum_elems[k][b]
                arr = ch.data[k][ea:eb]
                if self.keys[k] != arr.dtype:
                    arr = arr.astype(self.keys[k])
                if k in ALL_TOKEN_KEYS and arr.size:
                    sh.max_token_id = max(sh.max_token_id, int(arr.max()))
                sh.files[k].write(arr)
                sh.offsets[k].append(sh.ends[k] + cum_elems[k][a + 1 : b + 1] - ea)
                sh.ends[k] += int(eb - ea)
            sh.ids.extend(ch.ids[i:j])
            sh.tokens += int(cum_tok[j] - cum_tok[i])
            i = j
            if sh.tokens >= self.shard_tokens:
                self._finish()

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


class SplitWriters:
    """One ShardWriter per split for one input batch, writing straight into the split folders of bins_dir: shard
    numbers continue after the shards already there; nothing is published until a version manifest names them."""

    def __init__(
        self, bins_dir: Path, batch: str, training_type: str, vocab_size: int, token_dtype: np.dtype, shard_tokens: int
    ):
        self.writers = {
            s: ShardWriter(
                Path(bins_dir) / s,
                training_type,
                vocab_size,
                token_dtype,
                shard_tokens,
                first_index=next_shard_index(Path(bins_dir) / s),
                batch=batch,
            )
            for s in SPLITS
        }

    def add(self, splits: dict[str, SplitChunk]) -> None:
        for s, ch in splits.items():
            self.writers[s].add(ch)

    def close(self) -> dict[str, list[dict]]:
        return {s: w.close() for s, w in self.writers.items()}

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


def write_tokenizer_copy(split_dir: Path, tokenizer_bytes: bytes, sha256: str) -> None:
    """The immutable, content-named copy of the tokenizer a version is encoded with."""
    path = Path(split_dir) / versioned_tokenizer_file(sha256)
    if not path.exists():
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
