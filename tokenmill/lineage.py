"""Record lineage beyond the asset graph: token position -> record id -> source file and line -> folded duplicates."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenmill.common.io import REMOVED_FILE, iter_jsonl, record_shards
from tokenmill.explain import find_in_shards
from tokenmill_loader import open_store
from tokenmill_loader.format import GROUP_KEY, RESPONSE_KEYS, TOKEN_KEYS, read_record_ids


def locate_token(
    data_root: Path, position: int, split: str = "train", key: str | None = None, version: int | None = None
) -> dict:
    """Where token `position` of `split` came from, in the dataset version a training run read (default: the
    latest published).

    The loader's Store gives each shard's token count and offsets; the shard's record ids name the record, then
    found in deduped_jsonl with the records the dedup stage folded into it (removed.jsonl).
    """
    data_root = Path(data_root)
    store = open_store(data_root / "tokenized_bins" / split, version=version)
    key = key or TOKEN_KEYS[store.training_type][0]
    total = store.num_items(key)
    if not 0 <= position < total:
        raise IndexError(f"token position {position} is outside {split}/{key} (0..{total - 1})")
    ends = np.cumsum([part.lengths.get(key, 0) for part in store.parts])
    shard = int(np.searchsorted(ends, position, side="right"))
    part = store.parts[shard]
    local = position - (int(ends[shard - 1]) if shard else 0)
    offsets = part.offsets[key]
    item = int(np.searchsorted(offsets, local, side="right")) - 1
    record_index = _record_of_item(part.offsets, key, item)
    record_id = read_record_ids(part.folder)[record_index]
    record = find_record(data_root / "deduped_jsonl", record_id)
    return {
        "split": split,
        "dataset_version": store.version,
        "key": key,
        "position": position,
        "shard": part.name,
        "record_in_shard": record_index,
        "offset_in_record": int(local - offsets[item]),
        "record_id": record_id,
        "source": record["source"] if record else None,
        "meta": record["meta"] if record else None,
        "text_preview": record["text"][:200] if record else None,
        "folded_duplicates": folded_into(data_root / "deduped_jsonl", record_id),
    }


def _record_of_item(shard_offsets: dict[str, np.ndarray], key: str, item: int) -> int:
    """Item index -> record index: grpo responses are grouped by record through rewards' offsets."""
    if key in RESPONSE_KEYS and GROUP_KEY in shard_offsets:
        return int(np.searchsorted(shard_offsets[GROUP_KEY], item, side="right")) - 1
    return item


def find_record(stage_dir: Path, record_id: str) -> dict | None:
    return find_in_shards(record_shards(stage_dir), record_id)[1]


def folded_into(deduped_dir: Path, record_id: str) -> list[dict]:
    removed = Path(deduped_dir) / REMOVED_FILE
    if not removed.exists():
        return []
    return [r for r in iter_jsonl(removed) if r.get("duplicate_of") == record_id]
