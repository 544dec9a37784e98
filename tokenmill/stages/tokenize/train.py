"""Tokenizer training: a byte-level BPE trained on a bounded, deterministic sample of the records.

Training on every record is slow (well over a minute on the whole ~90k-poem corpus) and buys almost nothing: with a
4,096 vocabulary, chars per token on held-out poems barely moves between 0.5 M and 4 M sampled characters (GPT-2 split).
So the trainer sees the records with the smallest `hash(id)` until `sample_chars` characters are collected (same input,
same sample; adding records changes it only at the margin; only the records taken are JSON-parsed), and 1 record in 20
(by the same hash) is never trained on, so chars per token is measured on held-out text.

The HF trainer is deterministic for a given input (same bytes of tokenizer.json whatever the thread
count, checked with RAYON_NUM_THREADS=1/2), and runs faster single-threaded on a busy 2-core machine (its
parallel pair counting merges per-thread hash sets; docs/profile.md, 'What changed in this round'), so it runs with
TOKENIZERS_PARALLELISM=false.

Pre-tokenization: `punct_attach` (default) is GPT-2's byte-level split except that punctuation stays
on the word before it, so BPE can merge "光，": on Chinese poetry isolated punctuation tokens become rare and
held-out chars/token rises.
`bytelevel` is the plain GPT-2 split. Both decode back byte-exactly.

Special tokens take ids 0.. in SPECIAL_TOKENS order. With `tokenizer_path`, an existing tokenizer.json
is used instead (nothing is downloaded); special tokens it lacks are appended (reported in stats).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_file, atomic_write_text, loads, record_shards
from tokenmill.common.parallel import map_ordered
from tokenmill.common.progress import Progress
from tokenmill.errors import CorruptOutputError, SourceError
from tokenmill.stages.tokenize.settings import TokenizerSettings
from tokenmill.stages.tokenize.tokenizer import hash64, load_tokenizer, tokenizer_file
from tokenmill.stages.tokenize.transformers_config import write_transformers_config
from tokenmill_loader.format import SPECIAL_TOKENS, TOKENIZER_FILE

# GPT-2's split with trailing punctuation kept on letter/number runs (every character still matched once)
PUNCT_ATTACH_PATTERN = r" ?\p{L}+\p{P}*| ?\p{N}+\p{P}*| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
HELD_OUT_MODULUS = 20  # records with hash % 20 == 0 are never trained on (held-out text for chars/token)
EXAMPLES = 3  # held-out texts shown tokenized in the stats
EXAMPLE_CHARS = 60
EXAMPLE_TOKENS = 24


@dataclass(kw_only=True)
class Sample:
    """What the trainer sees and what measures it: texts in ascending id-hash order."""

    train: list[str]
    held_out: list[str]
    records: int
    corpus_bytes: int


def training_text(rec: dict) -> str:
    """Every string a record contributes to rendering (text, title/author, chat and preference fields)."""
    parts = []
    meta = rec.get("meta")
    if isinstance(meta, dict):
        for k in ("title", "author"):
            if isinstance(meta.get(k), str) and meta[k]:
                parts.append(meta[k])
    if isinstance(rec.get("text"), str):
        parts.append(rec["text"])
    msgs = rec.get("messages")
    if isinstance(msgs, list):
        parts.extend(m["content"] for m in msgs if isinstance(m, dict) and isinstance(m.get("content"), str))
    for k in ("prompt", "chosen", "rejected"):
        if isinstance(rec.get(k), str):
            parts.append(rec[k])
    if isinstance(rec.get("responses"), list):
        parts.extend(r for r in rec["responses"] if isinstance(r, str))
    return "\n".join(parts)


@contextlib.contextmanager
def _tokenizers_threads(enabled: bool):
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if enabled else "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def line_id(line: bytes) -> str | None:
    """The record id of a tokenmill JSONL line without parsing it (lines start with {"id": "...")."""
    if line.startswith(b'{"id": "'):
        end = line.find(b'"', 8)
        if end > 0 and b"\\" not in line[8:end]:
            return line[8:end].decode("utf-8")
    return None


def parse_record(line: bytes, path, lineno: int, parse=loads) -> dict:
    """One line of deduped_jsonl (tokenmill's own output): a JSON object, or corruption. `parse`: the json_parser
    of the block the line was cut from."""
    try:
        rec = parse(line)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise CorruptOutputError(f"{path}:{lineno}: not a JSON record ({e})") from e
    if not isinstance(rec, dict):
        raise CorruptOutputError(f"{path}:{lineno}: not a JSON object")
    return rec


ALL_HASHES = 1 << 64  # a cutoff above every hash: every record a candidate
TEXT_CHARS_PER_BYTE = 1 / 8  # the least text a line's byte is assumed to carry when the first cutoff is chosen
CUTOFF_GROWTH = 4  # a cutoff that left a budget unfilled grows by this factor


def id_hashes(part: Path, below: int = ALL_HASHES) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A task: the sample hash of the record ids of one part file that hash below `below`, with each record's byte
    offset and line number, and the records in the file (the id read from the line head; a line that does not start
    with it is parsed)."""
    hashes, offsets, linenos = [], [], []
    records = 0
    with open(part, "rb") as f:
        off = 0
        for lineno, line in enumerate(f, 1):
            if line.strip():
                rid = line_id(line)
                if rid is None:
                    rid = str(parse_record(line, part, lineno).get("id", ""))
                h = hash64("tokenizer-sample", rid)
                records += 1
                if h < below:
                    hashes.append(h)
                    offsets.append(off)
                    linenos.append(lineno)
            off += len(line)
    return (
        np.array(hashes, dtype=np.uint64),
        np.array(offsets, dtype=np.int64),
        np.array(linenos, dtype=np.int64),
        records,
    )


def first_cutoff(settings: TokenizerSettings, corpus_bytes: int) -> int:
    """The hash below which the records are likely to fill both budgets: their share of the corpus, assuming a line
    byte carries TEXT_CHARS_PER_BYTE characters of text (every record when a budget is 0: unlimited)."""
    wanted = max(settings.sample_chars, settings.held_out_chars * HELD_OUT_MODULUS)
    if not settings.sample_chars or not settings.held_out_chars or not corpus_bytes:
        return ALL_HASHES
    share = wanted / (corpus_bytes * TEXT_CHARS_PER_BYTE)
    return ALL_HASHES if share >= 1 else int(share * ALL_HASHES)


def sample_corpus(in_dir: Path, settings: TokenizerSettings, log=None) -> Sample:
    """Training sample and held-out texts: in ascending id-hash order, the longest prefix of each group
    (held out: hash % 20 == 0; the rest) whose text fits the budget (at least one record).

    Pass 1 hashes every line's id (read from the line head, no JSON parsing), a task per part file on the active
    engine, and keeps only the records hashing below a cutoff (first_cutoff: the sample's likely share of the
    corpus), so this process holds the sample's candidates, not a hash per record; pass 2 parses only the records
    taken, in hash order. A cutoff that leaves a budget unfilled grows CUTOFF_GROWTH-fold and pass 1 runs again.
    Independent of file order and cut, and of the cutoff; adding records moves it only at the margin.
    """
    parts = record_shards(in_dir)
    corpus_bytes = sum(p.stat().st_size for p in parts)
    below = first_cutoff(settings, corpus_bytes)
    while True:
        progress = Progress("tokenizer sample", total=len(parts), unit="shards", log=log)
        found = []
        for part_keys in map_ordered(partial(id_hashes, below=below), parts):
            found.append(part_keys)
            progress.advance()
        progress.finish()
        hashes = np.concatenate([f[0] for f in found] or [np.zeros(0, np.uint64)])
        part_of = np.repeat(np.arange(len(found)), [len(f[0]) for f in found])
        offsets = np.concatenate([f[1] for f in found] or [np.zeros(0, np.int64)])
        linenos = np.concatenate([f[2] for f in found] or [np.zeros(0, np.int64)])
        in_order = ((part_of[i], offsets[i], int(linenos[i]), hashes[i]) for i in np.argsort(hashes, kind="stable"))
        train_texts, held_texts, filled = _take_texts(parts, in_order, settings)
        if filled or below >= ALL_HASHES:
            break
        below = min(ALL_HASHES, below * CUTOFF_GROWTH)
    if not train_texts and held_texts:  # tiny corpus: everything fell into the held-out share
        train_texts, held_texts = held_texts, []
    return Sample(train=train_texts, held_out=held_texts, records=sum(f[3] for f in found), corpus_bytes=corpus_bytes)


def _take_texts(
    parts: list[Path], records: Iterable[tuple], settings: TokenizerSettings
) -> tuple[list[str], list[str], bool]:
    """The training and held-out texts of `records` ((part index, byte offset, line number, hash), in hash order),
    each group up to its budget, and whether both budgets were filled (a record that did not fit was met in each)."""
    groups: dict[bool, tuple[list[str], int]] = {
        True: ([], settings.held_out_chars),
        False: ([], settings.sample_chars),
    }  # held? -> (texts, budget)
    used = {True: 0, False: 0}
    closed = {True: False, False: False}
    handles = [open(p, "rb") for p in parts]
    try:
        for pi, off, lineno, h in records:
            held = bool(h % HELD_OUT_MODULUS == 0)
            if closed[held]:
                if closed[not held]:
                    break
                continue
            handles[pi].seek(off)
            text = training_text(parse_record(handles[pi].readline(), parts[pi], lineno))
            if not text:
                continue
            texts, budget = groups[held]
            if budget and texts and used[held] + len(text) > budget:
                closed[held] = True
                continue
            texts.append(text)
            used[held] += len(text)
    finally:
        for f in handles:
            f.close()
    return groups[False][0], groups[True][0], closed[True] and closed[False]


def build_trainer_tokenizer(vocab_size: int, min_frequency: int, pretokenizer: str = "bytelevel"):
    """An empty byte-level BPE tokenizer with the chosen pre-tokenizer, and its trainer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if pretokenizer == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:  # punct_attach (settings allow no other)
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PUNCT_ATTACH_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def write_trained(sample: Sample, settings: TokenizerSettings, out_dir: Path, log=None) -> dict:
    """Trains BPE on the sample and writes out_dir/tokenizer.json; returns what it did."""
    if not sample.train:
        raise SourceError(f"{out_dir}: no records with text to train a tokenizer on")
    tok, trainer = build_trainer_tokenizer(settings.vocab_size, settings.min_frequency, settings.pretokenizer)
    chars = sum(map(len, sample.train))
    if log:
        log.info(f"training BPE (vocab {settings.vocab_size}) on {len(sample.train):,} records, {chars:,} chars")
    with _tokenizers_threads(False):
        tok.train_from_iterator(sample.train, trainer=trainer, length=len(sample.train))
    atomic_write_text(out_dir / TOKENIZER_FILE, tok.to_str())
    write_transformers_config(out_dir)
    return {"mode": "trained", "sample_records": len(sample.train), "sample_chars": chars}


def write_existing(settings: TokenizerSettings, out_dir: Path) -> dict:
    """Copies the tokenizer.json of settings.tokenizer_path (adding the special tokens it lacks)."""
    src = tokenizer_file(settings.tokenizer_path)
    tok = load_tokenizer(src)
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        tok.add_special_tokens(missing)
        atomic_write_text(out_dir / TOKENIZER_FILE, tok.to_str())
    else:
        with open(src, "rb") as given, atomic_file(out_dir / TOKENIZER_FILE, "wb") as f:
            shutil.copyfileobj(given, f)
    write_transformers_config(out_dir)
    return {
        "mode": "existing",
        "source": str(src),
        "special_tokens_added": missing,
        "sample_records": 0,
        "sample_chars": 0,
    }


def examples(tok, texts: list[str]) -> list[dict]:
    """The first texts cut short, tokenized: token count, first ids and pieces, and whether they decode back."""
    out = []
    for t in texts[:EXAMPLES]:
        t = t[:EXAMPLE_CHARS]
        enc = tok.encode(t, add_special_tokens=False)
        out.append(
            {
                "text": t,
                "tokens": len(enc.ids),
                "ids": enc.ids[:EXAMPLE_TOKENS],
                "pieces": [tok.decode([i]) for i in enc.ids[:EXAMPLE_TOKENS]],
                "roundtrip": tok.decode(enc.ids, skip_special_tokens=False) == t,
            }
        )
    return out


def measure(tok, held: list[str]) -> dict:
    """Chars per token on held-out text (never trained on)."""
    chars = sum(map(len, held))
    tokens = sum(len(e.ids) for e in tok.encode_batch(held, add_special_tokens=False)) if held else 0
    return {
        "held_out_records": len(held),
        "held_out_chars": chars,
        "held_out_tokens": tokens,
        "chars_per_token": round(chars / tokens, 4) if tokens else None,
    }
