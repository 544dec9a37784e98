"""A generated corpus of N documents for the scale benchmark (benchmarks/bench_scale.py): deterministic per
(N, seed), cached under a data folder, ~400 bytes of JSONL per document (10M documents: ~4 GB).

usage: python benchmarks/scale_corpus.py N [--data /tmp/tokenmill_scale] [--seed 0] [--stats]

Layout: `<data>/corpus-<N>-s<seed>/source/part-00000.jsonl ...` (DOCS_PER_FILE documents a file), one JSON object
a line, `{"id": "s<seed>-<index>", "text": ..., "metadata": {"script": "Latn"}}` (raw_records flattens
`metadata` into meta, as for dolma files), and beside `source/`: `planted.npz` (which documents are copies of which,
which are spam) and `corpus.json` (the figures below, measured on the files written). The folder is complete once
`corpus.json` exists; a rerun with the same (N, seed) reuses it.

The distribution (every draw from numpy's PCG64 seeded with (seed, chunk index), so the corpus of N documents is
the first N documents of any larger one with the same seed, but for its last, partial chunk):
- length: a target text length in UTF-8 bytes of 50 + a log-normal draw (median MEDIAN_BYTES, sigma SIGMA_BYTES),
  capped at 50,000, turned into a word count with the script's mean bytes per word (rounded up); the text lands
  within a few words of it. Measured on 100k documents (JSON bytes of the text, a line break counting 2): mean 342,
  p10 87, median 204, p90 710, p99 2,230, max 34,581 (the cap is reached from ~10M documents on); 0.09% under 50
  (short words); ~403 bytes a JSONL line with the id and metadata;
- script: Latin (English-like) 70%, Han 10%, Cyrillic 8%, Arabic 6%, Devanagari 6% of documents. Words are drawn
  Zipf-like (rank r with weight 1 / (r + 2.7)) from a vocabulary per script: real common words first (English,
  Russian, Arabic, Hindi stop words; the most frequent Chinese characters), then pseudo-words made of the script's
  letters (shorter ones more frequent), 30,000-50,000 words a script (Han: 5,000 single characters, written without
  spaces). A document is mostly one script: 2% of the words of a non-Latin document are English-like words, 1% of
  all words are numbers;
- structure: sentences (an end mark after a word with probability 1/12, 1/20 for Han characters; commas inside),
  capitalized first words (Latin, Cyrillic); prose documents (85%) break a paragraph (blank line) after 12% of
  sentences and a line after 5%; line documents (15%: lists, verse) put every sentence on its own line;
- planted duplicates: 5% of documents are near copies of an earlier document (half from the current chunk, half
  from a sample of all earlier chunks) with 0.5-4% of their words (at least one) replaced by other words of the
  same script; 1% are exact copies. Copies are of original documents only (not of copies or spam);
- spam: 1% of documents repeat one short line (1-8 words) to their length (at least 4 lines: the clean stage's
  repetition filter drops every one of them, and nothing else, on 20k and 100k documents).

Generation is numpy-vectorized per chunk of CHUNK_DOCS documents (words and separators are gathered as byte
ranges from one table; the JSON is assembled as bytes, the text needing no escaping beyond its line breaks), so
only the per-document join runs in Python.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHUNK_DOCS = 20_000  # documents generated at once: ~7 MB of text, ~60 MB of index arrays
DOCS_PER_FILE = 100_000  # ~40 MB a file: 100 files at 10M (raw_records reads whole files per task)
MEDIAN_BYTES = 150  # text length - MIN_BYTES is log-normal with this median: with SIGMA_BYTES, ~340 bytes mean
SIGMA_BYTES = 1.15
MIN_BYTES, MAX_BYTES = 50, 50_000
NEAR_SHARE, EXACT_SHARE, SPAM_SHARE = 0.05, 0.01, 0.01
LINE_DOC_SHARE = 0.15  # documents with one sentence a line
FOREIGN_SHARE, NUMBER_SHARE = 0.02, 0.01  # English-like words in non-Latin documents; numbers in every document
POOL_RATE, POOL_CAP = 0.05, 50_000  # share of original documents kept as copy sources for later chunks; cap
MUTATE_MIN, MUTATE_MAX = 0.005, 0.04  # share of a near copy's words replaced (at least one)

# (script code, share of documents, sentence end probability, comma probability, has capitals)
SCRIPTS = (
    ("Latn", 0.70, 1 / 12, 1 / 14, True),
    ("Hani", 0.10, 1 / 20, 1 / 8, False),
    ("Cyrl", 0.08, 1 / 12, 1 / 14, True),
    ("Arab", 0.06, 1 / 12, 1 / 14, False),
    ("Deva", 0.06, 1 / 12, 1 / 14, False),
)
# separator after a word, by code: 0 space, 1 sentence end, 2 comma, 3 sentence end + line break,
# 4 sentence end + paragraph break, 5 end of the text (JSON-escaped: "\\n" is a line break inside the string)
SEPARATORS = {
    "Latn": (" ", ". ", ", ", ".\\n", ".\\n\\n", "."),
    "Hani": ("", "。", "，", "。\\n", "。\\n\\n", "。"),
    "Cyrl": (" ", ". ", ", ", ".\\n", ".\\n\\n", "."),
    "Arab": (" ", ". ", "، ", ".\\n", ".\\n\\n", "."),
    "Deva": (" ", "। ", ", ", "।\\n", "।\\n\\n", "।"),
}
COMMON = {
    "Latn": "the of and to a in is that it was for on are as with his they at be this from have or by one had not "
    "but what all were when we there can an your which their said if do will each about how up out them then she "
    "many some so these would other into has more her two like him see time could no make than first been its who "
    "now people my made over did down only way find use may water long little very after words called just where "
    "most know",
    "Cyrl": "и в не на я что он с как а то все она так его но да ты к у же вы за бы по только ее мне было вот от "
    "меня еще нет о из ему теперь когда даже ну вдруг ли если уже или ни быть был него до вас опять уж вам ведь там "
    "потом себя ничего ей может они тут где есть надо ней для мы тебя их чем была сам без будто чего раз тоже себе "
    "под будет тогда кто этот",
    "Arab": "في من على أن إلى عن مع هذا هذه التي الذي كان ما لا هو هي كل بين بعد قد ذلك عند حتى أو ثم إن لم كما "
    "أي لقد وقد غير منذ عليه أيضا فيها منها قبل يكون تكون",
    "Deva": "के है में की और को से का एक पर यह भी हैं कि था ने लिए तो इस कर नहीं हो गया वह जो रहा साथ कुछ किया "
    "अपने होता उन्होंने करने जाता तक",
    "Hani": "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得"
    "可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从",
}
# pseudo-words are 1-4 syllables (onset, nucleus, coda), each part drawn by weight
SYLLABLES = {
    "Latn": (
        {"": 3, "t": 6, "s": 5, "r": 4, "l": 4, "m": 4, "n": 4, "d": 4, "b": 3, "c": 3, "p": 3, "h": 3, "w": 3,
         "f": 2, "g": 2, "v": 1.5, "k": 1, "j": 0.5, "th": 3, "st": 2, "ch": 1.5, "sh": 1.5, "pr": 1.5, "tr": 1.5,
         "br": 1, "gr": 1, "cl": 1, "fl": 0.8, "wh": 0.8, "sp": 0.8, "qu": 0.4, "y": 0.6, "z": 0.2},
        {"a": 8, "e": 10, "i": 7, "o": 7, "u": 3, "ea": 1.5, "ou": 1.5, "ai": 1, "ee": 1, "oo": 1, "y": 0.7,
         "ie": 0.7, "oa": 0.4},
        {"": 10, "n": 4, "r": 4, "s": 3, "t": 3, "l": 2.5, "d": 2, "m": 1.5, "nd": 1.5, "st": 1.2, "ng": 1.2,
         "rt": 0.8, "ck": 0.8, "ll": 0.8, "nt": 1, "ss": 0.5, "x": 0.2, "ght": 0.4, "ve": 0.6, "re": 0.6,
         "se": 0.5, "ce": 0.4},
    ),
    "Cyrl": (
        {"": 3, "т": 5, "с": 4, "р": 3, "л": 3, "м": 3, "н": 4, "д": 3, "б": 2, "к": 3, "п": 3, "в": 4, "г": 2,
         "з": 1.5, "ж": 0.7, "ч": 1, "ш": 0.8, "х": 0.6, "ц": 0.4, "щ": 0.2, "ф": 0.3, "ст": 2, "пр": 1.5,
         "кр": 0.7, "др": 0.5, "сл": 0.6, "св": 0.6, "зв": 0.3},
        {"о": 10, "е": 8, "а": 8, "и": 7, "у": 3, "я": 2, "ы": 2, "ю": 0.7, "э": 0.3, "ё": 0.3},
        {"": 10, "н": 2, "т": 2, "с": 1.5, "л": 1.5, "й": 2, "м": 1, "р": 1.5, "в": 1, "ть": 1.2, "сть": 0.5,
         "к": 1, "х": 0.6, "ь": 0.8},
    ),
}  # fmt: skip
ARABIC_LETTERS = "".join(chr(c) for c in [*range(0x627, 0x63B), *range(0x641, 0x64B)])
VOCAB_SIZE = {"Latn": 50_000, "Cyrl": 30_000, "Arab": 30_000, "Deva": 30_000, "Hani": 5_000}
# Devanagari consonants without the three precomposed nukta letters (NFC would decompose them)
DEVA_CONSONANTS = "".join(chr(c) for c in range(0x915, 0x93A) if c not in (0x929, 0x931, 0x934))
DEVA_VOWEL_SIGNS = "ािीुूेैोौ"


@dataclass
class Vocab:
    """Every word and separator as one byte table: piece id -> bytes (`flat[off[i]:off[i] + length[i]]`)."""

    flat: np.ndarray  # uint8
    off: np.ndarray  # int64
    length: np.ndarray  # int64
    start: np.ndarray  # first word id of each script (lower-case forms; capitals follow at start + size)
    size: np.ndarray  # words of each script (without the capitals)
    caps: np.ndarray  # bool: the script has capitalized forms
    cdf: list[np.ndarray]  # Zipf cumulative weights per script
    sep_base: int  # piece id of separator (script s, code c): sep_base + 6 * s + c
    numbers: tuple[int, int]  # word ids [lo, hi) of the number words
    bytes_per_word: np.ndarray  # mean JSON bytes of a word and its separator, per script


def _draw(rng: np.random.Generator, table: dict[str, float], n: int) -> list[str]:
    keys = list(table)
    w = np.array([table[k] for k in keys])
    return [keys[i] for i in rng.choice(len(keys), n, p=w / w.sum())]


def _pseudo_words(rng: np.random.Generator, script: str, n: int) -> list[str]:
    """n distinct pseudo-words of the script's letters, shortest first (Zipf's law of abbreviation)."""
    if script == "Hani":
        pool = np.setdiff1d(np.arange(0x4E00, 0x9FA6), [ord(c) for c in COMMON["Hani"]])
        return [chr(c) for c in rng.choice(pool, n, replace=False)]
    words: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        syllables = rng.choice(4, 2 * n, p=[0.3, 0.4, 0.22, 0.08]) + 1
        total = int(syllables.sum())
        if script == "Arab":
            letters = rng.choice(len(ARABIC_LETTERS), total + 2 * n)
            parts = [ARABIC_LETTERS[i] for i in letters]
            k = 0
            cand = []
            for m in syllables.tolist():
                cand.append("".join(parts[k : k + m + 1]))
                k += m + 1
        elif script == "Deva":
            cons = rng.choice(len(DEVA_CONSONANTS), total)
            vow = np.where(rng.random(total) < 0.6, rng.choice(len(DEVA_VOWEL_SIGNS), total), -1)
            sy = [DEVA_CONSONANTS[c] + (DEVA_VOWEL_SIGNS[v] if v >= 0 else "") for c, v in zip(cons, vow)]
            cuts = np.cumsum(syllables)[:-1]
            cand = ["".join(p) for p in np.split(np.array(sy, dtype=object), cuts)]
        else:
            onset, nucleus, coda = (_draw(rng, t, total) for t in SYLLABLES[script])
            sy = [a + b + c for a, b, c in zip(onset, nucleus, coda)]
            cuts = np.cumsum(syllables)[:-1]
            cand = ["".join(p) for p in np.split(np.array(sy, dtype=object), cuts)]
        for w in cand:
            if len(w) > 1 and w not in words:
                words.add(w)
                out.append(w)
    out = out[:n]
    return sorted(out, key=lambda w: len(w) + rng.random() * 3)


def build_vocab(seed: int) -> Vocab:
    rng = np.random.default_rng([seed, 1 << 30])
    common_words = {s: list(dict.fromkeys(COMMON[s].split() if s != "Hani" else list(COMMON[s]))) for s in COMMON}
    pieces: list[bytes] = []
    start, size, caps, cdf, bpw = [], [], [], [], []
    for script, _share, p_end, p_comma, has_caps in SCRIPTS:
        common = common_words[script]
        taken = set(common)
        extra = [w for w in _pseudo_words(rng, script, VOCAB_SIZE[script]) if w not in taken]
        words = (common + extra)[: VOCAB_SIZE[script]]
        start.append(len(pieces))
        size.append(len(words))
        caps.append(has_caps)
        pieces += [w.encode() for w in words]
        if has_caps:
            pieces += [(w[:1].upper() + w[1:]).encode() for w in words]
        weights = 1.0 / (np.arange(len(words)) + 2.7)
        weights /= weights.sum()
        cdf.append(np.cumsum(weights))
        word_bytes = float(weights @ np.array([len(w.encode()) for w in words]))
        seps = [len(s.encode()) for s in SEPARATORS[script]]
        sep_bytes = (1 - p_end - p_comma) * seps[0] + p_end * (0.8 * seps[1] + 0.1 * seps[3] + 0.1 * seps[4])
        bpw.append(word_bytes + sep_bytes + p_comma * seps[2])
    lo = len(pieces)
    pieces += [str(x).encode() for x in [*range(0, 101), *range(1500, 2031)]]
    numbers = (lo, len(pieces))
    sep_base = len(pieces)
    for script, *_ in SCRIPTS:
        pieces += [s.encode() for s in SEPARATORS[script]]
    length = np.array([len(p) for p in pieces], dtype=np.int64)
    off = np.concatenate([[0], np.cumsum(length)[:-1]])
    flat = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    return Vocab(
        flat,
        off,
        length,
        np.array(start),
        np.array(size),
        np.array(caps),
        cdf,
        sep_base,
        numbers,
        np.array(bpw),
    )


def ragged(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices starts[i] + 0 .. lengths[i] - 1 for every i, concatenated."""
    total = int(lengths.sum())
    out_start = np.cumsum(lengths) - lengths
    return np.repeat(starts - out_start, lengths) + np.arange(total, dtype=np.int64)


def _words(v: Vocab, rng: np.random.Generator, script: np.ndarray) -> np.ndarray:
    """A lower-case word id for each entry of `script` (script indexes), Zipf-distributed within its script."""
    ids = np.empty(len(script), dtype=np.int64)
    for s in range(len(SCRIPTS)):
        at = np.flatnonzero(script == s)
        if len(at):
            rank = np.minimum(np.searchsorted(v.cdf[s], rng.random(len(at))), v.size[s] - 1)
            ids[at] = v.start[s] + rank
    return ids


@dataclass
class Pool:
    """Original documents of earlier chunks kept as copy sources (word ids, separator codes, script, global index)."""

    ids: np.ndarray
    seps: np.ndarray
    start: np.ndarray
    length: np.ndarray
    script: np.ndarray
    index: np.ndarray


def empty_pool() -> Pool:
    z = np.zeros(0, dtype=np.int64)
    return Pool(z, np.zeros(0, dtype=np.uint8), z, z, z, z)


def generate_chunk(v: Vocab, seed: int, chunk: int, first: int, n: int, pool: Pool):
    """Documents first .. first + n - 1: (their JSONL bytes per document, planted copies, spam indexes, the pool
    for the next chunk)."""
    rng = np.random.default_rng([seed, chunk])
    shares = np.array([s[1] for s in SCRIPTS])
    script = np.searchsorted(np.cumsum(shares) / shares.sum(), rng.random(n))
    target = np.minimum(MIN_BYTES + rng.lognormal(np.log(MEDIAN_BYTES), SIGMA_BYTES, n), MAX_BYTES)
    ntok = np.ceil(target / v.bytes_per_word[script]).astype(np.int64)
    lines_doc = rng.random(n) < LINE_DOC_SHARE
    kind = rng.random(n)  # < NEAR: near copy, < NEAR+EXACT: exact copy, < ...+SPAM: spam
    near = kind < NEAR_SHARE
    exact = (kind >= NEAR_SHARE) & (kind < NEAR_SHARE + EXACT_SHARE)
    spam = (kind >= NEAR_SHARE + EXACT_SHARE) & (kind < NEAR_SHARE + EXACT_SHARE + SPAM_SHARE)

    # fresh words and separators for every document (copies are overwritten below)
    start0 = np.cumsum(ntok) - ntok
    doc_of = np.repeat(np.arange(n), ntok)
    tscript = script[doc_of]
    ids = _words(v, rng, tscript)
    u = rng.random(len(ids))
    non_latin = tscript != 0
    foreign = non_latin & (u < FOREIGN_SHARE)
    ids[foreign] = _words(v, rng, np.zeros(int(foreign.sum()), dtype=np.int64))
    number = (u >= FOREIGN_SHARE) & (u < FOREIGN_SHARE + NUMBER_SHARE)
    ids[number] = rng.integers(v.numbers[0], v.numbers[1], int(number.sum()))
    p_end = np.array([s[2] for s in SCRIPTS])[tscript]
    p_comma = np.array([s[3] for s in SCRIPTS])[tscript]
    in_lines = lines_doc[doc_of]
    p_end = np.where(in_lines, np.minimum(0.5, p_end * 1.7), p_end)
    u = rng.random(len(ids))
    seps = np.zeros(len(ids), dtype=np.uint8)
    seps[u < p_end + p_comma] = 2
    ends = u < p_end
    brk = rng.random(len(ids))
    seps[ends] = np.where(in_lines[ends], 3, np.where(brk[ends] < 0.12, 4, np.where(brk[ends] < 0.17, 3, 1)))
    # spam: one short line of the document repeated to its length
    sp = np.flatnonzero(spam)
    if len(sp):
        period = np.clip(ntok[sp] // 5, 1, 8)
        pos = ragged(start0[sp], ntok[sp])
        offset = pos - np.repeat(start0[sp], ntok[sp])
        per = np.repeat(period, ntok[sp])
        ids[pos] = ids[np.repeat(start0[sp], ntok[sp]) + offset % per]
        seps[pos] = np.where(offset % per == per - 1, 3, 0)
    seps[start0 + ntok - 1] = 5

    # copies: a source per copy among the original documents of the pool or earlier in this chunk
    copy = np.flatnonzero(near | exact)
    original = np.flatnonzero(~(near | exact | spam))
    earlier = np.searchsorted(original, copy)  # originals before each copy in this chunk
    from_pool = (rng.random(len(copy)) < 0.5) & (len(pool.index) > 0)
    from_pool |= earlier == 0
    ok = ~(from_pool & (len(pool.index) == 0))
    copy, earlier, from_pool = copy[ok], earlier[ok], from_pool[ok]
    near[:] = False
    exact[:] = False
    pick = rng.random(len(copy))
    src_pool = np.minimum((pick * len(pool.index)).astype(np.int64), max(0, len(pool.index) - 1))
    if len(original):
        src_chunk = original[np.minimum((pick * earlier).astype(np.int64), np.maximum(earlier - 1, 0))]
    else:
        src_chunk = np.zeros(len(copy), dtype=np.int64)
    is_near = kind[copy] < NEAR_SHARE
    near[copy[is_near]] = True
    exact[copy[~is_near]] = True
    src_len = np.where(from_pool, pool.length[src_pool] if len(pool.index) else 0, ntok[src_chunk])
    length = ntok.copy()
    length[copy] = src_len
    script[copy] = np.where(from_pool, pool.script[src_pool] if len(pool.index) else 0, script[src_chunk])
    start = np.cumsum(length) - length
    out_ids = np.empty(int(length.sum()), dtype=np.int64)
    out_seps = np.empty(len(out_ids), dtype=np.uint8)
    mine = np.ones(n, dtype=bool)
    mine[copy] = False
    own = np.flatnonzero(mine)
    src_start = start0.copy()
    src_start[copy] = start0[src_chunk]
    within = np.concatenate([own, copy[~from_pool]])
    dst, src = ragged(start[within], length[within]), ragged(src_start[within], length[within])
    out_ids[dst], out_seps[dst] = ids[src], seps[src]
    pooled = copy[from_pool]
    if len(pooled):
        sp_ = src_pool[from_pool]
        dst, src = ragged(start[pooled], length[pooled]), ragged(pool.start[sp_], length[pooled])
        out_ids[dst], out_seps[dst] = pool.ids[src], pool.seps[src]
    source_index = np.where(from_pool, pool.index[src_pool] if len(pool.index) else 0, first + src_chunk)

    # near copies: a few words replaced by other words of the same script
    nc = np.flatnonzero(near)
    k = np.maximum(1, np.round(length[nc] * rng.uniform(MUTATE_MIN, MUTATE_MAX, len(nc)))).astype(np.int64)
    at = np.repeat(start[nc], k) + (rng.random(int(k.sum())) * np.repeat(length[nc], k)).astype(np.int64)
    out_ids[at] = _words(v, rng, np.repeat(script[nc], k))

    # capitals: the first word of a document and of every sentence (scripts that have them)
    sentence_start = np.zeros(len(out_ids), dtype=bool)
    sentence_start[start] = True
    sentence_start[1:] |= np.isin(out_seps[:-1], (1, 3, 4))
    word_script = np.searchsorted(v.start, out_ids, side="right") - 1
    lower = (out_ids < v.numbers[0]) & (out_ids - v.start[word_script] < v.size[word_script])
    cap = sentence_start & lower & v.caps[word_script]
    out_ids[cap] += v.size[word_script[cap]]

    # bytes: word, separator, word, separator ...
    piece = np.empty(2 * len(out_ids), dtype=np.int64)
    piece[0::2] = out_ids
    piece[1::2] = v.sep_base + 6 * np.repeat(script, length) + out_seps
    plen = v.length[piece]
    text = v.flat[ragged(v.off[piece], plen)].tobytes()
    doc_end = np.cumsum(plen)[2 * (start + length) - 1]
    doc_start = np.concatenate([[0], doc_end[:-1]])
    codes = [s[0] for s in SCRIPTS]
    suffix = [f'","metadata":{{"script":"{c}"}}}}\n'.encode() for c in codes]
    lines = [
        b'{"id":"s%d-%09d","text":"%s%s' % (seed, first + i, text[a:b], suffix[s])
        for i, (a, b, s) in enumerate(zip(doc_start.tolist(), doc_end.tolist(), script.tolist()))
    ]

    # the next pool: a sample of this chunk's originals added, capped at POOL_CAP documents
    orig = np.flatnonzero(~(near | exact | spam))
    keep = orig[rng.random(len(orig)) < POOL_RATE]
    add_ids = out_ids[ragged(start[keep], length[keep])]
    add_seps = out_seps[ragged(start[keep], length[keep])]
    merged = Pool(
        np.concatenate([pool.ids, add_ids]),
        np.concatenate([pool.seps, add_seps]),
        np.concatenate([pool.start, len(pool.ids) + np.cumsum(length[keep]) - length[keep]]),
        np.concatenate([pool.length, length[keep]]),
        np.concatenate([pool.script, script[keep]]),
        np.concatenate([pool.index, first + keep]),
    )
    if len(merged.index) > POOL_CAP:
        kept = np.sort(rng.choice(len(merged.index), POOL_CAP, replace=False))
        sel = ragged(merged.start[kept], merged.length[kept])
        lens = merged.length[kept]
        merged = Pool(
            merged.ids[sel],
            merged.seps[sel],
            np.cumsum(lens) - lens,
            lens,
            merged.script[kept],
            merged.index[kept],
        )
    planted = {
        "copy": first + copy,
        "source": source_index,
        "near": is_near,
        "spam": first + np.flatnonzero(spam),
        "script": script,
    }
    return lines, planted, merged


def generate(n_docs: int, folder: Path, seed: int = 0) -> dict:
    """Writes the corpus into folder/source and its planted.npz and corpus.json; returns the corpus.json figures."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    v = build_vocab(seed)
    source = folder / "source"
    source.mkdir(parents=True, exist_ok=True)
    pool = empty_pool()
    planted: dict[str, list[np.ndarray]] = {"copy": [], "source": [], "near": [], "spam": [], "script": []}
    lengths = []
    out = None
    for chunk, first in enumerate(range(0, n_docs, CHUNK_DOCS)):
        n = min(CHUNK_DOCS, n_docs - first)
        lines, p, pool = generate_chunk(v, seed, chunk, first, n, pool)
        for key in planted:
            planted[key].append(p[key])
        for i, line in enumerate(lines, first):
            if i % DOCS_PER_FILE == 0:
                if out:
                    out.close()
                out = open(source / f"part-{i // DOCS_PER_FILE:05d}.jsonl", "wb")
            out.write(line)
        lengths.append(np.fromiter(map(len, lines), np.int64, len(lines)))
    if out:
        out.close()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    line_bytes = np.concatenate(lengths)
    overhead = len(b'{"id":"s%d-000000000","text":"' % seed) + len(b'","metadata":{"script":"Latn"}}\n')
    text_bytes = line_bytes - overhead  # JSON bytes of the text (a line break is 2 bytes there)
    arrays = {k: np.concatenate(a) for k, a in planted.items()}
    scripts = np.bincount(arrays.pop("script"), minlength=len(SCRIPTS))
    np.savez(folder / "planted.npz", **arrays)
    figures = {
        "docs": n_docs,
        "seed": seed,
        "files": len(list(source.glob("*.jsonl"))),
        "bytes": int(line_bytes.sum()),
        "bytes_per_doc": float(line_bytes.mean()),
        "text_bytes": {
            "mean": float(text_bytes.mean()),
            "min": int(text_bytes.min()),
            "under_min": float((text_bytes < MIN_BYTES).mean()),
            "p10": float(np.percentile(text_bytes, 10)),
            "p50": float(np.percentile(text_bytes, 50)),
            "p90": float(np.percentile(text_bytes, 90)),
            "p99": float(np.percentile(text_bytes, 99)),
            "p99.99": float(np.percentile(text_bytes, 99.99)),
            "max": int(text_bytes.max()),
        },
        "scripts": {code: int(c) for (code, *_), c in zip(SCRIPTS, scripts)},
        "near_copies": int(arrays["near"].sum()),
        "exact_copies": int((~arrays["near"]).sum()),
        "spam": len(arrays["spam"]),
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
    }
    (folder / "corpus.json").write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def corpus(data: Path, n_docs: int, seed: int = 0) -> Path:
    """The corpus folder of (n_docs, seed) under data, generated on first use; its JSONL files are in `source/`."""
    folder = data / f"corpus-{n_docs}-s{seed}"
    if not (folder / "corpus.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        generate(n_docs, folder, seed)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("docs", type=int)
    ap.add_argument("--data", default="/tmp/tokenmill_scale", help="folder of the cached corpora")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stats", action="store_true", help="print the corpus figures (corpus.json)")
    args = ap.parse_args()
    folder = corpus(Path(args.data), args.docs, args.seed)
    figures = json.loads((folder / "corpus.json").read_text())
    if args.stats:
        print(json.dumps(figures, indent=1))
    print(
        f"{folder / 'source'}: {figures['docs']:,} documents, {figures['bytes'] / 1e6:,.1f} MB, generated in "
        f"{figures['seconds']:.1f} s ({figures['docs'] / max(figures['seconds'], 1e-9):,.0f} docs/s)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
