"""Verifiers behind the asset checks: they read outputs and report a figure and the problems.

The record checks first read the figures the stage wrote with its shards (SHARDS_FILE): when every shard is still
byte for byte the one the stage wrote (size and CRC-32) and the figures show the property (distinct ids; kept
records whose exact-key digests, from the dedup index, are distinct), nothing is parsed. Otherwise (no figures, a
shard changed or added since, or figures that do not show the property) every record is read again, and that audit
finds and names the problems.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import (
    STATS_FILE,
    all_distinct,
    id_values,
    iter_jsonl,
    read_json,
    record_shards,
    shards_as_written,
)
from tokenmill.common.parallel import map_ordered
from tokenmill.stages.dedup.index import INDEX_FORMAT, SEGMENT_FILE
from tokenmill.stages.dedup.keys import dedup_keys, key_digest
from tokenmill.stages.dedup.layout import DOCS_DIR, KEYS_DIR, Chunk
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill.stages.tokenize.verify import reencode_problems
from tokenmill_loader.format import SPLITS, TOKENIZER_FILE, DatasetError, manifest_path, sha256_file, validate_dataset

MAX_PROBLEMS = 20  # problems listed in a check's metadata; the count is always complete


def validate_records(stage_dir: Path) -> dict:
    """Every line of every shard is a record
    {"id": str, "text": str, "meta": dict, "source": {"path", "line"|"index"}}, with an id no earlier line has:
    from the figures when they show it (the shards as written, every id distinct), else by audit_records."""
    figures = shards_as_written(stage_dir)
    if figures is not None and figures.get("unique_ids"):
        return {"records": sum(f["records"] for f in figures["shards"]), "problems": [], "audit": "figures"}
    return audit_records(stage_dir)


def audit_records(stage_dir: Path) -> dict:
    """validate_records by parsing every line. Shards are read in parallel (map_ordered); ids are compared across
    shards here, in shard order."""
    problems, records, ids = [], 0, set()
    shards = record_shards(stage_dir)
    for shard, lines in zip(shards, map_ordered(shard_record_ids, shards)):
        for n, problem, record_id in lines:
            records += 1
            if problem is not None:
                problems.append(f"{shard.name}:{n}: {problem}")
            elif record_id in ids:
                problems.append(f"{shard.name}:{n}: duplicate id {record_id}")
            else:
                ids.add(record_id)
    return {"records": records, "problems": problems, "audit": "records"}


def shard_record_ids(shard: Path) -> list[tuple[int, str | None, str | None]]:
    """(line number, what is wrong with the line or None, the record's id) for each line of one shard."""
    lines = []
    with open(shard, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                lines.append((n, f"not JSON ({e.msg})", None))
                continue
            except RecursionError:  # a reader lets no such record through; a check must not crash on one
                lines.append((n, "nested too deeply to parse", None))
                continue
            src = r.get("source") if isinstance(r, dict) else None
            if not (
                isinstance(r, dict)
                and isinstance(r.get("id"), str)
                and isinstance(r.get("text"), str)
                and isinstance(r.get("meta"), dict)
                and isinstance(src, dict)
                and "path" in src
                and ("line" in src or "index" in src)
            ):
                lines.append((n, "does not match the record schema", None))
            else:
                lines.append((n, None, r["id"]))
    return lines


@dataclass(frozen=True)
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
    ids, prefixes = kept
    records = sum(f["records"] for f in figures["shards"])
    if len(ids) != records or zlib.crc32(ids.tobytes()) != figures["ids_crc32"] or not all_distinct(prefixes):
        return None
    return records


def segment_kept(segment: Path, settings: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids as uint64, first 8 bytes of the key digest) of the records a dedup index segment keeps, in order: those
    it holds a key for (index.py). None when it is not there, or was built with other key settings or in another
    format."""
    if not (segment / SEGMENT_FILE).exists():
        return None
    manifest = read_json(segment / SEGMENT_FILE)
    built = manifest.get("settings", {})
    if manifest.get("format_version") != INDEX_FORMAT or any(
        built.get(k) != settings[k] for k in ("strip_symbols", "fold_chinese")
    ):
        return None
    ids, prefixes = [], []
    for c in manifest["chunks"]:
        chunk = Chunk(-1, c["name"], "", 0, 0, c["chunk"])

        def load(step: str, suffix: str, chunk: Chunk = chunk) -> np.ndarray:
            return np.load(chunk.step_file(segment, step, suffix))

        kept = np.diff(load(KEYS_DIR, ".key_offsets.npy")) > 0
        digits = load(DOCS_DIR, ".npy")["id"][kept]
        if digits.dtype != np.dtype("S16"):
            return None
        chunk_ids = id_values(np.frombuffer(digits.tobytes(), dtype=np.uint8).reshape(-1, 16))
        if chunk_ids is None:
            return None
        ids.append(chunk_ids)
        by_record = np.empty(len(kept), dtype=np.uint64)  # the digest files are sorted by digest
        by_record[load(KEYS_DIR, ".digest_ordinal.npy")] = load(KEYS_DIR, ".digest_prefix.npy")
        prefixes.append(by_record[kept])
    empty = [np.zeros(0, np.uint64)]
    return np.concatenate(ids or empty), np.concatenate(prefixes or empty)


def audit_exact_keys(stage_dir: Path, settings: dict) -> dict:
    """validate_exact_keys by re-deriving every record's key (shards in parallel, map_ordered), in shard order."""
    seen, problems, records = {}, [], 0
    shards = record_shards(stage_dir)
    tasks = [KeyDigestTask(shard, settings["strip_symbols"], settings["fold_chinese"]) for shard in shards]
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


def validate_token_shards(
    stage_dir: Path, records_dirs: Path | Sequence[Path], tokenizer_dir: Path, version: int | None = None
) -> dict:
    """tokenized_bins, each split's dataset.json (or the manifest of `version`, e.g. one not published yet): every
    shard file (sizes, SHA-256, offsets, masks aligned and 0/1, token ids < vocabulary:
    tokenmill_loader.format.validate_dataset), the tokenizer it names is the upstream one, and a sample of records
    (from `records_dirs`: the deduped folder, or every batch folder) re-encoded with it gives the shards' tokens."""
    problems: list[str] = []
    tokens, max_id, vocab = 0, -1, None
    stats_path = Path(stage_dir) / STATS_FILE
    # the settings the shards were encoded with: the version's manifest records them (older folders: _stats.json)
    stats_settings = read_json(stats_path)["settings"] if stats_path.exists() else None
    upstream = Path(tokenizer_dir) / TOKENIZER_FILE
    upstream_sha = sha256_file(upstream) if upstream.exists() else None
    reencode = []
    for split in SPLITS:
        try:
            dataset = validate_dataset(
                Path(stage_dir) / split, checksums=True, scan=True, collect=True, version=version
            )
        except DatasetError as e:
            problems.append(str(e))
            continue
        encoding = dataset.manifest.get("encoding") or stats_settings
        settings = ShardSettings(**encoding) if encoding is not None else None
        if settings is None:
            problems.append(f"{stats_path}: missing (the settings the shards were built with)")
        problems += dataset.problems
        tokens += dataset.tokens
        max_id = max(max_id, dataset.max_token_id)
        vocab = dataset.manifest.get("vocab_size", vocab)
        recorded = (dataset.manifest.get("tokenizer") or {}).get("sha256")
        if recorded != upstream_sha:
            problems.append(
                f"{manifest_path(dataset.folder, version)}: tokenizer sha256 {str(recorded)[:12]}… is not the "
                f"upstream {upstream} ({str(upstream_sha)[:12]}…): the shards are stale"
            )
        if settings is not None and not dataset.problems:
            reencode.append((dataset, settings))
    reencoded, found = reencode_problems(reencode, records_dirs)
    problems += found
    return {
        "tokens": tokens,
        "max_token_id": max_id,
        "vocab_size": vocab,
        "reencoded_records": reencoded,
        "problems": problems,
    }
