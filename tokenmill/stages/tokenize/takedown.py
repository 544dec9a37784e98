"""A takedown: the next version of tokenized_bins without some records (docs/format.md, "Takedowns").

Only the shards that hold a removed record are written again, from their own arrays sliced by item offsets, as new
shards (numbers continue: a shard is never rewritten); every other shard is listed unchanged, in the same order.
Nothing is encoded again but the removed records themselves, alone, to take their counts off their batch's totals
(so _stats.json keeps docs_in = docs_out + dropped, `dropped_forgotten` among them). The version is published like
every other (versions.publish: the shards checked and a sample re-encoded, then current.json), so a reader of an
older version keeps it until retention removes it. The caller holds the data root's lock.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import STATS_FILE, read_json
from tokenmill.common.results import write_result
from tokenmill.errors import CheckFailedError, CorruptOutputError, StaleUpstreamError
from tokenmill.stages.tokenize.checks import validate_token_shards
from tokenmill.stages.tokenize.encode import (
    ByteRange,
    EncodeTask,
    SplitChunk,
    TaskResult,
    encode_task,
    encoder,
    read_splits,
)
from tokenmill.stages.tokenize.forgotten import FORGOTTEN_REASON, REMOVALS_KEY, add_forgotten
from tokenmill.stages.tokenize.render import VAL_MOVED_KEY, TrainingTypeChoice
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill.stages.tokenize.shards import ShardWriter, version_manifests
from tokenmill.stages.tokenize.stage import load_batch_totals, save_batch_totals
from tokenmill.stages.tokenize.summary import BatchTotals, FirstRecord, TokenizeResult, stage_result
from tokenmill.stages.tokenize.tokenizer import TokenizerPin
from tokenmill.stages.tokenize.verify import find_records
from tokenmill.stages.tokenize.versions import (
    TMP_PREFIX,
    Published,
    next_shard_index,
    publish,
    recover,
    settle_pending,
)
from tokenmill_loader.format import (
    GROUP_KEY,
    KEYS,
    RESPONSE_KEYS,
    SPLITS,
    TOKENS,
    Shard,
    list_versions,
    manifest_path,
    read_record_ids,
    read_shard,
    validate_dataset,
)

REENCODED_DIR = f"{TMP_PREFIX}forget"  # the removed records, encoded again alone; removed at the end


@dataclass(frozen=True, kw_only=True)
class Takedown:
    """What a takedown removes and why: the removal manifest's entry (docs/format.md, "Takedowns")."""

    records: frozenset[str]  # ids in the published version
    duplicates: tuple[str, ...] = ()  # ids dedup folded into them (not in the dataset; forgotten with them)
    keys: dict[str, str]  # id -> text key (forgotten.text_key) of every record and duplicate
    selector: dict  # as given: {"id": [...]} | {"source": [...]} | {"match": REGEX}, and "with_duplicates"
    reason: str | None = None
    by: str | None = None
    at: str  # ISO 8601, UTC

    def manifest_entry(self, version: int) -> dict:
        return {
            "version": version,
            "selector": self.selector,
            "records": sorted(self.records),
            "duplicates": list(self.duplicates),
            "reason": self.reason,
            "by": self.by,
            "at": self.at,
        }


def locate(bins_dir: Path, ids: set[str]) -> dict[str, str]:
    """The split of each of `ids` the published version holds (an id it lacks is left out); record_ids.json is
    read one shard at a time."""
    found: dict[str, str] = {}
    for split in SPLITS:
        folder = Path(bins_dir) / split
        for entry in read_json(manifest_path(folder))["shards"]:
            found.update(dict.fromkeys(ids.intersection(read_record_ids(folder / entry["name"])), split))
    return found


def shard_records(shard: Shard, training_type: str, keep: np.ndarray, ids: list[str]) -> SplitChunk:
    """The records of a shard where `keep` is True, as the chunk ShardWriter writes: every key's data sliced by
    its item offsets (grpo: a record's responses are its `rewards` item's values)."""
    records = len(keep)
    responses = np.diff(shard.keys[GROUP_KEY].offsets) if GROUP_KEY in shard.keys else None
    ch = SplitChunk(ids=[rid for rid, k in zip(ids, keep.tolist()) if k])
    rec_tokens = np.zeros(int(keep.sum()), dtype=np.int64)
    for key, kind in KEYS[training_type].items():
        spec = shard.keys[key]
        items = responses if key in RESPONSE_KEYS and responses is not None else np.ones(records, dtype=np.int64)
        item_lens = np.diff(spec.offsets)
        item_keep = np.repeat(keep, items)
        data = np.fromfile(shard.path(key), dtype=spec.dtype.newbyteorder("<"), count=spec.length)
        ch.data[key] = data[np.repeat(item_keep, item_lens)]
        ch.item_lens[key] = item_lens[item_keep]
        ch.rec_items[key] = items[keep]
        if kind == TOKENS:
            of_item = np.repeat(np.arange(records), items)
            rec_tokens += np.bincount(of_item, weights=item_lens, minlength=records).astype(np.int64)[keep]
    ch.rec_tokens = rec_tokens
    return ch


@dataclass(kw_only=True)
class _Repacked:
    """Each split's shard entries of the new version, and per batch and split which of its records stay."""

    shards: dict[str, list[dict]]
    kept: dict[str, dict[str, np.ndarray]]  # batch -> split -> one bool per record of the batch's split, in order
    removed: dict[str, set[str]]  # batch -> the ids removed from it


def _repack(bins_dir: Path, published: Published, removed: frozenset[str]) -> _Repacked:
    """The shards holding a removed record written again without it (after the split's last shard number); the
    others listed as they are. A shard left without records is left out (a split left without any gets an empty
    one, so it loads)."""
    latest = published.manifests[SPLITS[0]]
    tt, vocab = latest["training_type"], latest["vocab_size"]
    repacked = _Repacked(shards={}, kept={}, removed={})
    for split in SPLITS:
        folder = Path(bins_dir) / split
        dataset = validate_dataset(folder, version=published.version)
        index = next_shard_index(folder)
        masks: dict[str, list[np.ndarray]] = {}
        entries: list[dict] = []
        for entry, shard in zip(dataset.manifest["shards"], dataset.shards):
            ids = read_record_ids(shard.folder)
            if not ids:  # an empty split's one shard, listed as it is
                entries.append(entry)
                continue
            if "batch" not in entry:
                raise CorruptOutputError(f"{manifest_path(folder)}: shard {entry['name']} names no batch")
            keep = np.fromiter((rid not in removed for rid in ids), dtype=bool, count=len(ids))
            masks.setdefault(entry["batch"], []).append(keep)
            if keep.all():
                entries.append(entry)
                continue
            repacked.removed.setdefault(entry["batch"], set()).update(removed.intersection(ids))
            if not keep.any():
                continue
            writer = ShardWriter(folder, tt, vocab, latest["token_dtype"], 1, first_index=index, batch=entry["batch"])
            writer.write_chunk(shard_records(shard, tt, keep, ids))
            entries += writer.close()
            index += 1
        if not entries:
            entries = ShardWriter(folder, tt, vocab, latest["token_dtype"], 1, first_index=index).empty_shard()
        repacked.shards[split] = entries
        for batch, batch_masks in masks.items():
            repacked.kept.setdefault(batch, {})[split] = np.concatenate(batch_masks)
    return repacked


def _reencode_removed(
    bins_dir: Path, deduped_dir: Path, published: Published, batch: str, ids: set[str], pin: TokenizerPin
) -> TaskResult:
    """The removed records of one batch encoded again alone, as a TaskResult with its splits read (their counts,
    to take off the batch's totals); each must land in the split it was found in."""
    latest = published.manifests[SPLITS[0]]
    records = find_records(deduped_dir / batch, ids)
    if missing := sorted(ids - records.keys()):
        raise StaleUpstreamError(f"{deduped_dir / batch}: record {missing[0]} of batch {batch} not found")
    folder = Path(bins_dir) / REENCODED_DIR
    folder.mkdir(exist_ok=True)
    path = folder / f"{batch}.jsonl"
    path.write_text("".join(json.dumps(records[rid], ensure_ascii=False) + "\n" for rid in sorted(ids)), "utf-8")
    result = encode_task(
        EncodeTask(
            range=ByteRange(path=str(path), start=0, end=path.stat().st_size, first_line=1),
            tokenizer=pin,
            settings=ShardSettings(**latest["encoding"]),
            token_dtype=latest["token_dtype"],
            threads=True,
            out=str(folder / batch),
            val_ids=frozenset(latest.get(VAL_MOVED_KEY, [])),
        )
    )
    result.splits = read_splits(result.splits_dir)
    return result


def _first_train_record(bins_dir: Path, shards: list[dict], batch: str, training_type: str) -> FirstRecord | None:
    """The first train record of a batch in the new version's shards (its totals' sample)."""
    entry = next((e for e in shards if e.get("batch") == batch and e["records"]), None)
    if entry is None:
        return None
    shard = read_shard(Path(bins_dir) / SPLITS[0] / entry["name"], training_type)
    ids = read_record_ids(shard.folder)
    keep = np.zeros(len(ids), dtype=bool)
    keep[0] = True
    return FirstRecord.of(shard_records(shard, training_type, keep, ids), training_type)


def _take_off(
    bins_dir: Path, deduped_dir: Path, published: Published, takedown: Takedown, repacked: _Repacked
) -> dict[str, BatchTotals]:
    """Every batch's totals, the affected ones without the removed records (counted as dropped, forgotten)."""
    latest = published.manifests[SPLITS[0]]
    tt = latest["training_type"]
    pin = TokenizerPin(
        path=str(Path(bins_dir) / SPLITS[0] / latest["tokenizer"]["file"]), sha256=latest["tokenizer"]["sha256"]
    )
    totals = {key: load_batch_totals(bins_dir, published.generation, key) for key in published.batches}
    for batch, ids in repacked.removed.items():
        kept = repacked.kept[batch]
        result = _reencode_removed(bins_dir, deduped_dir, published, batch, ids, pin)
        for split, ch in result.splits.items():
            if split not in kept or ch.records != int((~kept[split]).sum()):
                raise CorruptOutputError(
                    f"{bins_dir / split}: the removed records of batch {batch} encode into another split than "
                    f"version {published.version} holds them in (its encoding settings are not the manifest's)"
                )
        batch_totals = totals[batch]
        batch_totals.take_off(result, kept, FORGOTTEN_REASON)
        if batch_totals.sample is not None and batch_totals.sample["id"] in takedown.records:
            batch_totals.first = _first_train_record(bins_dir, repacked.shards[SPLITS[0]], batch, tt)
            batch_totals.sample = None
            batch_totals.finish(encoder(pin))
    return totals


def _check(bins_dir: Path, deduped_dir: Path, batches: list[str], version: int) -> None:
    """token_shards_consistent's check on the complete version: every shard file valid, and a sample of the
    affected batches' records re-encoded with the version's tokenizer (the one the split's tokenizer.json still is)
    gives the shards' tokens."""
    problems = validate_token_shards(bins_dir, [deduped_dir / b for b in batches], bins_dir / SPLITS[0], version)[
        "problems"
    ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckFailedError(f"tokenized_bins version {version}: {problems[0]}{more}")


def forget_records(bins_dir: Path, deduped_dir: Path, takedown: Takedown, log=None) -> TokenizeResult:
    """Publishes the next version of bins_dir without `takedown.records` (each in the latest version), its manifest
    listing the takedown under `removals` after the earlier ones; adds them (and the duplicates) to the takedown
    list first (forgotten.py); rewrites the affected batches' totals and the stage's result; returns it."""
    started = time.perf_counter()
    bins_dir, deduped_dir = Path(bins_dir), Path(deduped_dir)
    published = recover(bins_dir, log)
    if published is None:
        raise StaleUpstreamError(f"{bins_dir}: no version published yet")
    version = published.version + 1
    latest = published.manifests[SPLITS[0]]
    add_forgotten(
        bins_dir,
        (
            {"id": rid, "key": takedown.keys[rid], "version": version, "at": takedown.at}
            for rid in sorted(takedown.keys)
        ),
    )
    try:
        repacked = _repack(bins_dir, published, takedown.records)
        totals = _take_off(bins_dir, deduped_dir, published, takedown, repacked)
        fields = ("generation", "batches", "encoding", TrainingTypeChoice.MANIFEST_KEY, VAL_MOVED_KEY)
        manifests = version_manifests(
            version={
                "version": version,
                **{k: latest[k] for k in fields if k in latest},
                REMOVALS_KEY: [*latest.get(REMOVALS_KEY, []), takedown.manifest_entry(version)],
            },
            training_type=latest["training_type"],
            vocab_size=latest["vocab_size"],
            token_dtype=np.dtype(latest["token_dtype"]),
            tokenizer=latest["tokenizer"],
            special=latest["special_tokens"],
            shards=repacked.shards,
            supervised={s: sum(t.splits[s].supervised for t in totals.values()) for s in SPLITS},
        )
        for batch in repacked.removed:  # renamed into place once the version is published (here or by recover)
            save_batch_totals(bins_dir, published.generation, batch, totals[batch], pending=version)
        publish(bins_dir, manifests, None, lambda v: _check(bins_dir, deduped_dir, sorted(repacked.removed), v))
    except BaseException:
        recover(bins_dir, log)
        raise
    finally:
        shutil.rmtree(bins_dir / REENCODED_DIR, ignore_errors=True)
    settle_pending(bins_dir, version, [])
    settings = read_json(bins_dir / STATS_FILE)["settings"] if (bins_dir / STATS_FILE).exists() else latest["encoding"]
    result = stage_result(
        ShardSettings(**settings),
        totals,
        manifests,
        vocab_size=latest["vocab_size"],
        token_dtype=np.dtype(latest["token_dtype"]),
        seconds=time.perf_counter() - started,
        choice=TrainingTypeChoice.published(latest) or TrainingTypeChoice.explicit(latest["training_type"]),
        workers=1,
        tasks=len(repacked.removed),
        version=version,
        generation=published.generation,
        new_version=True,
        batches_added=[],
        versions=list_versions(bins_dir / SPLITS[0]),
        versions_removed=[],
    )
    write_result(bins_dir, result)
    return result
