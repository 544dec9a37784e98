"""Checking shards against the records they came from: a sample of a split's records, rendered and encoded again
with the tokenizer its dataset.json names, must give exactly the arrays in the shards. Shards encoded by another
tokenizer (or by two, when tokenizer.json changed during a run) fail it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tokenmill.common.io import record_shards
from tokenmill.errors import TokenmillError
from tokenmill.stages.tokenize.encode import SplitChunk, assemble, encoder
from tokenmill.stages.tokenize.render import RENDERERS, Segments
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill.stages.tokenize.tokenizer import TokenizerPin
from tokenmill.stages.tokenize.train import line_id, parse_record
from tokenmill_loader.format import GROUP_KEY, KEYS, RESPONSE_KEYS, TOKENIZER_FILE, Dataset, read_record_ids

SAMPLE_RECORDS = 32  # per split, evenly spread over its records


def find_records(records_dirs: Path | Sequence[Path], ids: set[str]) -> dict[str, dict]:
    """The records with these ids in a folder of part files or several (lines are matched on their id head; only
    those are parsed)."""
    found: dict[str, dict] = {}
    dirs = [records_dirs] if isinstance(records_dirs, (str, Path)) else records_dirs
    for part in (p for d in dirs for p in record_shards(d)):
        with open(part, "rb") as f:
            for lineno, line in enumerate(f, 1):
                rid = line_id(line)
                if rid is None and line.strip():
                    rid = parse_record(line, part, lineno).get("id")
                if rid in ids and rid not in found:
                    found[rid] = parse_record(line, part, lineno)
        if len(found) == len(ids):
            break
    return found


def _sample(dataset: Dataset, batches: set[str] | None) -> list[tuple[int, int, str]]:
    """(shard index, record in shard, record id) of up to SAMPLE_RECORDS records spread over the split, or over the
    shards of `batches` only (the batches a version adds: earlier shards were checked when they were published, and
    their checksums still are)."""
    entries = dataset.manifest.get("shards", [])
    where = [
        (si, j, rid)
        for si, shard in enumerate(dataset.shards)
        if batches is None or entries[si].get("batch") in batches
        for j, rid in enumerate(read_record_ids(shard.folder))
    ]
    if not where:
        return []
    picks = np.unique(np.linspace(0, len(where) - 1, min(SAMPLE_RECORDS, len(where))).astype(np.int64))
    return [where[i] for i in picks]


def _record_slice(items_per_record: np.ndarray, item_lens: np.ndarray, record: int) -> tuple[int, int]:
    first = int(items_per_record[:record].sum())
    return int(item_lens[:first].sum()), int(item_lens[: first + int(items_per_record[record])].sum())


def _shard_record(dataset: Dataset, shard_index: int, record: int, key: str) -> np.ndarray:
    shard = dataset.shards[shard_index]
    items = (
        shard.keys[GROUP_KEY].offsets[record : record + 2] if key in RESPONSE_KEYS else np.array([record, record + 1])
    )
    spec = shard.keys[key]
    start, end = int(spec.offsets[items[0]]), int(spec.offsets[items[1]])
    data = (
        np.memmap(shard.path(key), dtype=spec.dtype.newbyteorder("<"), mode="r", shape=(spec.length,))
        if spec.length
        else np.empty(0, spec.dtype)
    )
    return np.asarray(data[start:end])


def reencode_problems(
    dataset: Dataset, records_dir: Path | Sequence[Path], settings: ShardSettings
) -> tuple[int, list[str]]:
    """(records re-encoded, problems) for a split validated by tokenmill_loader.format.validate_dataset. Given
    several record folders (batch folders of deduped_jsonl), only the shards of those batches are sampled."""
    folder, manifest = dataset.folder, dataset.manifest
    tt = dataset.training_type
    if tt != settings.training_type:
        return 0, [f"{folder}: dataset.json says training_type {tt}, the stage's settings {settings.training_type}"]
    tokenizer = manifest.get("tokenizer") or {}
    pin = TokenizerPin(str(folder / tokenizer.get("file", TOKENIZER_FILE)), tokenizer.get("sha256", ""))
    try:
        enc = encoder(pin)
    except (TokenmillError, OSError) as e:
        return 0, [f"{folder}: the dataset's tokenizer cannot be used: {e}"]
    batches = None if isinstance(records_dir, (str, Path)) else {Path(d).name for d in records_dir}
    picks = _sample(dataset, batches)
    records = find_records(records_dir, {rid for _, _, rid in picks})
    problems = [
        f"{records_dir}: record {rid} (in {dataset.shards[si].name} of {folder.name}) not found"
        for si, _, rid in picks
        if rid not in records
    ]
    picks = [p for p in picks if p[2] in records]
    seg = Segments(KEYS[tt])
    for _, _, rid in picks:
        reason = RENDERERS[tt](records[rid], seg, enc.special, settings)
        if reason is not None:
            problems.append(f"{folder}: record {rid} is in the shards but cannot be rendered ({reason})")
            return len(picks), problems
        seg.ids.append(rid)
    if not picks:
        return 0, problems
    chunk: SplitChunk = assemble(seg, tt, enc, np.dtype(manifest["token_dtype"]), str(folder))
    for n, (si, j, rid) in enumerate(picks):
        for key in KEYS[tt]:
            a, b = _record_slice(chunk.rec_items[key], chunk.item_lens[key], n)
            if not np.array_equal(chunk.data[key][a:b], _shard_record(dataset, si, j, key)):
                problems.append(
                    f"{folder / dataset.shards[si].name}: record {j} ({rid}) {key} differs from "
                    f"its record encoded with {TOKENIZER_FILE} (sha256 {pin.sha256[:12]}…)"
                )
                break
    return len(picks), problems
