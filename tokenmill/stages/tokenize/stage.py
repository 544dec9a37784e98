"""The two stages, step by step: `train_tokenizer` (tokenizer asset) and `tokenize_batches` (tokenized_bins asset)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenmill.common.io import atomic_file, atomic_write_text, read_json
from tokenmill.common.parallel import default_workers, map_ordered
from tokenmill.common.progress import Progress
from tokenmill.common.results import StageResult, run_fact, write_result
from tokenmill.errors import ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill.stages.tokenize.encode import (
    ByteRange,
    Encoder,
    EncodeTask,
    TaskResult,
    encode_task,
    encoder,
    head_range,
    metadata_task,
    plan_ranges,
    read_splits,
)
from tokenmill.stages.tokenize.forgotten import REMOVALS_KEY, Forgotten, read_forgotten
from tokenmill.stages.tokenize.render import VAL_MOVED_KEY, TrainingTypeChoice
from tokenmill.stages.tokenize.settings import ShardSettings, TokenizerSettings
from tokenmill.stages.tokenize.shards import (
    PackPlan,
    ShardWriter,
    pack_shard,
    token_dtype_for,
    version_manifests,
    write_rejected,
    write_tokenizer_copy,
)
from tokenmill.stages.tokenize.summary import BatchTotals, TokenizeResult, stage_result
from tokenmill.stages.tokenize.tokenizer import TokenizerPin, load_tokenizer, pin_tokenizer, special_token_ids
from tokenmill.stages.tokenize.train import examples, measure, sample_corpus, write_existing, write_trained
from tokenmill.stages.tokenize.versions import (
    STAGE,
    TMP_PREFIX,
    Published,
    apply_retention,
    batch_summary_file,
    batch_token_counts_file,
    next_shard_index,
    pending_file,
    publish,
    recover,
)
from tokenmill_loader.format import PLAIN_NAME, SPLITS, TOKENIZER_FILE, list_versions, versioned_tokenizer_file


@dataclass(frozen=True, kw_only=True)
class TokenizerResult(StageResult):
    """The tokenizer: trained on a sample of the records (or copied from tokenizer_path), its vocabulary, special
    token ids, chars per token on held-out records, a few texts tokenized and its SHA-256."""

    settings: dict
    corpus_bytes: int
    mode: str  # trained | existing
    sample_records: int
    sample_chars: int
    source: str | None = None  # existing: the tokenizer.json copied
    special_tokens_added: list[str] | None = None  # existing: the special tokens it lacked
    vocab_size: int
    special_tokens: dict[str, int]
    held_out_records: int
    held_out_chars: int
    held_out_tokens: int
    chars_per_token: float | None = None  # None: no held-out text
    examples: list[dict]
    tokenizer_sha256: str
    sample_seconds: float = run_fact()
    train_seconds: float = run_fact()


def train_tokenizer(in_dir: Path, out_dir: Path, settings: TokenizerSettings, log=None) -> TokenizerResult:
    """Trains (or copies) the tokenizer; writes out_dir/tokenizer.json and the result; returns it."""
    t0 = time.perf_counter()
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sample = sample_corpus(in_dir, settings, log)
    t_sample = time.perf_counter() - t0
    t1 = time.perf_counter()
    if settings.tokenizer_path:
        made = write_existing(settings, out_dir)
        held = sample.held_out or sample.train
    else:
        made = write_trained(sample, settings, out_dir, log)
        held = sample.held_out
    t_train = time.perf_counter() - t1
    result = TokenizerResult(
        settings=settings.model_dump(),
        docs_in=sample.records,
        docs_out=sample.records,
        dropped={},
        corpus_bytes=sample.corpus_bytes,
        **made,
        **_tokenizer_figures(out_dir / TOKENIZER_FILE, held or sample.train, held),
        sample_seconds=round(t_sample, 3),
        train_seconds=round(t_train, 3),
        seconds=round(time.perf_counter() - t0, 3),
    )
    write_result(out_dir, result)
    if log:
        log.info(
            f"tokenizer: vocab {result.vocab_size}, {result.chars_per_token} chars/token held out, "
            f"trained in {t_train:.1f} s"
        )
    return result


def _tokenizer_figures(path: Path, shown: list[str], held: list[str]) -> dict:
    """The written tokenizer, loaded as later stages will load it: its size, special ids, chars per token on `held`,
    `shown` texts tokenized, its SHA-256."""
    tok = load_tokenizer(path)
    return {
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_tokens": special_token_ids(tok, path),
        **measure(tok, held),
        "examples": examples(tok, shown),
        "tokenizer_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


ENCODED_DIR = f"{TMP_PREFIX}encoded"  # the encode tasks' arrays, removed once the shards are written


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


def load_batch_totals(bins_dir: Path, generation: int, key: str) -> BatchTotals:
    path = batch_summary_file(bins_dir, generation, key)
    if not path.exists():
        raise CorruptOutputError(f"{path}: missing (the counts of published batch {key})")
    summary = read_json(path)
    counts_file = batch_token_counts_file(bins_dir, generation, key)
    if counts_file.exists():
        with np.load(counts_file) as counts:
            return BatchTotals.from_json(summary, {s: counts[s] for s in counts.files})
    if any("tokens_per_doc" not in split for split in summary["splits"].values()):
        raise CorruptOutputError(f"{counts_file}: missing (the tokens per record of published batch {key})")
    return BatchTotals.from_json(summary, {})


def save_batch_totals(
    bins_dir: Path, generation: int, key: str, batch: BatchTotals, pending: int | None = None
) -> None:
    """The batch's counts; `pending`: as the counts of that version, not published yet (versions.pending_file)."""
    path, counts = batch_summary_file(bins_dir, generation, key), batch_token_counts_file(bins_dir, generation, key)
    if pending is not None:
        path, counts = pending_file(path, pending), pending_file(counts, pending)
    path.parent.mkdir(exist_ok=True)
    with atomic_file(counts, "wb") as f:
        np.savez(f, allow_pickle=False, **batch.token_counts())
    atomic_write_text(path, json.dumps(batch.to_json(), ensure_ascii=False, separators=(",", ":")))


@dataclass(kw_only=True)
class Encoded:
    """What `_encode_batches` wrote: the counts per batch, the new shard entries per split, the task count, and
    (split hash, id) of the train record with the smallest split hash (what an empty val is topped up with)."""

    tasks: int
    totals: dict[str, BatchTotals] = field(default_factory=dict)
    shards: dict[str, list[dict]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    first_train: tuple[int, str] | None = None
    with_metadata: int = 0  # records with a title or author

    def add(self, key: str, result: TaskResult) -> None:
        """A task's figures; its rejected records are tagged with their batch."""
        for entry in result.rejected:
            entry["batch"] = key
        if result.first_train is not None:
            self.first_train = min(self.first_train or result.first_train, result.first_train)
        self.with_metadata += result.with_metadata

    def choice(self) -> TrainingTypeChoice:
        """training_type auto over every record encoded."""
        return TrainingTypeChoice.auto(sum(t.docs_in for t in self.totals.values()), self.with_metadata)


@dataclass(kw_only=True)
class _Run:
    """One tokenize_batches call: what it was given, then what its steps decided and wrote."""

    batches: list[tuple[str, Path]]
    keys: tuple[str, ...]
    tokenizer_dir: Path
    bins_dir: Path
    settings: ShardSettings
    workers: int
    log: Any
    started: float  # time.perf_counter() at the start (the result's seconds)
    published: Published | None  # the latest version (None: none yet)
    pin: TokenizerPin
    tokenizer_bytes: bytes
    choice: TrainingTypeChoice  # the training type (_decide_rebuild and _confirm_training_type may choose again)
    forgotten: Forgotten  # the records taken down (forgotten.py): dropped wherever they come again
    reason: str | None = None  # why every batch is encoded again into a new generation; None: append
    kept: tuple[str, ...] = ()  # the published batches the next version keeps
    generation: int = 0
    totals: dict[str, BatchTotals] = field(default_factory=dict)  # per batch of the next version
    tasks: int = 0  # encode tasks run
    enc: Encoder | None = None  # set by _encode (encoding()), before any shard is written
    dtype: np.dtype | None = None
    moved: frozenset[str] = frozenset()  # train records moved into an empty val

    @property
    def added(self) -> list[tuple[str, Path]]:
        return list(self.batches[len(self.kept) :])

    @property
    def new_version(self) -> bool:
        return bool(self.added or self.reason is not None)

    @property
    def resolved(self) -> ShardSettings:
        return _resolved(self.settings, self.choice)

    @property
    def appended_to(self) -> Published | None:
        """The published version the next one appends to (its batches kept); None: a new generation."""
        return self.published if self.kept else None

    def encoding(self) -> tuple[Encoder, np.dtype]:
        """The encoder and the token dtype, once _encode has set them."""
        assert self.enc is not None and self.dtype is not None, "_encode sets them first"
        return self.enc, self.dtype

    def info(self, message: str) -> None:
        if self.log:
            self.log.info(message)


def _encode_batches(run: _Run, val_ids: frozenset[str] = frozenset()) -> Encoded:
    """Encodes the added batches, in order, into new shards of bins_dir: one task list encodes them all, the run
    process counts each task's records and plans the shards (PackPlan), then a task per shard writes it. Saves each
    batch's counts. `val_ids` go to val whatever their split hash."""
    settings, folder = run.resolved, run.bins_dir / ENCODED_DIR
    enc, dtype = run.encoding()
    folder.mkdir(parents=True, exist_ok=True)
    plans = [(key, plan_ranges(Path(records), settings.task_bytes, run.workers)) for key, records in run.added]
    ranges = [r for _, batch_ranges in plans for r in batch_ranges]
    threads = run.workers <= 1 or len(ranges) <= 1  # in-process: let the encoder use every core
    tasks = [
        EncodeTask(
            range=r,
            tokenizer=run.pin,
            settings=settings,
            token_dtype=dtype.name,
            threads=threads,
            out=str(folder / f"r{i:05d}"),
            val_ids=val_ids,
            forgotten=run.forgotten,
        )
        for i, r in enumerate(ranges)
    ]
    progress = Progress(STAGE, total=sum(r.end - r.start for r in ranges), unit="bytes", log=run.log)
    results = iter(map_ordered(encode_task, tasks, run.workers))
    encoded = Encoded(tasks=len(tasks))
    packs = PackPlan(run.bins_dir, settings.training_type, enc.vocab_size, dtype, settings.shard_tokens)
    try:
        for key, batch_ranges in plans:
            _count_batch(run, key, batch_ranges, results, progress, encoded, packs)
        progress.finish()
        shards = Progress(f"{STAGE}: writing shards", total=len(packs.tasks), unit="shards", log=run.log)
        for task, entry in zip(packs.tasks, map_ordered(pack_shard, packs.tasks, run.workers)):
            encoded.shards[task.split].append(entry)
            shards.advance()
        shards.finish()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return encoded


def _count_batch(
    run: _Run,
    key: str,
    batch_ranges: list[ByteRange],
    results: Iterator[TaskResult],
    progress: Progress,
    encoded: Encoded,
    packs: PackPlan,
) -> None:
    """One batch's task results, in task order, into its counts (saved) and its shards' plan. Only the record
    counts are read, and the arrays of the tasks up to the batch's first train record (its sample)."""
    enc, _ = run.encoding()
    batch = BatchTotals(training_type=run.resolved.training_type)
    packs.start_batch(key)
    for rng in batch_ranges:
        result = next(results)
        result.splits = read_splits(result.splits_dir, data=batch.first is None)
        encoded.add(key, result)
        batch.add(result)
        packs.add(result.splits_dir, result.splits)
        progress.advance(rng.end - rng.start)
    packs.finish_batch()
    batch.finish(enc)
    save_batch_totals(run.bins_dir, run.generation, key, batch)
    encoded.totals[key] = batch


def tokenize_batches(
    batches: list[tuple[str, Path]],
    tokenizer_dir: Path,
    bins_dir: Path,
    settings: ShardSettings,
    workers: int | None = None,
    log=None,
    check: Callable[[int], None] | None = None,
) -> TokenizeResult:
    """Publishes the next version of bins_dir/train/ and bins_dir/val/ (docs/format.md, "Versions") holding every
    batch of `batches` ((key, deduped folder) pairs, all of them, in order); writes _rejected.json and the result
    (cumulative over the published version) and returns it.

    With the tokenizer and the encoding settings (ShardSettings.ENCODING) of the latest version, only the batches
    after its own are encoded and appended; otherwise (first build, retrained tokenizer, changed settings, a
    published batch missing) a new generation encodes every batch. Nothing new: no version (`new_version` False).
    A record on the takedown list (forgotten.py: its id, or its text's key) is dropped as `forgotten` either way.
    `check(version)` runs on the complete new version before current.json names it; if it raises, nothing is
    published. The tokenizer is pinned when the run starts (a task that finds it changed raises
    StaleUpstreamError). Superseded versions past retention are removed at the end.

    training_type auto is chosen once per generation (`choose_training_type`); appends keep the choice. A
    generation's first version whose hash split leaves val empty (val_fraction > 0, 2 records or more) moves the
    train record with the smallest split hash into val (the version's manifest lists it under val_moved); appends
    never move a published record.
    """
    run = _start(batches, tokenizer_dir, bins_dir, settings, workers, log)
    _decide_rebuild(run)
    published = _write_version(run, check) if run.new_version else run.published
    assert published is not None  # no new version: nothing added to the latest one, so there is one
    return _report(run, published)


def _start(batches, tokenizer_dir, bins_dir, settings, workers, log) -> _Run:
    """The batch keys checked, bins_dir recovered to its latest version, the tokenizer pinned, the training type
    chosen (choose_training_type)."""
    started = time.perf_counter()
    bins_dir = Path(bins_dir)
    bins_dir.mkdir(parents=True, exist_ok=True)
    settings = ShardSettings.model_validate(settings.model_dump())  # plain settings travel to the workers
    keys = _batch_keys(batches)
    published = recover(bins_dir, log)
    pin, tokenizer_bytes = pin_tokenizer(tokenizer_dir)
    workers = default_workers() if workers is None else max(1, workers)
    choice = choose_training_type(settings, published, batches, workers)
    return _Run(
        batches=batches,
        keys=keys,
        tokenizer_dir=tokenizer_dir,
        bins_dir=bins_dir,
        settings=settings,
        workers=workers,
        log=log,
        started=started,
        published=published,
        pin=pin,
        tokenizer_bytes=tokenizer_bytes,
        choice=choice,
        forgotten=read_forgotten(bins_dir),
    )


def _decide_rebuild(run: _Run) -> None:
    """A new generation (every batch encoded again, the training type chosen again if inherited) or an append of the
    new batches; the counts of the published batches kept."""
    published = run.published
    run.reason = rebuild_reason(published, run.pin.sha256, run.resolved.encoding(), run.keys)
    if run.reason is not None and run.choice.inherited:  # a new generation chooses again, from all its records
        run.choice = records_choice(run.batches, run.settings.task_bytes, run.workers)
    if run.reason is None:
        assert published is not None  # rebuild_reason: "first build" without one
        run.kept, run.generation = published.batches, published.generation
    else:
        run.generation = published.generation + 1 if published else 1
    run.totals = {key: load_batch_totals(run.bins_dir, run.generation, key) for key in run.kept}


def _write_version(run: _Run, check: Callable[[int], None] | None) -> Published:
    """Encodes the added batches and publishes the version holding them (returned); on any error, what this run
    wrote is removed (no version names it)."""
    run.info(
        f"tokenized_bins: generation {run.generation} ({run.reason or 'append'}), encoding {len(run.added)} batches "
        f"as {run.choice.resolved} ({run.choice.reason})"
    )
    try:
        encoded = _encode(run)
        encoded = _confirm_training_type(run, encoded)
        encoded = _top_up_validation(run, encoded)
        manifests = _publish(run, encoded, check)
    except BaseException:
        recover(run.bins_dir, run.log)
        raise
    return Published.of(manifests)


def _encode(run: _Run) -> Encoded:
    run.enc = encoder(run.pin)
    run.dtype = token_dtype_for(run.enc.vocab_size, run.settings.token_dtype)
    return _encode_batches(run)


def _encode_again(run: _Run) -> Encoded:
    recover(run.bins_dir)  # removes the shards and counts just written: no version names them
    return _encode_batches(run, run.moved)


def _confirm_training_type(run: _Run, encoded: Encoded) -> Encoded:
    """A training type guessed from the first records, checked against every record encoded: encoded again if the
    guess was wrong."""
    if not run.choice.guessed:
        return encoded
    guessed, run.choice = run.choice, encoded.choice()
    if run.choice.resolved == guessed.resolved:
        return encoded
    run.info(f"tokenized_bins: encoding again as {run.choice.resolved} ({run.choice.reason})")
    return _encode_again(run)


def _top_up_validation(run: _Run, encoded: Encoded) -> Encoded:
    """A generation's first version that leaves val empty with val asked for and 2 records or more: the train record
    with the smallest split hash (the same for any worker count) is moved into val, and every batch encoded again."""
    val = sum(t.splits["val"].records for t in encoded.totals.values())
    train = sum(t.splits["train"].records for t in encoded.totals.values())
    if run.kept or run.settings.val_fraction == 0 or val or train < 2:
        return encoded
    assert encoded.first_train is not None  # set by the first train record (2 or more here)
    run.moved = frozenset({encoded.first_train[1]})
    run.info(f"tokenized_bins: val is empty; moving record {min(run.moved)} there and encoding again")
    return _encode_again(run)


def _publish(run: _Run, encoded: Encoded, check: Callable[[int], None] | None) -> dict[str, dict]:
    """The new version's manifests (the kept shards, then the new ones), published once `check` passes."""
    run.tasks = encoded.tasks
    run.totals.update(encoded.totals)
    enc, dtype = run.encoding()
    shards = _split_shards(run, encoded)
    for s in SPLITS:
        write_tokenizer_copy(run.bins_dir / s, run.tokenizer_bytes, run.pin.sha256)
    manifests = version_manifests(
        version=_version_fields(run),
        training_type=run.resolved.training_type,
        vocab_size=enc.vocab_size,
        token_dtype=dtype,
        tokenizer={
            "file": versioned_tokenizer_file(run.pin.sha256),
            "sha256": run.pin.sha256,
            "vocab_size": enc.vocab_size,
        },
        special=enc.special,
        shards=shards,
        supervised={s: sum(t.splits[s].supervised for t in run.totals.values()) for s in SPLITS},
    )
    publish(run.bins_dir, manifests, run.tokenizer_dir, check)
    return manifests


def _split_shards(run: _Run, encoded: Encoded) -> dict[str, list[dict]]:
    """Each split's shard entries: the kept version's, then the new ones."""
    enc, dtype = run.encoding()
    appended_to = run.appended_to
    shards: dict[str, list[dict]] = {}
    for s in SPLITS:
        shards[s] = (list(appended_to.manifests[s]["shards"]) if appended_to else []) + encoded.shards[s]
        if not shards[s]:  # an empty split still gets one (empty) shard, so it loads
            shards[s] = ShardWriter(
                run.bins_dir / s,
                run.resolved.training_type,
                enc.vocab_size,
                dtype,
                run.settings.shard_tokens,
                first_index=next_shard_index(run.bins_dir / s),
            ).empty_shard()
    return shards


def _version_fields(run: _Run) -> dict:
    """The manifest's version, generation, batches, encoding settings, training type, val_moved and the takedowns
    so far (every later version, of any generation, carries them)."""
    appended_to = run.appended_to
    moved = (appended_to.manifests[SPLITS[0]].get(VAL_MOVED_KEY, []) if appended_to else []) or sorted(run.moved)
    removals = run.published.manifests[SPLITS[0]].get(REMOVALS_KEY) if run.published else None
    return {
        "version": run.published.version + 1 if run.published else 1,
        "generation": run.generation,
        "batches": list(run.keys),
        "encoding": run.resolved.encoding(),
        **run.choice.manifest_entry(),
        **({VAL_MOVED_KEY: moved} if moved else {}),
        **({REMOVALS_KEY: removals} if removals else {}),
    }


def _report(run: _Run, published: Published) -> TokenizeResult:
    """Retention, then the published version's (the latest) result and _rejected.json; returns the result."""
    removed = apply_retention(run.bins_dir, run.settings.retention_hours, run.settings.keep_versions, log=run.log)
    latest = published.manifests[SPLITS[0]]
    result = stage_result(
        run.settings,
        {key: run.totals[key] for key in published.batches},
        published.manifests,
        vocab_size=latest["vocab_size"],
        token_dtype=np.dtype(latest["token_dtype"]),
        seconds=time.perf_counter() - run.started,
        choice=run.choice,
        workers=run.workers,
        tasks=run.tasks,
        version=published.version,
        generation=published.generation,
        new_version=run.new_version,
        rebuild_reason=run.reason,
        batches_added=[key for key, _ in run.added],
        versions=list_versions(run.bins_dir / SPLITS[0]),
        versions_removed=removed,
    )
    rejected = write_rejected(run.bins_dir, (e for key in published.batches for e in run.totals[key].rejected))
    write_result(run.bins_dir, result)
    run.info(
        f"tokenized_bins: version {published.version} (generation {published.generation}, "
        f"{len(published.batches)} batches, {len(run.added)} added): {result.docs_out:,} records, "
        f"{result.tokens:,} tokens, dropped {rejected:,}"
    )
    return result


def tokenize_corpus(
    in_dir: Path, tokenizer_dir: Path, out_dir: Path, settings: ShardSettings, workers: int | None = None, log=None
) -> TokenizeResult:
    """tokenize_batches over one deduped folder, as the single batch named after it (a non-incremental build)."""
    return tokenize_batches([(Path(in_dir).name, Path(in_dir))], tokenizer_dir, out_dir, settings, workers, log)
