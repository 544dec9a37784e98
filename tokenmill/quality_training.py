"""Training a fastText quality classifier (`tokenmill train-quality`): positive and negative texts from source files
of any format tokenmill reads, prepared as cleaned_jsonl prepares them (repair, normalization, PII masking, header
metadata out: its rules 0-6 with the default settings; boilerplate stripping is corpus-wide and the filters drop
rather than change a text, so neither applies), a seeded held-out share for the metrics, and model.json beside the
model. It lives here, above the stages, because it reads through the raw stage and prepares through the clean one;
the scoring side (tokenmill.stages.quality_model) imports neither."""

from __future__ import annotations

import importlib.metadata
import random
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import cast

import numpy as np

from tokenmill.common.io import file_sha256
from tokenmill.errors import ConfigError, SourceError
from tokenmill.stages.clean.prepare import BATCH, prepare_batch
from tokenmill.stages.clean.report import Timer
from tokenmill.stages.clean.settings import CleanSettings
from tokenmill.stages.quality_model import (
    QualityModelCard,
    QualityTrainSettings,
    held_out_metrics,
    load_quality_model,
    model_id,
    train_fasttext,
)
from tokenmill.stages.quality_model.settings import FASTTEXT_FILE
from tokenmill.stages.raw.discover import reader_kind
from tokenmill.stages.raw.ingest import reader
from tokenmill.stages.raw.records import Mapped, map_record
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import FileTooLarge, Found, Rejected


def source_files(path: Path) -> list[Path]:
    """`path` itself, or the files of a folder tokenmill reads (sorted; hidden ones left out)."""
    if path.is_dir():
        return sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and reader_kind(p.name)[0] is not None and not any(s.startswith(".") for s in p.parts)
        )
    if not path.is_file():
        raise SourceError(f"train-quality: no such file: {path}")
    if reader_kind(path.name)[0] is None:
        raise SourceError(f"train-quality: {path}: not a format tokenmill reads (jsonl, json, txt, csv, parquet, ...)")
    return [path]


def source_texts(path: Path, settings: RawSettings) -> Iterator[str]:
    """The text of every record raw_records would make of one source file; records it would reject are skipped,
    an unreadable file raises SourceError."""
    kind, compression = reader_kind(path.name)
    items = reader(cast(str, kind))(str(path), compression, settings)
    try:
        for item in items:
            if not isinstance(item, Found):  # a bad line or a WARC record that is not a document
                continue
            if kind == "txt":
                yield cast(str, item.value)
            elif isinstance(item.value, Mapped):  # the web readers' records
                yield item.value.text
            elif isinstance(item.value, dict):
                try:
                    yield map_record(item.value, settings).text
                except Rejected:
                    continue
    except (OSError, EOFError, zlib.error, FileTooLarge) as e:  # as raw_records: unreadable, truncated, a bomb
        raise SourceError(f"train-quality: {path}: unreadable ({type(e).__name__}: {e})") from None


def prepare_texts(texts: list[str], settings: CleanSettings) -> list[str]:
    """The texts as cleaned_jsonl writes them (rules 0-6), the ones it rejects (too long) and empty ones left out."""
    prepared = []
    for start in range(0, len(texts), BATCH):
        batch = [(b"", {"text": text, "meta": {}}) for text in texts[start : start + BATCH]]
        for entry in prepare_batch(batch, settings, Timer(), Counter()):
            if entry.reject is None and entry.text.strip():
                prepared.append(entry.text)
    return prepared


def read_class(paths: list[Path], name: str) -> tuple[list[str], list[dict]]:
    """The prepared texts of one class, and a card entry per file (path, sha256, bytes, texts)."""
    raw, clean = RawSettings(), CleanSettings()
    texts, entries = [], []
    for path in (file for given in paths for file in source_files(Path(given))):
        try:
            sha256 = file_sha256(path)
        except OSError as e:
            raise SourceError(f"train-quality: {path}: unreadable ({type(e).__name__}: {e})") from None
        prepared = prepare_texts(list(source_texts(path, raw)), clean)
        texts.extend(prepared)
        entries.append({"path": str(path), "sha256": sha256, "bytes": path.stat().st_size, "texts": len(prepared)})
    if not entries:
        raise SourceError(f"train-quality: no {name} file tokenmill reads in {', '.join(map(str, paths))}")
    return texts, entries


def split_held_out(count: int, share: float, rng: random.Random) -> tuple[list[int], list[int]]:
    """(training, held-out) positions of a class of `count` texts: a seeded shuffle, at least one of each."""
    order = list(range(count))
    rng.shuffle(order)
    held = min(max(1, round(count * share)), count - 1)
    return order[held:], order[:held]


def train_quality_model(
    positive: list[Path], negative: list[Path], out: Path, settings: QualityTrainSettings
) -> QualityModelCard:
    """Trains a fastText classifier of positive against negative texts into `out` (model.bin and model.json) and
    returns its card. Refuses (SourceError, ConfigError: one line) a missing or unreadable file and a class with
    fewer than `settings.min_examples` texts, or a file given for both classes."""
    settings.validate()
    classes = {"positive": read_class(positive, "positive"), "negative": read_class(negative, "negative")}
    both = {e["sha256"] for e in classes["positive"][1]} & {e["sha256"] for e in classes["negative"][1]}
    if both:  # one class under two names: nothing to tell apart
        same = next(e["path"] for e in classes["negative"][1] if e["sha256"] in both)
        raise ConfigError(f"train-quality: {same} is among both the positive and the negative files")
    for name, (texts, _) in classes.items():
        if len(texts) < settings.min_examples:
            raise ConfigError(
                f"train-quality: {len(texts)} {name} texts, fewer than the {settings.min_examples} each class needs"
            )
    rng = random.Random(settings.seed)
    splits = {name: split_held_out(len(texts), settings.held_out_share, rng) for name, (texts, _) in classes.items()}
    per_class = min(len(train) for train, _ in splits.values())  # balanced: the larger class subsampled
    train_rows = [
        (classes[name][0][i], name == "positive") for name, (train, _) in splits.items() for i in train[:per_class]
    ]
    rng.shuffle(train_rows)  # fastText's learning rate decays over the file: the classes interleaved
    held_rows = [(classes[name][0][i], name == "positive") for name, (_, held) in splits.items() for i in held]

    out.mkdir(parents=True, exist_ok=True)
    model_path = out / FASTTEXT_FILE
    train_fasttext([t for t, _ in train_rows], [p for _, p in train_rows], model_path, settings)
    scores = load_quality_model(model_path).score([t for t, _ in held_rows])
    card = QualityModelCard(
        model_file=FASTTEXT_FILE,
        model_id=model_id(model_path),
        inputs={name: entries for name, (_, entries) in classes.items()},
        parameters={**asdict(settings), "loss": "softmax", "thread": 1, "balance": "subsample the larger class"},
        examples={
            name: {"read": len(texts), "trained": per_class, "held_out": len(splits[name][1])}
            for name, (texts, _) in classes.items()
        },
        metrics=held_out_metrics(scores, np.array([p for _, p in held_rows]), settings.histogram_bins),
        tokenmill_version=importlib.metadata.version("tokenmill"),
    )
    card.write(out)
    return card
