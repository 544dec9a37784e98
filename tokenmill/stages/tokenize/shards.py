"""Writing: encoded records -> the shard folders and dataset.json of each split (docs/format.md).

Every name, key, kind and manifest field comes from `tokenmill_loader.format`, the module the loader reads with.
The parent packs the per-task chunks, in task order, into shards, so the output is byte-identical for any worker
count or task cut. Each shard is written in `.tmp-shard-XXXXX/` and renamed when complete; each split is built
in a staging folder, gets its tokenizer.json and dataset.json last, and is swapped into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_write_json
from tokenmill.errors import CapacityError, ConfigError
from tokenmill.stages.tokenize.encode import SplitChunk, check_ids
from tokenmill_loader.format import (
    ALL_TOKEN_KEYS,
    DATASET_FILE,
    KEYS,
    RECORD_IDS_FILE,
    SHARD_META_FILE,
    SPLITS,
    TOKEN_DTYPES,
    TOKENIZER_FILE,
    auto_token_dtype,
    data_file,
    dataset_manifest,
    dtype_fits,
    dumps_compact,
    key_dtype,
    key_meta,
    shard_entry,
    shard_name,
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
        b = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        self.f.write(b)
        self.h.update(b)
        self.bytes += len(b)

    def close(self) -> dict:
        self.f.close()
        return {"bytes": self.bytes, "sha256": self.h.hexdigest()}


class ShardWriter:
    """Packs SplitChunks into `split_dir/shard-XXXXX/` (written in `.tmp-shard-XXXXX/`, renamed when done)."""

    def __init__(
        self, split_dir: Path, training_type: str, vocab_size: int, token_dtype: str | np.dtype, shard_tokens: int
    ):
        self.dir = Path(split_dir)
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
        self._open = None

    def _start(self):
        name = shard_name(len(self.shards))
        tmp = self.dir / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self._open = {
            "name": name,
            "tmp": tmp,
            "tokens": 0,
            "ids": [],
            "max_token_id": -1,
            "files": {k: _HashingFile(tmp / data_file(k)) for k in self.keys},
            "offsets": {k: [np.zeros(1, dtype=np.int64)] for k in self.keys},
            "ends": {k: 0 for k in self.keys},
        }

    def _finish(self):
        sh = self._open
        files = {data_file(k): f.close() for k, f in sh["files"].items()}
        meta = {k: key_meta(dt, np.concatenate(sh["offsets"][k])) for k, dt in self.keys.items()}
        for fname, obj in ((SHARD_META_FILE, meta), (RECORD_IDS_FILE, sh["ids"])):
            data = dumps_compact(obj)
            (sh["tmp"] / fname).write_bytes(data)
            files[fname] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for fname, info in files.items():
            self.bytes_per_key[fname] = self.bytes_per_key.get(fname, 0) + info["bytes"]
        os.replace(sh["tmp"], self.dir / sh["name"])
        self.shards.append(
            shard_entry(
                sh["name"], tokens=sh["tokens"], records=len(sh["ids"]), max_token_id=sh["max_token_id"], files=files
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
            if self._open is None:
                self._start()
            sh = self._open
            room = self.shard_tokens - sh["tokens"]
            # records [i, j) fit: cum_tok[j] - cum_tok[i] <= room
            j = int(np.searchsorted(cum_tok, cum_tok[i] + room, side="right")) - 1
            if j <= i:
                if sh["ids"]:
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
                    sh["max_token_id"] = max(sh["max_token_id"], int(arr.max()))
                sh["files"][k].write(arr)
                sh["offsets"][k].append(sh["ends"][k] + cum_elems[k][a + 1 : b + 1] - ea)
                sh["ends"][k] += int(eb - ea)
            sh["ids"].extend(ch.ids[i:j])
            sh["tokens"] += int(cum_tok[j] - cum_tok[i])
            i = j
            if sh["tokens"] >= self.shard_tokens:
                self._finish()

    def close(self) -> list[dict]:
        if self._open is not None:
            self._finish()
        if not self.shards:  # an empty split still gets one (empty) shard, so it loads
            self._start()
            self._finish()
        return self.shards

    def abort(self) -> None:
        if self._open is not None:
            for f in self._open["files"].values():
                f.f.close()
            shutil.rmtree(self._open["tmp"], ignore_errors=True)
            self._open = None


class SplitWriters:
    """One ShardWriter per split, each in a staging folder of out_dir until `publish` swaps them in."""

    def __init__(self, out_dir: Path, training_type: str, vocab_size: int, token_dtype: np.dtype, shard_tokens: int):
        self.out_dir = Path(out_dir)
        self.training_type, self.vocab_size, self.token_dtype = training_type, vocab_size, token_dtype
        self.staging = {s: self.out_dir / f".tmp-{s}" for s in SPLITS}
        for d in self.staging.values():
            shutil.rmtree(d, ignore_errors=True)
        self.writers = {
            s: ShardWriter(self.staging[s], training_type, vocab_size, token_dtype, shard_tokens) for s in SPLITS
        }

    def add(self, splits: dict[str, SplitChunk]) -> None:
        for s, ch in splits.items():
            self.writers[s].add(ch)

    def bytes_per_key(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.writers.values():
            for k, v in w.bytes_per_key.items():
                out[k] = out.get(k, 0) + v
        return out

    def publish(
        self, tokenizer_bytes: bytes, tokenizer_sha256: str, special: dict[str, int], supervised: dict[str, int]
    ) -> dict[str, dict]:
        """Closes every split, writes its tokenizer.json and dataset.json (last), swaps it into place."""
        manifests = {}
        for s in SPLITS:
            shards = self.writers[s].close()
            (self.staging[s] / TOKENIZER_FILE).write_bytes(tokenizer_bytes)
            tokens = sum(sh["tokens"] for sh in shards)
            manifests[s] = dataset_manifest(
                training_type=self.training_type,
                split=s,
                vocab_size=self.vocab_size,
                token_dtype=self.token_dtype,
                tokenizer={"file": TOKENIZER_FILE, "sha256": tokenizer_sha256, "vocab_size": self.vocab_size},
                special_tokens=special,
                shards=shards,
                totals={
                    "tokens": tokens,
                    "records": sum(sh["records"] for sh in shards),
                    "supervised_tokens": supervised[s],
                    "masked_tokens": tokens - supervised[s],
                },
            )
            atomic_write_json(self.staging[s] / DATASET_FILE, manifests[s])
        for s in SPLITS:
            final = self.out_dir / s
            if final.exists():
                shutil.rmtree(final)
            os.replace(self.staging[s], final)
        return manifests

    def abort(self) -> None:
        for s in SPLITS:
            self.writers[s].abort()
            shutil.rmtree(self.staging[s], ignore_errors=True)


class RejectedWriter:
    """`_rejected.json`: a JSON list of the records the training type cannot render, streamed as tasks finish."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / REJECTED_JSON
        self.tmp = Path(out_dir) / f".{REJECTED_JSON}.tmp"
        self.count = 0
        self.f = open(self.tmp, "w", encoding="utf-8")
        self.f.write("[")

    def extend(self, entries: list[dict]) -> None:
        for entry in entries:
            self.f.write(("\n" if self.count == 0 else ",\n") + json.dumps(entry, ensure_ascii=False))
            self.count += 1

    def close(self) -> None:
        self.f.write("\n]\n" if self.count else "]\n")
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)
        self.path.unlink(missing_ok=True)
