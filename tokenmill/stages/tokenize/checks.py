"""The check behind tokenized_bins' asset check: every shard file valid, the tokenizer the upstream one, and a sample
of records re-encoded gives the shards' tokens."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenmill.common.io import STATS_FILE, read_json
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill.stages.tokenize.verify import reencode_problems
from tokenmill_loader.format import SPLITS, TOKENIZER_FILE, DatasetError, manifest_path, sha256_file, validate_dataset


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
        assert dataset.max_token_id is not None  # scan=True sets it
        max_id = max(max_id, dataset.max_token_id)
        vocab = dataset.manifest.get("vocab_size", vocab)
        problems += _stale_tokenizer(dataset, version, upstream, upstream_sha)
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


def _stale_tokenizer(dataset, version: int | None, upstream: Path, upstream_sha: str | None) -> list[str]:
    """The problem of a split whose manifest names another tokenizer than the upstream one (none if it does not)."""
    recorded = (dataset.manifest.get("tokenizer") or {}).get("sha256")
    if recorded == upstream_sha:
        return []
    return [
        f"{manifest_path(dataset.folder, version)}: tokenizer sha256 {str(recorded)[:12]}… is not the "
        f"upstream {upstream} ({str(upstream_sha)[:12]}…): the shards are stale"
    ]
