"""What every shard export does: open both splits through the loader and copy a key's stream to a flat file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tokenmill.errors import CorruptOutputError
from tokenmill_loader import Store, open_store
from tokenmill_loader.format import SPLITS

CHUNK_ITEMS = 1 << 24  # items read per step: 32 MiB of uint16 tokens in memory at a time, whatever the corpus size


def open_splits(bins_dir: str | os.PathLike) -> dict[str, Store]:
    """train and val of a tokenized_bins folder (its latest version), opened by tokenmill_loader."""
    return {split: open_store(Path(bins_dir) / split) for split in SPLITS}


def copy_key(store: Store, key: str, path: Path, dtype=None) -> int:
    """Writes the stream of `key` to `path` as headerless little-endian `dtype` (default: as stored); returns its
    bytes. A cast never loses ids: callers pick a dtype that holds the vocabulary."""
    total = store.num_items(key)
    out_dtype = np.dtype(dtype or store.dtypes[key]).newbyteorder("<")
    with open(path, "wb") as f:
        for begin in range(0, total, CHUNK_ITEMS):
            f.write(store.read(key, begin, min(total, begin + CHUNK_ITEMS)).astype(out_dtype, copy=False).data)
    return path.stat().st_size


def shard_bytes(store: Store) -> int:
    """Bytes of the files a split's dataset.json lists (token and mask .bin files, meta.json), the baseline an
    export's size is compared with."""
    return sum(f["bytes"] for shard in store.info["shards"] for f in shard["files"].values())


def token_count(store: Store) -> int:
    return int(store.info["totals"]["tokens"])


def dataset_version(stores: dict[str, Store]) -> int | None:
    """The tokenized_bins version an export read: both splits are published as one version (None for shards
    written before versions existed)."""
    versions = {split: store.version for split, store in stores.items()}
    if len(set(versions.values())) != 1:  # tokenize publishes both splits as one version, under the data root's lock
        where = ", ".join(f"{store.path} at version {store.version}" for store in stores.values())
        raise CorruptOutputError(f"tokenized_bins splits are at different versions: {where}")
    return versions["train"]


def size_stats(stores: dict[str, Store], export_bytes: int) -> dict:
    """Bytes per token of an export next to the shards it came from (both splits)."""
    tokens = sum(token_count(s) for s in stores.values())
    shards = sum(shard_bytes(s) for s in stores.values())
    return {
        "tokens": tokens,
        "bytes": export_bytes,
        "bytes_per_token": round(export_bytes / tokens, 3) if tokens else None,
        "shard_bytes_per_token": round(shards / tokens, 3) if tokens else None,
    }
