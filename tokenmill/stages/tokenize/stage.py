"""The two stages, step by step: `train_tokenizer` (tokenizer asset) and `tokenize_batches` (tokenized_bins asset)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_write_text, read_json, write_stats
from tokenmill.common.parallel import default_workers, map_ordered
from tokenmill.common.progress import Progress
from tokenmill.errors import ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill.stages.tokenize.encode import (
    Encoder,
    EncodeTask,
    encode_task,
    encoder,
    head_range,
    load_splits,
    metadata_task,
    plan_ranges,
)
from tokenmill.stages.tokenize.render import VAL_MOVED_KEY, TrainingTypeChoice
from tokenmill.stages.tokenize.settings import ShardSettings, TokenizerSettings
from tokenmill.stages.tokenize.shards import (
    ShardWriter,
    SplitWriters,
    token_dtype_for,
    version_manifests,
    write_rejected,
    write_tokenizer_copy,
)
from tokenmill.stages.tokenize.summary import BatchTotals, stage_stats
from tokenmill.stages.tokenize.tokenizer import TokenizerPin, load_tokenizer, pin_tokenizer, special_token_ids
from tokenmill.stages.tokenize.train import examples, measure, sample_corpus, write_existing, write_trained
from tokenmill.stages.tokenize.versions import (
    STAGE,
    TMP_PREFIX,
    Published,
    apply_retention,
    batch_summary_file,
    next_shard_index,
    publish,
    recover,
)
from tokenmill_loader.format import PLAIN_NAME, SPLITS, TOKENIZER_FILE, list_versions, versioned_tokenizer_file


def train_tokenizer(in_dir: Path, out_dir: Path, settings: TokenizerSettings, log=None) -> dict:
    """Trains (or copies) the tokenizer; writes out_dir/tokenizer.json and _stats.json; returns the stats."""
    t0 = time.perf_counter()
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sample = sample_corpus(in_dir, settings, log)
    t_sample = time.perf_counter() - t0
    stats: dict = {
        "settings": settings.model_dump(),
        "docs_in": sample.records,
        "docs_out": sample.records,
        "corpus_bytes": sample.corpus_bytes,
    }
    t1 = time.perf_counter()
    if settings.tokenizer_path:
        stats.update(write_existing(settings, out_dir))
        held = sample.held_out or sample.train
    else:
        stats.update(write_trained(sample, settings, out_dir, log))
        held = sample.held_out
    t_train = time.perf_counter() - t1
    tok = load_tokenizer(out_dir / TOKENIZER_FILE)  # what later stages will load
    stats.update(
        {
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "special_tokens": special_token_ids(tok, out_dir / TOKENIZER_FILE),
            **measure(tok, held),
            "examples": examples(tok, held or sample.train),
            "tokenizer_sha256": hashlib.sha256((out_dir / TOKENIZER_FILE).read_bytes()).hexdigest(),
            "sample_seconds": round(t_sample, 3),
            "train_seconds": round(t_train, 3),
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
    write_stats(out_dir, stats)
    if log:
        log.info(
            f"tokenizer: vocab {stats['vocab_size']}, {stats['chars_per_token']} chars/token held out, "
            f"trained in {t_train:.1f} s"
        )
    return stats


ENCODED_DIR = f"{TMP_PREFIX}encoded"  # the encode tasks' arrays, each file removed once packed


def _batch_keys(batches: list[tuple[str, Path]]) -> tuple[str, ...]:
    keys = tuple(key for key, _ in batches)
    for key, folder in batches:
        if not isinstance(key, str) or not PLAIN_NAME.fullmatch(key):
            raise ConfigError(f"tokenized_bins: batch key {key!r} is not a plain name ([A-Za-z0-9_][A-Za-z0-9_.-]*)")
        if not Path(folder).is_dir():
            raise StaleUpstreamError(f"{folder}: missing (the records of batch {key})")
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ConfigError(f"tokenized_bins: batch keys {duplicates} are given twice")
    return keys


def rebuild_reason(published: Published | None, tokenizer_sha256: str, encoding: dict, keys: tuple) -> str | None:
    """Why every batch must be encoded again into a new generation; None: append the new batches."""
    if published is None:
        return "first build"
    if published.tokenizer_sha256 != tokenizer_sha256:
        return f"tokenizer changed ({published.tokenizer_sha256[:12]}… -> {tokenizer_sha256[:12]}…)"
    changed = sorted(k for k in encoding if published.encoding.get(k) != encoding[k])
    if changed:
        return f"encoding settings changed: {', '.join(changed)}"
    if keys[: len(published.batches)] != published.batches:
        gone = [b for b in published.batches if b not in keys]
        return f"published batches removed: {gone}" if gone else "batches inserted before published ones"
    return None


# below this the scan runs in the run process: starting worker processes (or engine tasks) costs more than it
AUTO_SCAN_POOL_MIN_BYTES = 64 << 20


def choose_training_type(
    settings: ShardSettings, published: Published | None, batches: list[tuple[str, Path]], workers: int
) -> TrainingTypeChoice:
    """An explicit training type; with auto, the published generation's choice when it was made by auto; for a
    first build, a guess from the first records that the encode tasks' counts confirm (`Encoded.choice`: a
    separate pass over every record costs more than encoding again in the rare case the guess was wrong); else the
    choice from the records of every batch (AUTO_CONDITIONAL_SHARE)."""
    if settings.training_type != "auto":
        return TrainingTypeChoice.explicit(settings.training_type)
    if published is None:
        return guessed_choice(batches)
    inherited = TrainingTypeChoice.published(published.manifests[SPLITS[0]])
    return inherited or records_choice(batches, settings.task_bytes, workers)


GUESS_BYTES = 1 << 20  # the first records a first build's training type is guessed from


def guessed_choice(batches: list[tuple[str, Path]]) -> TrainingTypeChoice:
    """training_type auto over the first GUESS_BYTES of the first batch that has records (a guess)."""
    heads = (head_range(Path(folder), GUESS_BYTES) for _, folder in batches)
    counts = next((c for c in map(metadata_task, filter(None, heads)) if c[0]), (0, 0))
    return TrainingTypeChoice.auto(*counts, guessed=True)


def records_choice(batches: list[tuple[str, Path]], task_bytes: int, workers: int) -> TrainingTypeChoice:
    """training_type auto over the records of `batches`: how many carry a title or author."""
    ranges = [r for _, folder in batches for r in plan_ranges(Path(folder), task_bytes, workers)]
    small = sum(r.end - r.start for r in ranges) < AUTO_SCAN_POOL_MIN_BYTES
    counts = [metadata_task(r) for r in ranges] if small else list(map_ordered(metadata_task, ranges, workers))
    return TrainingTypeChoice.auto(sum(n for n, _ in counts), sum(m for _, m in counts))


def _resolved(settings: ShardSettings, choice: TrainingTypeChoice) -> ShardSettings:
    """The settings a generation is encoded with: training_type as chosen (never auto)."""
    return settings.model_copy(update={"training_type": choice.resolved})


def _load_batch_totals(bins_dir: Path, generation: int, key: str) -> BatchTotals:
    path = batch_summary_file(bins_dir, generation, key)
    if not path.exists():
        raise CorruptOutputError(f"{path}: missing (the counts of published batch {key})")
    return BatchTotals.from_json(read_json(path))


@dataclass
class Encoded:
    """What `_encode_batches` wrote: the counts per batch, the new shard entries per split, the task count, and
    (split hash, id) of the train record with the smallest split hash (what an empty val is topped up with)."""

    totals: dict[str, BatchTotals]
    shards: dict[str, list[dict]]
    tasks: int
    first_train: tuple[int, str] | None
    with_metadata: int  # records with a title or author

    def choice(self) -> TrainingTypeChoice:
        """training_type auto over every record encoded."""
        return TrainingTypeChoice.auto(sum(t.docs_in for t in self.totals.values()), self.with_metadata)


def _encode_batches(
    batches: list[tuple[str, Path]],
    pin: TokenizerPin,
    enc: Encoder,
    dtype: np.dtype,
    settings: ShardSettings,
    bins_dir: Path,
    generation: int,
    workers: int,
    log=None,
    val_ids: frozenset[str] = frozenset(),
) -> Encoded:
    """Encodes the batches, in order, into new shards of bins_dir (one task list for all of them); saves each
    batch's counts. `val_ids` go to val whatever their split hash."""
    encoded = bins_dir / ENCODED_DIR
    encoded.mkdir(parents=True, exist_ok=True)
    plans = [(key, plan_ranges(Path(folder), settings.task_bytes, workers)) for key, folder in batches]
    ranges = [r for _, batch_ranges in plans for r in batch_ranges]
    threads = workers <= 1 or len(ranges) <= 1  # in-process: let the encoder use every core
    tasks = [
        EncodeTask(r, pin, settings, dtype.name, threads, str(encoded / f"r{i:05d}"), val_ids)
        for i, r in enumerate(ranges)
    ]
    progress = Progress(STAGE, total=sum(r.end - r.start for r in ranges), unit="bytes", log=log)
    results = iter(map_ordered(encode_task, tasks, workers))
    totals: dict[str, BatchTotals] = {}
    shards: dict[str, list[dict]] = {s: [] for s in SPLITS}
    first_train = None
    with_metadata = 0
    try:
        for key, batch_ranges in plans:
            batch = BatchTotals(settings.training_type)
            writers = SplitWriters(bins_dir, key, settings.training_type, enc.vocab_size, dtype, settings.shard_tokens)
            try:
                for rng in batch_ranges:
                    result = load_splits(next(results))
                    for entry in result.rejected:
                        entry["batch"] = key
                    if result.first_train is not None:
                        first_train = min(first_train or result.first_train, result.first_train)
                    with_metadata += result.with_metadata
                    batch.add(result)
                    writers.add(result.splits)
                    progress.advance(rng.end - rng.start)
                for s, entries in writers.close().items():
                    shards[s] += entries
            except BaseException:
                writers.abort()
                raise
            batch.finish(enc)
            path = batch_summary_file(bins_dir, generation, key)
            path.parent.mkdir(exist_ok=True)
            atomic_write_text(path, json.dumps(batch.to_json(), ensure_ascii=False, separators=(",", ":")))
            totals[key] = batch
    finally:
        shutil.rmtree(encoded, ignore_errors=True)
    progress.finish()
    return Encoded(totals, shards, len(tasks), first_train, with_metadata)


def _val_top_up(settings: ShardSettings, encoded: Encoded) -> frozenset[str]:
    """The record to move into val when a generation's first version leaves it empty with val asked for and 2
    records or more: the train record with the smallest split hash (the same for any worker count)."""
    val = sum(t.splits["val"].records for t in encoded.totals.values())
    train = sum(t.splits["train"].records for t in encoded.totals.values())
    if settings.val_fraction == 0 or val or train < 2:
        return frozenset()
    return frozenset({encoded.first_train[1]})


def tokenize_batches(
    batches: list[tuple[str, Path]],
    tokenizer_dir: Path,
    bins_dir: Path,
    settings: ShardSettings,
    workers: int | None = None,
    log=None,
    check: Callable[[int], None] | None = None,
) -> dict:
    """Publishes the next version of bins_dir/train/ and bins_dir/val/ (docs/format.md, "Versions") holding every
    batch of `batches` ((key, deduped folder) pairs, all of them, in order); writes _rejected.json and _stats.json
    (cumulative over the published version) and returns the stats.

    With the tokenizer and the encoding settings (ShardSettings.ENCODING) of the latest version, only the batches
    after its own are encoded and appended; otherwise (first build, retrained tokenizer, changed settings, a
    published batch missing) a new generation encodes every batch. Nothing new: no version (`new_version` False).
    `check(version)` runs on the complete new version before any dataset.json names it; if it raises, nothing is
    published. The tokenizer is pinned when the run starts (a task that finds it changed raises
    StaleUpstreamError). Superseded versions past retention are removed at the end.

    training_type auto is chosen once per generation (`choose_training_type`); appends keep the choice. A
    generation's first version whose hash split leaves val empty (val_fraction > 0, 2 records or more) moves the
    train record with the smallest split hash into val (the version's manifest lists it under val_moved); appends
    never move a published record.
    """
    t0 = time.perf_counter()
    bins_dir = Path(bins_dir)
    bins_dir.mkdir(parents=True, exist_ok=True)
    settings = ShardSettings.model_validate(settings.model_dump())  # plain settings travel to the workers
    keys = _batch_keys(batches)
    published = recover(bins_dir, log)
    pin, tokenizer_bytes = pin_tokenizer(tokenizer_dir)
    workers = default_workers() if workers is None else max(1, workers)
    choice = choose_training_type(settings, published, batches, workers)
    reason = rebuild_reason(published, pin.sha256, _resolved(settings, choice).encoding(), keys)
    if reason is not None and choice.inherited:  # a new generation chooses again, from all its records
        choice = records_choice(batches, settings.task_bytes, workers)
    resolved = _resolved(settings, choice)
    kept = published.batches if reason is None else ()
    generation = published.generation if reason is None else (published.generation + 1 if published else 1)
    added = list(batches[len(kept) :])
    totals = {key: _load_batch_totals(bins_dir, generation, key) for key in kept}
    tasks = 0
    if added or reason is not None:
        if log:
            log.info(
                f"tokenized_bins: generation {generation} ({reason or 'append'}), encoding {len(added)} batches "
                f"as {choice.resolved} ({choice.reason})"
            )
        try:
            enc = encoder(pin)
            dtype = token_dtype_for(enc.vocab_size, settings.token_dtype)
            encoded = _encode_batches(added, pin, enc, dtype, resolved, bins_dir, generation, workers, log)
            if choice.guessed:
                confirmed = encoded.choice()
                if confirmed.resolved != choice.resolved:
                    if log:
                        log.info(f"tokenized_bins: encoding again as {confirmed.resolved} ({confirmed.reason})")
                    recover(bins_dir)  # removes the shards and counts just written: no version names them
                    resolved = _resolved(settings, confirmed)
                    encoded = _encode_batches(added, pin, enc, dtype, resolved, bins_dir, generation, workers, log)
                choice = confirmed
            moved = _val_top_up(settings, encoded) if not kept else frozenset()
            if moved:
                if log:
                    log.info(f"tokenized_bins: val is empty; moving record {min(moved)} there and encoding again")
                recover(bins_dir)  # removes the shards and counts just written: no version names them
                encoded = _encode_batches(added, pin, enc, dtype, resolved, bins_dir, generation, workers, log, moved)
            tasks = encoded.tasks
            totals.update(encoded.totals)
            shards = {s: (list(published.manifests[s]["shards"]) if kept else []) + encoded.shards[s] for s in SPLITS}
            for s in SPLITS:
                if not shards[s]:  # an empty split still gets one (empty) shard, so it loads
                    shards[s] = ShardWriter(
                        bins_dir / s,
                        resolved.training_type,
                        enc.vocab_size,
                        dtype,
                        settings.shard_tokens,
                        first_index=next_shard_index(bins_dir / s),
                    ).empty_shard()
            for s in SPLITS:
                write_tokenizer_copy(bins_dir / s, tokenizer_bytes, pin.sha256)
            tokenizer = {
                "file": versioned_tokenizer_file(pin.sha256),
                "sha256": pin.sha256,
                "vocab_size": enc.vocab_size,
            }
            moved_before = published.manifests[SPLITS[0]].get(VAL_MOVED_KEY, []) if kept else []
            version = {
                "version": published.version + 1 if published else 1,
                "generation": generation,
                "batches": list(keys),
                "encoding": resolved.encoding(),
                **choice.manifest_entry(),
                **({VAL_MOVED_KEY: moved_before or sorted(moved)} if moved_before or moved else {}),
            }
            manifests = version_manifests(
                version=version,
                training_type=resolved.training_type,
                vocab_size=enc.vocab_size,
                token_dtype=dtype,
                tokenizer=tokenizer,
                special=enc.special,
                shards=shards,
                supervised={s: sum(t.splits[s].supervised for t in totals.values()) for s in SPLITS},
            )
            publish(bins_dir, manifests, tokenizer_dir, check)
        except BaseException:
            recover(bins_dir, log)  # what this run wrote, no version names it
            raise
        published = Published.of(manifests)
    removed = apply_retention(bins_dir, settings.retention_hours, settings.keep_versions, log=log)
    latest = published.manifests[SPLITS[0]]
    stats = stage_stats(
        settings,
        {key: totals[key] for key in published.batches},
        published.manifests,
        vocab_size=latest["vocab_size"],
        token_dtype=np.dtype(latest["token_dtype"]),
        seconds=time.perf_counter() - t0,
        workers=workers,
        tasks=tasks,
        choice=choice,
    )
    stats.update(
        {
            "version": published.version,
            "generation": published.generation,
            "new_version": bool(added or reason is not None),
            "rebuild_reason": reason,
            "batches_added": [key for key, _ in added],
            "versions": list_versions(bins_dir / SPLITS[0]),
            "versions_removed": removed,
        }
    )
    rejected = write_rejected(bins_dir, (e for key in published.batches for e in totals[key].rejected))
    write_stats(bins_dir, stats)
    if log:
        log.info(
            f"tokenized_bins: version {published.version} (generation {published.generation}, "
            f"{len(published.batches)} batches, {len(added)} added): {stats['docs_out']:,} records, "
            f"{stats['tokens']:,} tokens, dropped {rejected:,}"
        )
    return stats


def tokenize_corpus(
    in_dir: Path, tokenizer_dir: Path, out_dir: Path, settings: ShardSettings, workers: int | None = None, log=None
) -> dict:
    """tokenize_batches over one deduped folder, as the single batch named after it (a non-incremental build)."""
    return tokenize_batches([(Path(in_dir).name, Path(in_dir))], tokenizer_dir, out_dir, settings, workers, log)
