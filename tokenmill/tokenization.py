"""The `tokenizer` stage: a byte-level BPE tokenizer trained on a bounded, deterministic sample.

Training on every record is what makes the seed slow (the tokenizer trainer spends 100+ s on the
whole poetry corpus) and buys almost nothing: with a 4,096 vocabulary, chars per token on held-out
poems is 1.0051 after 0.5 M sampled characters, 1.0063 after 1 M and 1.0083 after 4 M (GPT-2 split;
40-90 s to train on all 7.9 M). So the trainer sees the records with the smallest `hash(id)` until
`sample_chars` characters are collected (same input, same sample; adding records changes it only at the
margin; only the records taken are JSON-parsed), and 1 record in 20 (by the same hash) is never trained
on, so chars per token is measured on held-out text.

The HF trainer is deterministic for a given input (same bytes of tokenizer.json whatever the thread
count, checked with RAYON_NUM_THREADS=1/2), and runs about twice as fast single-threaded on a busy
2-core machine (its parallel pair counting merges per-thread hash sets), so it runs with
TOKENIZERS_PARALLELISM=false.

Pre-tokenization: `punct_attach` (default) is GPT-2's byte-level split except that punctuation stays
on the word before it, so BPE can merge "光，": on Chinese poetry isolated punctuation tokens fall from
13% to 2% and held-out chars/token rises from 1.006 to 1.048 (the seed's "punctuation attachment").
`bytelevel` is the plain GPT-2 split of the seed's reference script. Both decode back byte-exactly.

Special tokens take ids 0.. in SPECIAL_TOKENS order. With `tokenizer_path`, an existing tokenizer.json
is used instead (nothing is downloaded); special tokens it lacks are appended (reported in stats).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import STATS_FILE, atomic_write_json, atomic_write_text, record_shards
from tokenmill.common.progress import Progress

TOKENIZER_FILE = "tokenizer.json"

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<|title|>", "<|author|>", "<|content|>",
                  "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

# GPT-2's split with trailing punctuation kept on letter/number runs (every character still matched once)
PUNCT_ATTACH_PATTERN = r" ?\p{L}+\p{P}*| ?\p{N}+\p{P}*| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRETOKENIZERS = ("punct_attach", "bytelevel")
HELD_OUT_MODULUS = 20  # records with hash % 20 == 0 are never trained on (held-out text for chars/token)


@dataclass(frozen=True)
class TokenizerSettings:
    """How the tokenizer is trained (or which existing one is used)."""

    vocab_size: int = 4096
    """Vocabulary size including the special tokens (uint16 token files up to 65,536)."""
    min_frequency: int = 2
    """A pair must occur this often in the sample to be merged."""
    sample_chars: int = 1_000_000
    """Characters of training text sampled (records with the smallest id hash first); 0 = every record."""
    held_out_chars: int = 200_000
    """Characters of held-out text (records never trained on) used to measure chars per token."""
    pretokenizer: str = "punct_attach"
    """punct_attach: GPT-2 byte-level split, but punctuation stays with the word before it ("明月光，"), so BPE can
    absorb it (isolated punctuation 13% -> 2% of poetry tokens, 4% fewer tokens); bytelevel: plain GPT-2 split."""
    tokenizer_path: str = ""
    """An existing tokenizer.json (or a folder holding one) to use instead of training; empty = train."""


def hash64(*parts: str) -> int:
    """A stable 64-bit hash of strings (blake2b), the basis of every sampling/split/dropout decision."""
    return int.from_bytes(hashlib.blake2b("\0".join(parts).encode("utf-8"), digest_size=8).digest(), "little")


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


def _line_id(line: bytes) -> str | None:
    """The record id of a tokenmill JSONL line without parsing it (lines start with {"id": "...")."""
    if line.startswith(b'{"id": "'):
        end = line.find(b'"', 8)
        if end > 0 and b"\\" not in line[8:end]:
            return line[8:end].decode("utf-8")
    return None


def _parse(line: bytes, path, lineno: int) -> dict:
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}:{lineno}: not a JSON record ({e})") from e
    return rec if isinstance(rec, dict) else {}


def _sample(in_dir: Path, sample_chars: int, held_out_chars: int, log=None):
    """Training sample and held-out texts: in ascending id-hash order, the longest prefix of each group
    (held out: hash % 20 == 0; the rest) whose text fits the budget (at least one record).

    Pass 1 hashes every line's id (read from the line head, no JSON parsing); pass 2 parses only the
    records taken, in hash order. Independent of file order and cut; adding records moves it only at
    the margin.
    """
    parts = record_shards(in_dir)
    hashes: list[int] = []
    where: list[tuple[int, int, int]] = []  # (part, byte offset, line number)
    progress = Progress("tokenizer sample", total=len(parts), unit="shards", log=log)
    for pi, p in enumerate(parts):
        with open(p, "rb") as f:
            off = 0
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    rid = _line_id(line)
                    if rid is None:
                        rid = str(_parse(line, p, lineno).get("id", ""))
                    hashes.append(hash64("tokenizer-sample", rid))
                    where.append((pi, off, lineno))
                off += len(line)
        progress.advance()
    progress.finish()
    order = np.argsort(np.array(hashes, dtype=np.uint64), kind="stable")
    groups = {True: ([], held_out_chars), False: ([], sample_chars)}  # held? -> (texts, budget)
    used = {True: 0, False: 0}
    closed = {True: False, False: False}
    handles = [open(p, "rb") for p in parts]
    try:
        for i in order:
            held = hashes[i] % HELD_OUT_MODULUS == 0
            if closed[held]:
                if closed[not held]:
                    break
                continue
            pi, off, lineno = where[i]
            handles[pi].seek(off)
            text = training_text(_parse(handles[pi].readline(), parts[pi], lineno))
            if not text:
                continue
            texts, budget = groups[held]
            if budget and texts and used[held] + len(text) > budget:
                closed[held] = True
                continue
            texts.append(text)
            used[held] += len(text)
    finally:
        for h in handles:
            h.close()
    train_texts, held_texts = groups[False][0], groups[True][0]
    if not train_texts and held_texts:  # tiny corpus: everything fell into the held-out share
        train_texts, held_texts = held_texts, []
    return train_texts, held_texts, len(hashes), sum(p.stat().st_size for p in parts)


def build_trainer_tokenizer(vocab_size: int, min_frequency: int, pretokenizer: str = "bytelevel"):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if pretokenizer == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif pretokenizer == "punct_attach":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PUNCT_ATTACH_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise ValueError(f"pretokenizer must be one of {PRETOKENIZERS}, not {pretokenizer!r}")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    return tok, trainer


def load_tokenizer(path: str | os.PathLike):
    """A tokenizers.Tokenizer from a tokenizer.json (or a folder holding one), with a clear error."""
    from tokenizers import Tokenizer

    p = Path(path).expanduser()
    if p.is_dir():
        p = p / TOKENIZER_FILE
    if not p.exists():
        raise FileNotFoundError(f"tokenizer file not found: {p}")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # the Rust error says what is wrong with the JSON
        raise ValueError(f"{p}: not a loadable tokenizers tokenizer.json ({e})") from e


def special_token_ids(tok) -> dict[str, int]:
    """Our special tokens -> id (every one must exist)."""
    ids = {}
    for t in SPECIAL_TOKENS:
        i = tok.token_to_id(t)
        if i is None:
            raise ValueError(f"tokenizer lacks the special token {t!r}")
        ids[t] = i
    return ids


def _examples(tok, texts: list[str], k: int = 3) -> list[dict]:
    out = []
    for t in texts[:k]:
        t = t[:60]
        enc = tok.encode(t, add_special_tokens=False)
        out.append({"text": t, "tokens": len(enc.ids), "ids": enc.ids[:24],
                    "pieces": [tok.decode([i]) for i in enc.ids[:24]],
                    "roundtrip": tok.decode(enc.ids, skip_special_tokens=False) == t})
    return out


def train_tokenizer(in_dir: Path, out_dir: Path, settings: TokenizerSettings, log=None) -> dict:
    """Trains (or copies) the tokenizer; writes out_dir/tokenizer.json and _stats.json; returns the stats."""
    t0 = time.perf_counter()
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, held, n_records, total_bytes = _sample(in_dir, settings.sample_chars, settings.held_out_chars, log)
    t_sample = time.perf_counter() - t0
    stats: dict = {"settings": asdict(settings), "docs_in": n_records, "docs_out": n_records,
                   "corpus_bytes": total_bytes}
    t1 = time.perf_counter()
    if settings.tokenizer_path:
        src = Path(settings.tokenizer_path).expanduser()
        src = src / TOKENIZER_FILE if src.is_dir() else src
        tok = load_tokenizer(src)
        missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
        if missing:
            tok.add_special_tokens(missing)
            atomic_write_text(out_dir / TOKENIZER_FILE, tok.to_str())
        else:
            tmp = out_dir / f".{TOKENIZER_FILE}.tmp"
            shutil.copyfile(src, tmp)
            os.replace(tmp, out_dir / TOKENIZER_FILE)
        stats.update({"mode": "existing", "source": str(src), "special_tokens_added": missing,
                      "sample_records": 0, "sample_chars": 0})
        held = held or train
    else:
        if not train:
            raise ValueError(f"{in_dir}: no records with text to train a tokenizer on")
        tok, trainer = build_trainer_tokenizer(settings.vocab_size, settings.min_frequency, settings.pretokenizer)
        if log:
            log.info(f"training BPE (vocab {settings.vocab_size}) on {len(train):,} records, "
                     f"{sum(map(len, train)):,} chars")
        with _tokenizers_threads(False):
            tok.train_from_iterator(train, trainer=trainer, length=len(train))
        atomic_write_text(out_dir / TOKENIZER_FILE, tok.to_str())
        stats.update({"mode": "trained", "sample_records": len(train), "sample_chars": sum(map(len, train))})
    t_train = time.perf_counter() - t1
    tok = load_tokenizer(out_dir / TOKENIZER_FILE)  # what later stages will load
    special = special_token_ids(tok)
    held_chars = sum(map(len, held))
    held_tokens = sum(len(e.ids) for e in tok.encode_batch(held, add_special_tokens=False)) if held else 0
    stats.update({
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_tokens": special,
        "held_out_records": len(held),
        "held_out_chars": held_chars,
        "held_out_tokens": held_tokens,
        "chars_per_token": round(held_chars / held_tokens, 4) if held_tokens else None,
        "examples": _examples(tok, held or train),
        "tokenizer_sha256": hashlib.sha256((out_dir / TOKENIZER_FILE).read_bytes()).hexdigest(),
        "sample_seconds": round(t_sample, 3),
        "train_seconds": round(t_train, 3),
        "seconds": round(time.perf_counter() - t0, 3),
    })
    atomic_write_json(out_dir / STATS_FILE, stats)
    if log:
        log.info(f"tokenizer: vocab {stats['vocab_size']}, {stats['chars_per_token']} chars/token held out, "
                 f"trained in {t_train:.1f} s")
    return stats
