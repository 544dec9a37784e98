"""Step 1, one task per input chunk: parse, dedup key and digest, shingles, MinHash signatures, band hashes.

Writes, for the chunk: its document table (docs/), its keys and digest index (keys/), its signatures, band hashes
and sketched items (signatures/). Memory: one chunk, and shingle hashes in batches of SHINGLE_BATCH.
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common import text_keys
from tokenmill.stages.dedup import keys as K
from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.layout import (
    DOCS_DIR,
    KEYS_DIR,
    SIGNATURE_DIR,
    Chunk,
    chunk_records,
    folder,
    releases_memory,
)
from tokenmill.stages.dedup.settings import DedupSettings

SHINGLE_BATCH = 1 << 20  # shingles hashed at once in a worker (~40 MB of temporaries)


@dataclass(frozen=True, kw_only=True)
class SketchTask:
    chunk: Chunk
    out_dir: Path
    settings: DedupSettings
    bands: int
    rows: int
    shingle_batch: int | None = None  # None: SHINGLE_BATCH


@dataclass(frozen=True, kw_only=True)
class ChunkSketch:
    """What the parent keeps of a chunk: counts only."""

    stem: str
    records: int
    items: int
    shingle_sizes: dict
    records_per_path: dict
    empty_keys: int


# fields cleaned_jsonl's language identification gives every record: no richer metadata (richest_meta)
IDENTIFIED = frozenset({"language", "language_score"})


def _meta_count(meta) -> int:
    if not isinstance(meta, dict):
        return 0
    return sum(1 for k, v in meta.items() if v not in (None, "", [], {}) and k not in IDENTIFIED)


def _garbage_table() -> np.ndarray:
    """Per BMP code point, and False for the one every later code point is clipped to: whether it is garbage, what
    a broken decode or a missing glyph leaves (replacement character, controls other than tab/newline/CR, private
    use, the placeholder box)."""
    table = np.zeros(0x10001, dtype=bool)
    for lo, hi in ((0x00, 0x08), (0x0B, 0x0C), (0x0E, 0x1F), (0x7F, 0x9F), (0xE000, 0xF8FF), (0x25A1, 0x25A1)):
        table[lo : hi + 1] = True
    table[0xFFFD] = True
    return table


_GARBAGE = _garbage_table()


def text_quality(texts: list[str]) -> np.ndarray:
    """(texts, 3) int64: garbage characters, improper casing, repeated words of each text: the keep rules' quality
    ties, fewer first. Improper casing: cased letters all in one case (an all-lowercase or all-caps copy of a
    text). Repeated words: words (split on whitespace, lowercased) equal to the word before."""
    out = np.zeros((len(texts), 3), dtype=np.int64)
    if not texts:
        return out
    cps = np.frombuffer("".join(texts).encode("utf-32-le"), dtype="<u4")
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    out[:, 0] = text_keys.per_text(_GARBAGE[np.minimum(cps, 0x10000)], text_keys.text_bounds(lengths))
    bad_case, repeats = [], []
    for text in texts:
        lower, upper = text.lower(), text.upper()
        words = lower.split()
        bad_case.append(lower != upper and text in (lower, upper))
        repeats.append(sum(map(operator.eq, words, words[1:])))
    out[:, 1], out[:, 2] = bad_case, repeats
    return out


def _document_table(chunk: Chunk) -> tuple[np.ndarray, list[str], list, list[str]]:
    """(table, texts, meta.language of each, source paths): id, meta_count, text_len, path (index into the paths),
    loc, loc_kind, and the quality fields."""
    ids, meta_counts, paths, locs, kinds, texts, languages = [], [], [], [], [], [], []
    path_index: dict[str, int] = {}
    for rec in chunk_records(chunk):
        text = rec.get("text")
        texts.append(text if isinstance(text, str) else "")
        ids.append(str(rec.get("id", "")).encode("utf-8"))
        meta = rec.get("meta")
        meta_counts.append(_meta_count(meta))
        languages.append(meta.get("language") if isinstance(meta, dict) else None)
        src = rec.get("source") if isinstance(rec.get("source"), dict) else {}
        paths.append(path_index.setdefault(str(src.get("path", "")), len(path_index)))
        kind = 0 if isinstance(src.get("line"), int) else 1 if isinstance(src.get("index"), int) else 2
        locs.append(src["line"] if kind == 0 else src["index"] if kind == 1 else -1)
        kinds.append(kind)
    dtype = [
        ("id", f"S{max([len(i) for i in ids] + [1])}"),
        ("meta_count", "<i4"),
        ("text_len", "<i8"),
        ("key_len", "<i8"),  # shingle units: code points, or words when by_word
        ("by_word", "?"),
        ("path", "<i4"),
        ("loc", "<i8"),
        ("loc_kind", "i1"),
        ("garbage", "<i8"),
        ("bad_case", "i1"),
        ("repeats", "<i8"),
    ]
    table = np.zeros(len(ids), dtype=dtype)
    table["id"], table["meta_count"] = ids, meta_counts
    table["text_len"] = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    table["path"], table["loc"], table["loc_kind"] = paths, locs, kinds
    table["garbage"], table["bad_case"], table["repeats"] = text_quality(texts).T
    return table, texts, languages, list(path_index)


def _signatures(keys: list[str], units: np.ndarray, by_word: np.ndarray, settings: DedupSettings, batch: int):
    """(item_doc, item_n, signatures): one row per (document, shingle code) to sketch."""
    item_doc, item_n = settings.items(units, by_word)
    key_lens = np.asarray([len(k) for k in keys], dtype=np.int64)
    sig = np.empty((len(item_doc), settings.num_perm), dtype=np.uint32)
    for code in np.unique(item_n).tolist():
        sel_all = np.flatnonzero(item_n == code)
        # batches of about `batch` shingles bound the worker's memory whatever the chunk holds
        cut = np.searchsorted(
            np.cumsum(key_lens[item_doc[sel_all]]), np.arange(batch, int(key_lens.sum()) + batch, batch)
        )
        for sel in np.split(sel_all, np.unique(cut[cut < len(sel_all)])):
            if len(sel) == 0:
                continue
            docs = [keys[d] for d in item_doc[sel].tolist()]
            hashes, offsets = mh.coded_shingle_hashes(docs, code, settings.shingle_hash)
            sig[sel] = mh.signatures(hashes, offsets, settings.num_perm, settings.seed)
    return item_doc, item_n, sig


def shingle_keys(
    texts: list[str], s: DedupSettings, languages: list | None = None
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(keys, units, by_word): the keys as shingled (spaced, see keys.dedup_key, when shingled by words; their
    exact_key is the key either way), their length in shingle units (words or code points) and the unit, chosen by
    each record's meta.language (`languages`) where known, else by its script (keys.by_words)."""
    if s.shingles == "chars":
        keys = text_keys.dedup_keys(texts, s.strip_symbols, s.fold_chinese)
        return keys, np.asarray([len(k) for k in keys], dtype=np.int64), np.zeros(len(keys), dtype=bool)
    spaced = text_keys.dedup_keys(texts, s.strip_symbols, s.fold_chinese, spaced=True)
    by_word = text_keys.by_words(spaced, languages)
    keys = [k if w else K.exact_key(k) for k, w in zip(spaced, by_word.tolist())]
    units = np.asarray([k.count(" ") + 1 if w else len(k) for k, w in zip(keys, by_word.tolist())], dtype=np.int64)
    return keys, units, by_word


@releases_memory
def sketch_chunk(task: SketchTask) -> ChunkSketch:
    chunk, s = task.chunk, task.settings
    table, texts, languages, paths = _document_table(chunk)
    keys, units, by_word = shingle_keys(texts, s, languages)
    del texts
    table["key_len"], table["by_word"] = units, by_word
    stem = chunk.stem
    np.save(folder(task.out_dir, DOCS_DIR) / f"{stem}.npy", table)
    (task.out_dir / DOCS_DIR / f"{stem}.paths.json").write_text(json.dumps(paths, ensure_ascii=False), encoding="utf-8")
    K.write_keys(folder(task.out_dir, KEYS_DIR), stem, keys)
    item_doc, item_n, sig = _signatures(keys, units, by_word, s, task.shingle_batch or SHINGLE_BATCH)
    sig_dir = folder(task.out_dir, SIGNATURE_DIR)
    np.save(sig_dir / f"{stem}.npy", sig)
    np.save(sig_dir / f"{stem}.bands.npy", mh.band_hashes(sig, task.bands, task.rows, salt=item_n.astype(np.uint64)))
    np.savez(sig_dir / f"{stem}.items.npz", item_doc=item_doc, item_n=item_n)
    per_path = Counter(table["path"].tolist())
    return ChunkSketch(
        stem=stem,
        records=len(keys),
        items=int(len(item_doc)),
        shingle_sizes=dict(Counter(item_n.tolist())),
        records_per_path={paths[p]: n for p, n in per_path.items()},
        empty_keys=int((units == 0).sum()),
    )
