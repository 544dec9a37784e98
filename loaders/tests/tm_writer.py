"""Tiny writer of the docs/format.md token-shard format, for the loader's own tests and benchmarks.

It stays free of tokenmill (the loader package is tested alone), and takes every name, kind, dtype and
manifest field from tokenmill_loader.format, the module tokenmill's writer uses too, so the two cannot drift.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np

from tokenmill_loader.format import (
    DATASET_FILE,
    KIND_OF,
    RECORD_IDS_FILE,
    RESPONSE_KEYS,
    SHARD_META_FILE,
    TOKEN_KEYS,
    TOKENIZER_FILE,
    data_file,
    dataset_manifest,
    dumps_compact,
    key_dtype,
    key_meta,
    shard_entry,
    shard_folder_name,
)


def _file_entry(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_shard(folder: Path, records: list[dict], training_type: str, token_dtype: str = "uint16") -> dict:
    """Write one shard folder; returns its dataset.json entry and its keys."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = list(records[0]) if records else list(TOKEN_KEYS[training_type])
    meta = {}
    for k in keys:
        dt = key_dtype(KIND_OF[k], token_dtype)
        items = [item for r in records for item in r[k]] if k in RESPONSE_KEYS else [r[k] for r in records]
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in items], dtype=np.int64)])
        flat = np.asarray([v for x in items for v in x], dtype=dt)
        flat.astype(dt.newbyteorder("<")).tofile(folder / data_file(k))
        meta[k] = key_meta(dt, offsets)
    (folder / SHARD_META_FILE).write_bytes(dumps_compact(meta))
    (folder / RECORD_IDS_FILE).write_bytes(dumps_compact([f"{i:016x}" for i in range(len(records))]))
    files = {name: _file_entry(folder / name) for name in [data_file(k) for k in keys] + [SHARD_META_FILE]}
    tokens = sum(meta[k]["shape"][0] for k in TOKEN_KEYS[training_type] if k in meta)
    top = max(
        (
            max(x, default=-1)
            for r in records
            for k in TOKEN_KEYS[training_type]
            if k in r
            for x in (r[k] if k in RESPONSE_KEYS else [r[k]])
        ),
        default=-1,
    )
    return shard_entry(folder.name, tokens=tokens, records=len(records), max_token_id=top, files=files), keys


def write_dataset(
    root,
    records: list[dict],
    training_type: str = "seq",
    shard_records: int | None = None,
    token_dtype: str = "uint16",
    vocab_size: int = 1000,
    tokenizer_file: str | None = None,
) -> Path:
    """Write records (dicts of token lists, format.md key names) as a split folder with dataset.json."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    n = shard_records or max(1, len(records))
    chunks = [records[i : i + n] for i in range(0, len(records), n)] or [[]]
    shards, keys = [], []
    for si, chunk in enumerate(chunks):
        entry, keys = write_shard(root / shard_folder_name(si), chunk, training_type, token_dtype)
        shards.append(entry)
    tokenizer = None
    if tokenizer_file:
        shutil.copy(tokenizer_file, root / TOKENIZER_FILE)
        tokenizer = {
            "file": TOKENIZER_FILE,
            "sha256": _file_entry(root / TOKENIZER_FILE)["sha256"],
            "vocab_size": vocab_size,
        }
    info = dataset_manifest(
        training_type=training_type,
        split="train",
        vocab_size=vocab_size,
        token_dtype=token_dtype,
        special_tokens={"<s>": 0, "</s>": 1, "<pad>": 2},
        tokenizer=tokenizer,
        keys=keys,
        shards=shards,
        totals={"tokens": sum(s["tokens"] for s in shards), "records": sum(s["records"] for s in shards)},
    )
    (root / DATASET_FILE).write_bytes(dumps_compact(info))
    return root


def random_docs(
    n: int, seed: int = 0, min_len: int = 3, max_len: int = 40, vocab: int = 1000, masked: bool = False
) -> list[dict]:
    """n random documents (seq), or sft-like ones with a masked prefix when masked=True."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        L = int(rng.integers(min_len, max_len + 1))
        seq = rng.integers(3, vocab, size=L).tolist()
        seq[0] = 0  # <s>
        rec = {"sequence": seq}
        if masked:
            p = int(rng.integers(0, L))
            rec["loss_mask"] = [0] * p + [1] * (L - p)
        out.append(rec)
    return out
