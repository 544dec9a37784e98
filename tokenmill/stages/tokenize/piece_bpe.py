"""Exact byte-level BPE, vectorized: words cut where no vocabulary token can span, each piece's ids cached.

HF's encoder runs BPE on every pre-tokenized word from its bytes and caches whole words. A CJK word is a clause (~18
bytes) that seldom repeats, so on Chinese text every character pays for merging. But BPE never merges across a point
that no vocabulary token spans (every symbol it holds is a vocabulary token), so a word's ids are its pieces' ids one
after the other, the pieces being cut at such points. On chinese-poetry the pieces are mostly repeats of a small set of
distinct strings (docs/profile.md, 'Runs of 2026-12-04 (second session) with the piece encoder'): the BPE model encodes
each distinct piece once per process, and the rest is numpy over code points.

The words are those of the `punct_attach` pre-tokenizer (train.PUNCT_ATTACH_PATTERN), found from per-code-point
classes (letter, number, punctuation, white space, other) that the tokenizer's own regex engine reports, so they
match its Unicode tables. Only a tokenizer of the exact shape the tokenizer asset trains with punct_attach qualifies
(`PieceEncoder.build` returns None for any other), and a batch holding a surrogate is left to HF.
"""

from __future__ import annotations

import json
from itertools import chain, repeat

import numpy as np

from tokenmill.stages.tokenize.train import PUNCT_ATTACH_PATTERN

LETTER, NUMBER, PUNCT, SPACE, OTHER, UNKNOWN = 0, 1, 2, 3, 4, 255
CLASS_PATTERNS = ((LETTER, r"\p{L}"), (NUMBER, r"\p{N}"), (PUNCT, r"\p{P}"), (SPACE, r"\s"))
CODE_POINTS = 0x110000
PLANE = 0x10000  # span tables cover the planes up to the highest code point seen (each costs time)
SHORT_PIECE = 3  # code points a 63-bit key holds exactly (21 bits each)
CACHE_IDS = 1 << 22  # ids kept per process (16 MiB) before the piece cache starts over
CACHE_LONG = 1 << 18  # or longer pieces kept (a dict of strings, ~30 MiB)
CHUNK_POINTS = 1 << 20  # code points encoded at once: ~100 MiB of numpy temporaries whatever the batch
MAX_SPANS = 1 << 24  # left x right profiles (bytes); a vocabulary needing more is left to HF (4,096 tokens: ~250k)
MAX_ATOMS = 55_000  # a profile's four atom numbers make one int64 below this


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map, the byte-level alphabet's spelling of each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


BYTE_CHARS = _byte_chars()
BYTE_SPELLING = str.maketrans(dict(enumerate(BYTE_CHARS)))  # bytes read as latin-1 -> their byte-level spelling


PUNCT_ATTACH_SPLIT = {
    "type": "Split",
    "pattern": {"Regex": PUNCT_ATTACH_PATTERN},
    "behavior": "Isolated",
    "invert": False,
}


def _qualifies(spec: dict) -> bool:
    """tokenizer.json of a byte-level BPE with the punct_attach split, no normalizer and only special added tokens."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") or []
    return (
        spec.get("normalizer") is None
        and model.get("type") == "BPE"
        and model.get("dropout") is None
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
        and not model.get("byte_fallback")
        and not model.get("ignore_merges")
        and pre.get("type") == "Sequence"
        and len(steps) == 2
        and steps[0] == PUNCT_ATTACH_SPLIT
        and steps[1].get("type") == "ByteLevel"
        and steps[1].get("add_prefix_space") is False
        and steps[1].get("use_regex") is False
        and all(t.get("special") for t in spec.get("added_tokens") or [])
        and all(c in model.get("vocab", {}) for c in BYTE_CHARS)
    )


def _utf8_of(cps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each code point's UTF-8 length and bytes (column k: byte k, 0 past the end)."""
    cps = cps.astype(np.int64)
    n = 1 + (cps >= 0x80) + (cps >= 0x800) + (cps >= 0x10000)
    out = np.zeros((len(cps), 4), dtype=np.int64)
    lead = np.select([n == 1, n == 2, n == 3], [cps, 0xC0 | (cps >> 6), 0xE0 | (cps >> 12)], 0xF0 | (cps >> 18))
    out[:, 0] = lead
    for k in range(1, 4):  # byte k of an n-byte character holds bits 6*(n-1-k).. of the code point
        shift = 6 * np.maximum(n - 1 - k, 0)
        out[:, k] = np.where(k < n, 0x80 | ((cps >> shift) & 0x3F), 0)
    return n, out


def _left_atom(a: bytes) -> tuple | None:
    """What a character must be to end exactly where token bytes `a` end: ("char", c) or ("tail", bytes)."""
    j = len(a) - 1
    while j >= 0 and 0x80 <= a[j] < 0xC0:
        j -= 1
    if j < 0:
        return ("tail", a) if len(a) <= 3 else None
    try:
        c = a[j:].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return ("char", ord(c)) if len(c) == 1 else None


def _right_atom(b: bytes) -> tuple | None:
    """What a character must be to start exactly where token bytes `b` start: ("char", c) or ("head", bytes)."""
    lead = b[0]
    n = 1 if lead < 0x80 else 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if lead >= 0xF0 else 0
    if not n:
        return None
    if len(b) < n:
        return ("head", b) if all(0x80 <= x < 0xC0 for x in b[1:]) else None
    try:
        return ("char", ord(b[:n].decode("utf-8")))
    except UnicodeDecodeError:
        return None


def _crossings(vocab: dict[str, int]) -> set[tuple]:
    """(left atom, right atom) for every point inside a vocabulary token where a character boundary may fall."""
    byte_of = {c: b for b, c in enumerate(BYTE_CHARS)}
    crossings = set()
    for token in vocab:
        if len(token) < 2 or any(c not in byte_of for c in token):
            continue  # one byte, or an added token BPE never builds
        t = bytes(byte_of[c] for c in token)
        for p in range(1, len(t)):
            if 0x80 <= t[p] < 0xC0 or t[p - 1] >= 0xC0:
                continue  # no character boundary falls here
            left, right = _left_atom(t[:p]), _right_atom(t[p:])
            if left and right:
                crossings.add((left, right))
    return crossings


class PieceEncoder:
    """Encodes batches of text exactly as `tok.encode(..., add_special_tokens=False)` with special tokens encoded
    as text (`tok.encode_special_tokens = True`); build it with `PieceEncoder.build`."""

    def __init__(self, tok, spec: dict):
        self.model = tok.model
        self.classes = np.full(CODE_POINTS, UNKNOWN, dtype=np.uint8)
        self._crossings = _crossings(spec["model"]["vocab"])
        self._cover(PLANE)
        self._reset_cache()

    @classmethod
    def build(cls, tok, tokenizer_json: str | bytes) -> PieceEncoder | None:
        """The encoder for a tokenizer of the shape we train (and span tables of a bounded size), else None."""
        spec = json.loads(tokenizer_json)
        if not _qualifies(spec):
            return None
        encoder = cls(tok, spec)
        return encoder if encoder._spans is not None else None

    # -- which character boundaries a token can span -----------------------------------------------------------
    def _cover(self, limit: int) -> None:
        """Span tables for the code points below `limit`: per code point a left and a right profile, and
        spans[left, right]: some token may hold the end of a character of the left profile followed by the start
        of one of the right profile."""
        cps = np.arange(limit, dtype=np.int64)
        cps = cps[(cps < 0xD800) | (cps > 0xDFFF)]
        n, utf8 = _utf8_of(cps)
        left_atoms = sorted({a for a, _ in self._crossings})
        right_atoms = sorted({b for _, b in self._crossings})
        self._limit, self._spans = limit, None
        if max(len(left_atoms), len(right_atoms)) >= MAX_ATOMS:
            return
        atom_pairs = np.zeros((len(left_atoms) + 1, len(right_atoms) + 1), dtype=bool)  # row/column 0: no atom
        li, ri = {a: i + 1 for i, a in enumerate(left_atoms)}, {b: i + 1 for i, b in enumerate(right_atoms)}
        for a, b in self._crossings:
            atom_pairs[li[a], ri[b]] = True
        left_profiles, self._left = _profiles(cps, limit, _atom_rows(cps, n, utf8, left_atoms, tail=True))
        right_profiles, self._right = _profiles(cps, limit, _atom_rows(cps, n, utf8, right_atoms, tail=False))
        if len(left_profiles) * len(right_profiles) > MAX_SPANS:
            return
        spans = np.zeros((len(left_profiles), len(right_profiles)), dtype=bool)
        for i in range(left_profiles.shape[1]):
            for j in range(right_profiles.shape[1]):
                spans |= atom_pairs[left_profiles[:, i][:, None], right_profiles[:, j][None, :]]
        self._spans = spans

    # -- per-code-point classes, as the tokenizer's regex engine sees them --------------------------------------
    def _classify(self, cps: np.ndarray) -> np.ndarray:
        """Each code point's class, probing the ones not seen before."""
        from tokenizers import Regex, pre_tokenizers

        classes = self.classes[cps]
        new = np.unique(cps[classes == UNKNOWN])
        if not len(new):
            return classes
        text = "".join(map(chr, new.tolist()))
        found = np.full(len(new), OTHER, dtype=np.uint8)
        for cls, pattern in CLASS_PATTERNS:  # disjoint classes
            unmatched = np.zeros(len(new), dtype=bool)
            for _, (a, b) in pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text):
                unmatched[a:b] = True
            found[~unmatched] = cls
        self.classes[new] = found
        return self.classes[cps]

    # -- the piece cache ----------------------------------------------------------------------------------------
    def _reset_cache(self) -> None:
        self._keys = np.zeros(0, dtype=np.int64)  # sorted keys of short pieces
        self._key_at = np.zeros(0, dtype=np.int64)  # their entries
        self._long: dict[str, int] = {}  # longer pieces -> entry
        self._start = np.zeros(0, dtype=np.int64)  # per entry: first id in _ids, and count
        self._count = np.zeros(0, dtype=np.int64)
        self._ids = np.zeros(0, dtype=np.int32)

    def _add(self, pieces: list[str]) -> np.ndarray:
        """Encodes pieces with the BPE model (what HF runs on each word, spelt in the byte-level alphabet); returns
        their new entry numbers. (`encode_batch_fast` on the pieces gives the same ids, slower.)"""
        spelt = (p.encode().decode("latin-1").translate(BYTE_SPELLING) for p in pieces)
        lists = [[t.id for t in self.model.tokenize(word)] for word in spelt]
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        first = len(self._start)
        self._start = np.concatenate([self._start, len(self._ids) + np.cumsum(counts) - counts])
        self._count = np.concatenate([self._count, counts])
        flat = np.fromiter(chain.from_iterable(lists), dtype=np.int32, count=int(counts.sum()))
        self._ids = np.concatenate([self._ids, flat])
        return np.arange(first, first + len(pieces), dtype=np.int64)

    def _entries(self, text: str, cps: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """The cache entry of each piece, encoding the pieces not seen yet."""
        if len(self._ids) > CACHE_IDS or len(self._long) > CACHE_LONG:
            self._reset_cache()
        entry = np.empty(len(starts), dtype=np.int64)
        short = lens <= SHORT_PIECE
        s, n = starts[short], lens[short]
        padded = np.concatenate([cps.astype(np.int64) + 1, np.zeros(SHORT_PIECE, dtype=np.int64)])
        keys = padded[s] | np.where(n > 1, padded[s + 1] << 21, 0) | np.where(n > 2, padded[s + 2] << 42, 0)
        unique, inverse = np.unique(keys, return_inverse=True)
        at = np.searchsorted(self._keys, unique)
        known = at < len(self._keys)
        known[known] = self._keys[at[known]] == unique[known]
        unique_entry = np.empty(len(unique), dtype=np.int64)
        unique_entry[known] = self._key_at[at[known]]
        if not known.all():
            missing = unique[~known]
            chars = [(missing >> shift) & 0x1FFFFF for shift in (0, 21, 42)]
            pieces = ["".join(chr(c - 1) for c in row if c) for row in zip(*(a.tolist() for a in chars))]
            added = self._add(pieces)
            unique_entry[~known] = added
            order = np.argsort(np.concatenate([self._keys, missing]), kind="stable")
            self._keys = np.concatenate([self._keys, missing])[order]
            self._key_at = np.concatenate([self._key_at, added])[order]
        entry[short] = unique_entry[inverse]
        if not short.all():
            long_at = np.flatnonzero(~short)
            first = starts[long_at]
            pieces = list(map(text.__getitem__, map(slice, first.tolist(), (first + lens[long_at]).tolist())))
            found = np.fromiter(map(self._long.get, pieces, repeat(-1)), dtype=np.int64, count=len(pieces))
            unseen = [pieces[i] for i in np.flatnonzero(found < 0).tolist()]
            if unseen:
                new = list(dict.fromkeys(unseen))
                self._long.update(zip(new, self._add(new).tolist()))
                found[found < 0] = [self._long[p] for p in unseen]
            entry[long_at] = found
        return entry

    # -- encoding -----------------------------------------------------------------------------------------------
    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
        """The texts' ids, flat, and each text's count; None where HF must encode the batch: it holds a surrogate,
        or characters of a plane whose span tables would be too large. Texts go CHUNK_POINTS at a time."""
        ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        first = 0
        while first < len(texts) or not parts:
            # the texts that end within CHUNK_POINTS of the chunk's start (at least one)
            base = int(ends[first - 1]) if first else 0
            last = max(first + 1, int(np.searchsorted(ends, base + CHUNK_POINTS, side="right")))
            part = self._encode_chunk(texts[first:last])
            if part is None:
                return None
            parts.append(part)
            first = last
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _encode_chunk(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
        text = "".join(texts)
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        text_lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        if not len(cps):
            return np.zeros(0, dtype=np.int64), np.zeros(len(texts), dtype=np.int64)
        if ((cps >= 0xD800) & (cps <= 0xDFFF)).any():
            return None
        if int(cps.max()) >= self._limit:
            self._cover((int(cps.max()) // PLANE + 1) * PLANE)
        spans = self._spans
        if spans is None:
            return None
        starts = np.flatnonzero(self._cuts(cps, self._classify(cps), text_lens, spans))
        lens = np.diff(np.append(starts, len(cps)))
        entry = self._entries(text, cps, starts, lens)
        counts = self._count[entry]
        ends = np.cumsum(counts)
        ids = self._ids[np.repeat(self._start[entry] - (ends - counts), counts) + np.arange(int(ends[-1]))]
        text_of_piece = np.searchsorted(np.cumsum(text_lens), starts, side="right")
        per_text = np.bincount(text_of_piece, weights=counts, minlength=len(texts)).astype(np.int64)
        return ids, per_text

    def _cuts(self, cps: np.ndarray, cls: np.ndarray, text_lens: np.ndarray, spans_table: np.ndarray) -> np.ndarray:
        """cut[i]: a piece starts at code point i (a text's start, a word's start, or a point no token spans)."""
        n = len(cps)
        first = np.zeros(n + 1, dtype=bool)
        first[np.cumsum(text_lens) - text_lens] = True  # empty texts collapse onto the next start
        first = first[:n]
        last = np.append(first[1:], True)
        prev = np.empty(n, dtype=np.uint8)
        prev[0], prev[1:] = OTHER, cls[:-1]
        nxt = np.empty(n, dtype=np.uint8)
        nxt[-1], nxt[:-1] = OTHER, cls[1:]
        space_before = np.zeros(n, dtype=bool)
        space_before[1:] = cps[:-1] == 0x20
        word = self._word_starts(cls, prev, nxt, first, last, space_before)
        spans = np.zeros(n, dtype=bool)
        spans[1:] = spans_table[self._left[cps[:-1]], self._right[cps[1:]]]
        return first | word | ~spans

    @staticmethod
    def _word_starts(cls, prev, nxt, first, last, space_before) -> np.ndarray:
        """Where the punct_attach pattern starts a word (at a text's first point the answer is not used):
        ` ?\\p{L}+\\p{P}*| ?\\p{N}+\\p{P}*| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`."""
        n = len(cls)
        word = np.zeros(n, dtype=bool)
        # punctuation attached to a letter or number run: the run of punctuation it belongs to follows one
        punct = cls == PUNCT
        run_start = punct & ((prev != PUNCT) | first)
        run_id = np.cumsum(run_start) - 1
        attached_run = np.isin(prev[run_start], (LETTER, NUMBER)) & ~first[run_start]
        attached = np.zeros(n, dtype=bool)
        attached[punct] = attached_run[run_id[punct]]
        attached_prev = np.zeros(n, dtype=bool)
        attached_prev[1:] = attached[:-1]
        is_space, prev_space = cls == SPACE, prev == SPACE
        letter_like = (LETTER, NUMBER)
        # a change between letter, number and symbol runs
        word |= (cls == LETTER) & (prev != LETTER) & ~prev_space
        word |= (cls == NUMBER) & (prev != NUMBER) & ~prev_space
        word |= (cls == OTHER) & np.isin(prev, letter_like)
        word |= (cls == OTHER) & attached_prev
        # white space: a run starts a word; its last point starts another unless the run ends the text; a
        # non-space point after white space starts a word unless that white space is " " (which it takes)
        word |= is_space & ~prev_space
        word |= is_space & prev_space & ~last & (nxt != SPACE)
        word |= ~is_space & prev_space & ~space_before
        return word


def _atom_rows(cps: np.ndarray, n: np.ndarray, utf8: np.ndarray, atoms: list, tail: bool) -> np.ndarray:
    """Per code point, the numbers (1-based, 0: none) of the atoms it satisfies: its own character, and each
    proper tail (left side) or head (right side) of its bytes."""
    rows = np.zeros((len(cps), 4), dtype=np.int64)
    chars = {a[1]: i + 1 for i, a in enumerate(atoms) if a[0] == "char"}
    if chars:
        keys, numbers = np.fromiter(chars, dtype=np.int64), np.fromiter(chars.values(), dtype=np.int64)
        at = np.searchsorted(cps, keys)
        covered = at < len(cps)  # characters of planes not covered yet wait for them
        rows[at[covered], 0] = numbers[covered]
    parts = {a[1]: i + 1 for i, a in enumerate(atoms) if a[0] != "char"}
    for k in range(1, 4):  # k bytes: a tail or head shorter than the character
        wanted = {bytes_: i for bytes_, i in parts.items() if len(bytes_) == k}
        if not wanted:
            continue
        cols = [n - k + j for j in range(k)] if tail else [np.full(len(cps), j) for j in range(k)]
        key = np.zeros(len(cps), dtype=np.int64)
        for col in cols:
            key = (key << 8) | utf8[np.arange(len(cps)), np.clip(col, 0, 3)]
        table = sorted((int.from_bytes(b, "big"), i) for b, i in wanted.items())
        keys, numbers = (np.array(col, dtype=np.int64) for col in zip(*table))
        at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        hit = (keys[at] == key) & (k < n)
        rows[hit, k] = numbers[at[hit]]
    return rows


def _profiles(cps: np.ndarray, limit: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct atom rows (row 0: none) and each code point's row number (code points below `limit`)."""
    any_atom = rows.any(axis=1)
    radix = int(rows.max()) + 1
    key = np.zeros(int(any_atom.sum()), dtype=np.int64)  # a row as one number (radix**4 < 2**63: MAX_ATOMS)
    for col in rows[any_atom].T:
        key = key * radix + col
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    profiles = np.vstack([np.zeros((1, rows.shape[1]), dtype=np.int64), rows[any_atom][first]])
    of = np.zeros(limit, dtype=np.int32)
    of[cps[any_atom]] = inverse.reshape(-1) + 1
    return profiles, of
