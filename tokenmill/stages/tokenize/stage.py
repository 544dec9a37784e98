"""The two stages, step by step: `train_tokenizer` (tokenizer asset) and `tokenize_corpus` (tokenized_bins asset)."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

from tokenmill.common.io import write_stats
from tokenmill.common.parallel import default_workers, map_ordered
from tokenmill.common.progress import Progress
from tokenmill.stages.tokenize.encode import EncodeTask, encode_task, encoder, load_splits, plan_ranges
from tokenmill.stages.tokenize.settings import ShardSettings, TokenizerSettings
from tokenmill.stages.tokenize.shards import RejectedWriter, SplitWriters, token_dtype_for
from tokenmill.stages.tokenize.summary import RunTotals, stage_stats
from tokenmill.stages.tokenize.tokenizer import load_tokenizer, pin_tokenizer, special_token_ids
from tokenmill.stages.tokenize.train import examples, measure, sample_corpus, write_existing, write_trained
from tokenmill_loader.format import SPLITS, TOKENIZER_FILE


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


ENCODED_DIR = ".encoded"  # the encode tasks' arrays, each file removed once packed


def tokenize_corpus(
    in_dir: Path, tokenizer_dir: Path, out_dir: Path, settings: ShardSettings, workers: int | None = None, log=None
) -> dict:
    """Writes out_dir/train/ and out_dir/val/ (docs/format.md), _rejected.json and _stats.json.

    The tokenizer is pinned when the run starts (its SHA-256, recorded in dataset.json); a task that finds
    tokenizer.json changed raises StaleUpstreamError and nothing is published.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    settings = ShardSettings.model_validate(settings.model_dump())  # plain settings travel to the workers
    pin, tokenizer_bytes = pin_tokenizer(tokenizer_dir)
    enc = encoder(pin)
    dtype = token_dtype_for(enc.vocab_size, settings.token_dtype)
    workers = default_workers() if workers is None else max(1, workers)
    ranges = plan_ranges(Path(in_dir), settings.task_bytes, workers)
    threads = workers <= 1 or len(ranges) <= 1  # in-process: let the encoder use every core
    encoded = out_dir / ENCODED_DIR
    encoded.mkdir(parents=True, exist_ok=True)
    tasks = [
        EncodeTask(r, pin, settings, dtype.name, threads, str(encoded / f"r{i:05d}.pkl")) for i, r in enumerate(ranges)
    ]
    totals = RunTotals(settings.training_type)
    progress = Progress("tokenized_bins", total=sum(r.end - r.start for r in ranges), unit="bytes", log=log)
    writers = SplitWriters(out_dir, settings.training_type, enc.vocab_size, dtype, settings.shard_tokens)
    rejected = None
    try:
        rejected = RejectedWriter(out_dir)
        for task, result in zip(tasks, map_ordered(encode_task, tasks, workers)):
            load_splits(result)
            totals.add(result)
            rejected.extend(result.rejected)
            writers.add(result.splits)
            progress.advance(task.range.end - task.range.start)
        rejected.close()
        manifests = writers.publish(
            tokenizer_bytes, pin.sha256, enc.special, {s: totals.splits[s].supervised for s in SPLITS}
        )
    except BaseException:
        writers.abort()
        if rejected is not None:
            rejected.abort()
        raise
    finally:
        shutil.rmtree(encoded, ignore_errors=True)
    progress.finish()
    stats = stage_stats(
        settings,
        totals,
        manifests,
        enc=enc,
        token_dtype=dtype,
        bytes_on_disk=writers.bytes_per_key(),
        seconds=time.perf_counter() - t0,
        workers=workers,
        tasks=len(tasks),
    )
    write_stats(out_dir, stats)
    if log:
        log.info(
            f"tokenized_bins: {stats['docs_out']:,} records, {stats['tokens']:,} tokens "
            f"({stats['tokens_per_second']:,.0f}/s), dropped {rejected.count:,}"
        )
    return stats
