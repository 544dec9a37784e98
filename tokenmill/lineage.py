"""Record lineage beyond the asset graph: token position -> record id -> source file and line -> folded duplicates."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenmill.common.io import REMOVED_FILE, iter_jsonl, read_json, record_shards
from tokenmill.explain import find_in_shards


def locate_token(data_root: Path, position: int, split: str = "train", key: str | None = None) -> dict:
    """Where token `position` of `split` came from.

    Walks dataset.json (shard token counts) -> the shard's meta.json offsets -> record_ids.json, then finds the
    record in deduped_jsonl and the records the dedup stage folded into it (removed.jsonl).
    """
    data_root = Path(data_root)
    folder = data_root / "tokenized_bins" / split
    manifest = read_json(folder / "dataset.json")
    key = key or next(k for k, v in manifest["keys"].items() if v.get("kind") == "tokens")
    shard_tokens = []
    for shard in manifest["shards"]:
        meta = read_json(folder / shard["name"] / "meta.json")
        shard_tokens.append(int(meta[key]["shape"][0]))
    ends = np.cumsum(shard_tokens)
    if not 0 <= position < (int(ends[-1]) if len(ends) else 0):
        raise IndexError(
            f"token position {position} is outside {split}/{key} (0..{int(ends[-1]) - 1 if len(ends) else -1})"
        )
    shard_idx = int(np.searchsorted(ends, position, side="right"))
    local = position - (int(ends[shard_idx - 1]) if shard_idx else 0)
    shard_dir = folder / manifest["shards"][shard_idx]["name"]
    offsets = np.asarray(read_json(shard_dir / "meta.json")[key]["offsets"], dtype=np.int64)
    item = int(np.searchsorted(offsets, local, side="right")) - 1
    record_ids = read_json(shard_dir / "record_ids.json")
    record_index = _record_of_item(shard_dir, key, item)
    record_id = record_ids[record_index]
    record = find_record(data_root / "deduped_jsonl", record_id)
    return {
        "split": split,
        "key": key,
        "position": position,
        "shard": shard_dir.name,
        "record_in_shard": record_index,
        "offset_in_record": int(local - offsets[item]),
        "record_id": record_id,
        "source": record["source"] if record else None,
        "meta": record["meta"] if record else None,
        "text_preview": record["text"][:200] if record else None,
        "folded_duplicates": folded_into(data_root / "deduped_jsonl", record_id),
    }


def _record_of_item(shard_dir: Path, key: str, item: int) -> int:
    """Item index -> record index: grpo responses are grouped by record through rewards' offsets."""
    if key in ("responses", "masks"):
        group = np.asarray(read_json(shard_dir / "meta.json")["rewards"]["offsets"], dtype=np.int64)
        return int(np.searchsorted(group, item, side="right")) - 1
    return item


def find_record(stage_dir: Path, record_id: str) -> dict | None:
    return find_in_shards(record_shards(stage_dir), record_id)[1]


def folded_into(deduped_dir: Path, record_id: str) -> list[dict]:
    removed = Path(deduped_dir) / REMOVED_FILE
    if not removed.exists():
        return []
    return [r for r in iter_jsonl(removed) if r.get("duplicate_of") == record_id]
