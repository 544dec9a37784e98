"""Independent verifiers behind the asset checks: they re-read outputs and report a figure and the problems."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenmill.common.io import STATS_FILE, iter_jsonl, read_json, record_shards
from tokenmill.common.parallel import map_ordered
from tokenmill.stages.dedup.keys import dedup_keys, key_digest
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill.stages.tokenize.verify import reencode_problems
from tokenmill_loader.format import SPLITS, TOKENIZER_FILE, DatasetError, manifest_path, sha256_file, validate_dataset

MAX_PROBLEMS = 20  # problems listed in a check's metadata; the count is always complete


def validate_records(stage_dir: Path) -> dict:
    """Every line of every shard is a record
    {"id": str, "text": str, "meta": dict, "source": {"path", "line"|"index"}}, with an id no earlier line has.
    Shards are read in parallel (map_ordered); ids are compared across shards here, in shard order."""
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
    return {"records": records, "problems": problems}


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


def validate_token_shards(
    stage_dir: Path, records_dirs: Path | Sequence[Path], tokenizer_dir: Path, version: int | None = None
) -> dict:
    """tokenized_bins, each split's dataset.json (or the manifest of `version`, e.g. one not published yet): every
    shard file (sizes, SHA-256, offsets, masks aligned and 0/1, token ids < vocabulary:
    tokenmill_loader.format.validate_dataset), the tokenizer it names is the upstream one, and a sample of records
    (from `records_dirs`: the deduped folder, or every batch folder) re-encoded with it gives the shards' tokens."""
    problems: list[str] = []
    tokens, max_id, vocab, reencoded = 0, -1, None, 0
    stats_path = Path(stage_dir) / STATS_FILE
    # the settings the shards were encoded with: the version's manifest records them (older folders: _stats.json)
    stats_settings = read_json(stats_path)["settings"] if stats_path.exists() else None
    upstream = Path(tokenizer_dir) / TOKENIZER_FILE
    upstream_sha = sha256_file(upstream) if upstream.exists() else None
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
            checked, found = reencode_problems(dataset, records_dirs, settings)
            reencoded += checked
            problems += found
    return {
        "tokens": tokens,
        "max_token_id": max_id,
        "vocab_size": vocab,
        "reencoded_records": reencoded,
        "problems": problems,
    }
