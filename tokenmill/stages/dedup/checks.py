"""The check behind deduped_jsonl's exact-duplicate asset check: no two kept records share an exact dedup key, from
the figures the stage wrote when they show it, else by re-deriving every key."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import DistinctValues, id_values, iter_jsonl, read_json, record_shards, shards_as_written
from tokenmill.common.parallel import map_ordered
from tokenmill.common.text_keys import dedup_keys
from tokenmill.stages.dedup.index import READABLE_FORMATS, SEGMENT_FILE
from tokenmill.stages.dedup.keys import key_digest
from tokenmill.stages.dedup.layout import DOCS_DIR, KEYS_DIR, Chunk


@dataclass(frozen=True, kw_only=True)
class KeyDigestTask:
    shard: Path
    strip_symbols: bool
    fold_chinese: bool


def shard_key_digests(task: KeyDigestTask) -> list[tuple[str, bytes | None]]:
    """(id, exact dedup key digest, None for an empty key) of each record of one shard, in order."""
    batch = list(iter_jsonl(task.shard))
    keys = dedup_keys([r["text"] for r in batch], task.strip_symbols, task.fold_chinese)
    return [(r["id"], key_digest(key) if key else None) for r, key in zip(batch, keys)]


def validate_exact_keys(stage_dir: Path, settings: dict, index_dir: Path) -> dict:
    """No two records of the shards share an exact dedup key (`settings`: the dedup report's strip_symbols and
    fold_chinese): from the figures when they show it (kept_by_index), else by audit_exact_keys."""
    records = kept_by_index(stage_dir, settings, index_dir)
    if records is not None:
        return {"records": records, "problems": [], "audit": "figures"}
    return audit_exact_keys(stage_dir, settings)


def kept_by_index(stage_dir: Path, settings: dict, index_dir: Path) -> int | None:
    """The records of a deduplicated batch folder when the figures show no two share an exact key: its shards are
    as written, their ids (the CRC-32 of them, in order) are those of the records the batch's dedup index segment
    `index_dir` keeps, and the key digests the segment holds for those (from the same keys, by dedup_keys and
    key_digest) differ in their first 8 bytes. None when one of these does not hold."""
    figures = shards_as_written(stage_dir)
    if figures is None or figures.get("ids_crc32") is None:
        return None
    kept = segment_kept(Path(index_dir), settings)
    if kept is None:
        return None
    count, ids_crc32, distinct = kept
    records = sum(f["records"] for f in figures["shards"])
    if count != records or ids_crc32 != figures["ids_crc32"] or not distinct:
        return None
    return records


def segment_kept(segment: Path, settings: dict) -> tuple[int, int, bool] | None:
    """(records, CRC-32 of their ids as uint64, whether the first 8 bytes of their key digests all differ) of the
    records a dedup index segment keeps, in order: those it holds a key for (index.py); read chunk by chunk, the ids
    folded into the CRC and the prefixes into a DistinctValues (bounded memory). None when it is not there, or was
    built with other key settings or in another format."""
    if not (segment / SEGMENT_FILE).exists():
        return None
    manifest = read_json(segment / SEGMENT_FILE)
    built = manifest.get("settings", {})
    if manifest.get("format_version") not in READABLE_FORMATS or any(
        built.get(k) != settings[k] for k in ("strip_symbols", "fold_chinese")
    ):
        return None
    records, ids_crc32, prefixes = 0, 0, DistinctValues()
    for c in manifest["chunks"]:
        chunk = Chunk.of_segment(c)

        def load(step: str, suffix: str, chunk: Chunk = chunk) -> np.ndarray:
            return np.load(chunk.step_file(segment, step, suffix))

        kept = np.diff(load(KEYS_DIR, ".key_offsets.npy")) > 0
        digits = load(DOCS_DIR, ".npy")["id"][kept]
        if digits.dtype != np.dtype("S16"):
            return None
        chunk_ids = id_values(np.frombuffer(digits.tobytes(), dtype=np.uint8).reshape(-1, 16))
        if chunk_ids is None:
            return None
        records += len(chunk_ids)
        ids_crc32 = zlib.crc32(chunk_ids.tobytes(), ids_crc32)
        by_record = np.empty(len(kept), dtype=np.uint64)  # the digest files are sorted by digest
        by_record[load(KEYS_DIR, ".digest_ordinal.npy")] = load(KEYS_DIR, ".digest_prefix.npy")
        prefixes.add(by_record[kept])
    return records, ids_crc32, prefixes.all_distinct()


def audit_exact_keys(stage_dir: Path, settings: dict) -> dict:
    """validate_exact_keys by re-deriving every record's key (shards in parallel, map_ordered), in shard order."""
    seen: dict[bytes, str] = {}
    problems: list[str] = []
    records = 0
    shards = record_shards(stage_dir)
    tasks = [
        KeyDigestTask(shard=shard, strip_symbols=settings["strip_symbols"], fold_chinese=settings["fold_chinese"])
        for shard in shards
    ]
    for shard, digests in zip(shards, map_ordered(shard_key_digests, tasks)):
        records += len(digests)
        for record_id, digest in digests:
            if digest is None:
                continue  # nothing to compare: the report counts empty keys
            if digest in seen:
                problems.append(f"{record_id} duplicates {seen[digest]} ({shard.name})")
            else:
                seen[digest] = record_id
    return {"records": records, "problems": problems, "audit": "records"}
