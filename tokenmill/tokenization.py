"""The `tokenizer` stage: a byte-level BPE tokenizer trained on a bounded, deterministic sample.

Training on every record is what makes the seed slow (the tokenizer trainer spends 100+ s on the
whole poetry corpus) and buys almost nothing: with a 4,096 vocabulary, chars per token on held-out
poems is 1.0063 after 1 M sampled characters and 1.0083 after 4 M. So the trainer sees the records
with the smallest `hash(id)` until `sample_chars` characters are collected (bottom-k sampling: the
same input gives the same sample, and adding records changes it only at the margin), and 1 record in
20 (by the same hash) is never trained on, so chars per token is measured on held-out text.

The HF trainer is deterministic for a given input (same bytes of tokenizer.json whatever the thread
count, checked with RAYON_NUM_THREADS=1/2), and runs about twice as fast single-threaded on a busy
2-core machine (its parallel pair counting merges per-thread hash sets), so it runs with
TOKENIZERS_PARALLELISM=false.

Special tokens take ids 0.. in SPECIAL_TOKENS order. With `tokenizer_path`, an existing tokenizer.json
is used instead (nothing is downloaded); special tokens it lacks are appended (reported in stats).
"""
from __future__ import annotations

import contextlib
import hashlib
import heapq
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenmill.io import STATS_FILE, atomic_write_json, atomic_write_text, iter_jsonl, record_shards
from tokenmill.progress import Progress

TOKENIZER_FILE = "tokenizer.json"

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<|title|>", "<|author|>", "<|content|>",
                  "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

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


def _sample(in_dir: Path, sample_chars: int, held_out_chars: int, log=None):
    """One pass: bottom-k-by-hash records within each character budget (training sample, held-out)."""
    train_heap: list = []  # max-heap via negative hash: (-h, chars, text)
    held_heap: list = []
    train_chars = held_chars = 0
    n = total_chars = 0
    progress = Progress("tokenizer sample", unit="records", log=log)
    for path in record_shards(in_dir):
        for rec in iter_jsonl(path):
            text = training_text(rec)
            if not text:
                continue
            n += 1
            total_chars += len(text)
            h = hash64("tokenizer-sample", str(rec.get("id", "")))
            if h % HELD_OUT_MODULUS == 0:
                heap, budget = held_heap, held_out_chars
                held_chars += len(text)
                heapq.heappush(heap, (-h, len(text), text))
                while held_chars > budget and len(heap) > 1:
                    held_chars -= heapq.heappop(heap)[1]
            else:
                heap, budget = train_heap, sample_chars
                train_chars += len(text)
                heapq.heappush(heap, (-h, len(text), text))
                while budget and train_chars > budget and len(heap) > 1:
                    train_chars -= heapq.heappop(heap)[1]
            progress.advance()
    progress.finish()
    # ascending hash order: deterministic and independent of file order
    train = [t for _, _, t in sorted(train_heap, reverse=True)]
    held = [t for _, _, t in sorted(held_heap, reverse=True)]
    if not train and held:  # tiny corpus: everything fell into the held-out share
        train, held = held, []
    return train, held, n, total_chars


def build_trainer_tokenizer(vocab_size: int, min_frequency: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
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
    train, held, n_records, total_chars = _sample(in_dir, settings.sample_chars, settings.held_out_chars, log)
    t_sample = time.perf_counter() - t0
    stats: dict = {"settings": asdict(settings), "docs_in": n_records, "docs_out": n_records,
                   "corpus_chars": total_chars}
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
        tok, trainer = build_trainer_tokenizer(settings.vocab_size, settings.min_frequency)
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
