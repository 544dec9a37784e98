"""Checking shards against the records they came from: a sample of a split's records, rendered and encoded again
with the tokenizer its dataset.json names, must give exactly the arrays in the shards. Shards encoded by another
tokenizer (or by two, when tokenizer.json changed during a run) fail it."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from tokenmill.common.io import READ_BLOCK, loads, record_shards
from tokenmill.errors import TokenmillError
from tokenmill.stages.tokenize.encode import SplitChunk, assemble, encoder
from tokenmill.stages.tokenize.render import RENDERERS, Segments
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill.stages.tokenize.tokenizer import TokenizerPin
from tokenmill.stages.tokenize.train import line_id, parse_record
from tokenmill_loader.format import GROUP_KEY, KEYS, RESPONSE_KEYS, TOKENIZER_FILE, Dataset, read_record_ids

SAMPLE_RECORDS = 32  # per split, evenly spread over its records
FIND_BLOCK = 16 << 20  # bytes of a part file searched at once for sampled records


def _line_blocks(path: Path) -> Iterator[tuple[int, bytes]]:
    """(byte offset, block) for newline-aligned blocks of about FIND_BLOCK bytes: a part file is searched a block at
    a time, whatever its size."""
    with open(path, "rb") as f:
        offset = 0
        while block := f.read(FIND_BLOCK):
            block += f.readline()  # up to and including the next newline
            yield offset, block
            offset += len(block)


def _line_number(path: Path, offset: int) -> int:
    """The number of the line starting at byte `offset` (for an error message), counted a block at a time."""
    lines, left = 1, offset
    with open(path, "rb") as f:
        while left > 0 and (block := f.read(min(READ_BLOCK, left))):
            lines += block.count(b"\n")
            left -= len(block)
    return lines


def find_records(records_dirs: Path | Sequence[Path], ids: set[str]) -> dict[str, dict]:
    """The records with these ids in a folder of part files or several. Each file is searched a block at a time for
    lines that start with one of the ids as its stages write it (`{"id": <json.dumps of the id>`), and only those are
    parsed; an id not found that way is looked for line by line (a line that does not start with its id is
    parsed)."""
    found: dict[str, dict] = {}
    dirs = [records_dirs] if isinstance(records_dirs, (str, Path)) else records_dirs
    parts = [p for d in dirs for p in record_shards(d)]
    if not ids:
        return found
    heads = b"|".join(re.escape(json.dumps(i, ensure_ascii=False).encode("utf-8")) for i in sorted(ids))
    first_line = re.compile(rb'\{"id": (?:' + heads + rb")")
    later_line = re.compile(rb'\n\{"id": (?:' + heads + rb")")  # a literal head: the regex engine skips to it
    for part in parts:
        for offset, block in _line_blocks(part):
            starts = [0] if first_line.match(block) else []
            starts += [m.start() + 1 for m in later_line.finditer(block)]
            for start in starts:
                end = block.find(b"\n", start)
                line = block[start : end if end >= 0 else None]
                try:
                    rec = loads(line)
                except ValueError:  # parse_record names the line
                    rec = parse_record(line, part, _line_number(part, offset + start))
                found.setdefault(rec["id"], rec)
        if len(found) == len(ids):
            return found
    for part in parts:
        with open(part, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line_id(line) is None and line.strip():
                    rec = parse_record(line, part, lineno)
                    if rec.get("id") in ids:
                        found.setdefault(rec["id"], rec)
    return found


def _sample(dataset: Dataset, batches: set[str] | None) -> list[tuple[int, int, str]]:
    """(shard index, record in shard, record id) of up to SAMPLE_RECORDS records spread over the split, or over the
    shards of `batches` only (the batches a version adds: earlier shards were checked when they were published, and
    their checksums still are)."""
    entries = dataset.manifest.get("shards", [])
    shards = [si for si in range(len(dataset.shards)) if batches is None or entries[si].get("batch") in batches]
    ends = np.cumsum([dataset.shards[si].records for si in shards])
    if not len(ends) or not ends[-1]:
        return []
    picks = np.unique(np.linspace(0, ends[-1] - 1, min(SAMPLE_RECORDS, int(ends[-1]))).astype(np.int64))
    where = []
    ids: dict[int, list[str]] = {}  # the record ids of the shards a pick falls in (all of them: ~80 bytes a record)
    for i in picks:
        k = int(np.searchsorted(ends, i, side="right"))
        j = int(i - (ends[k - 1] if k else 0))
        if shards[k] not in ids:
            ids = {shards[k]: read_record_ids(dataset.shards[shards[k]].folder)}  # picks come in shard order
        where.append((shards[k], j, ids[shards[k]][j]))
    return where


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
    checked: Sequence[tuple[Dataset, ShardSettings]], records_dir: Path | Sequence[Path]
) -> tuple[int, list[str]]:
    """(records re-encoded, problems) for splits validated by tokenmill_loader.format.validate_dataset, each with
    the settings it was encoded with; the sampled records of every split are looked up in one pass. Given several
    record folders (batch folders of deduped_jsonl), only the shards of those batches are sampled."""
    batches = None if isinstance(records_dir, (str, Path)) else {Path(d).name for d in records_dir}
    problems, ready = [], []
    for dataset, settings in checked:
        folder, manifest = dataset.folder, dataset.manifest
        if dataset.training_type != settings.training_type:
            problems.append(
                f"{folder}: dataset.json says training_type {dataset.training_type}, the stage's settings "
                f"{settings.training_type}"
            )
            continue
        tokenizer = manifest.get("tokenizer") or {}
        pin = TokenizerPin(path=str(folder / tokenizer.get("file", TOKENIZER_FILE)), sha256=tokenizer.get("sha256", ""))
        try:
            enc = encoder(pin)
        except (TokenmillError, OSError) as e:
            problems.append(f"{folder}: the dataset's tokenizer cannot be used: {e}")
            continue
        ready.append((dataset, settings, pin, enc, _sample(dataset, batches)))
    records = find_records(records_dir, {rid for *_, picks in ready for _, _, rid in picks})
    reencoded = 0
    for dataset, settings, pin, enc, picks in ready:
        n, found = _reencode(dataset, settings, pin, enc, picks, records, records_dir)
        reencoded += n
        problems += found
    return reencoded, problems


def _reencode(
    dataset: Dataset,
    settings: ShardSettings,
    pin: TokenizerPin,
    enc,
    picks: list[tuple[int, int, str]],
    records: dict[str, dict],
    records_dir: Path | Sequence[Path],
) -> tuple[int, list[str]]:
    """(records re-encoded, problems) of one split's sample against its shards."""
    folder, tt = dataset.folder, dataset.training_type
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
    # HF's own encoder, not the piece encoder the shards were written with: the check covers that one too
    hf = dataclasses.replace(enc, pieces=None)
    chunk: SplitChunk = assemble(seg, tt, hf, np.dtype(dataset.manifest["token_dtype"]), str(folder))
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
