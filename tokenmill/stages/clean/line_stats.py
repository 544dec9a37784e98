"""Pass 1 of the boilerplate rule: per-shard line statistics (hash, document frequency, position) as numpy arrays.

Each normalized line is hashed to 64 bits; per shard, each distinct line gets its document frequency, how often
it sits in a document's head or tail zone, and the chance of landing there at random (`LineTable`). Only these
arrays cross process boundaries (48 bytes per distinct line per shard), never the lines themselves.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from zlib import adler32, crc32

import numpy as np

DIGITS_RE = re.compile(r"\d+")
HAS_DIGIT = re.compile(r"\d").search
COUNT_FIELDS = ("df", "head", "tail", "informative", "chance")


@dataclass(frozen=True)
class LineTable:
    """Statistics of distinct lines, sorted by hash: one shard's (pass 1), or summed over shards (the merge)."""

    docs: int
    """Documents the statistics were gathered over."""
    hash: np.ndarray
    """uint64 line hashes (key_hash of line_key), sorted."""
    df: np.ndarray
    """Documents holding the line."""
    head: np.ndarray
    """Occurrences in a document's head zone (first `edge_frac` of its lines)."""
    tail: np.ndarray
    """Occurrences in a document's tail zone."""
    informative: np.ndarray
    """Occurrences in documents of 2+ lines (a one-line document says nothing about position)."""
    chance: np.ndarray
    """Summed chance of those occurrences landing in one edge zone at random."""
    candidates: int = field(default=0)
    """Lines that passed min_df before pruning (set by prune_candidates)."""

    @classmethod
    def empty(cls, docs: int) -> LineTable:
        return cls(docs, np.zeros(0, np.uint64), *(np.zeros(0, np.float64) for _ in COUNT_FIELDS))

    def __len__(self) -> int:
        return len(self.hash)

    def select(self, keep: np.ndarray) -> LineTable:
        """The rows where `keep` is true."""
        return replace(self, hash=self.hash[keep], **{k: getattr(self, k)[keep] for k in COUNT_FIELDS})


def line_key(line: str) -> str:
    """The form lines are compared in: lower-cased, without surrounding spaces/tabs, every digit run as 0
    ("Page 3 of 10" and "Page 4 of 10" are the same template)."""
    return DIGITS_RE.sub("0", line.lower()).strip(" \t")


def key_hash(key: str) -> int:
    """Stable 64-bit hash of a line key (Python's hash() differs per process): crc32 and adler32 side by side."""
    b = key.encode("utf-8")
    return (crc32(b) << 32) | adler32(b)


def doc_lines(text: str) -> list[str]:
    """The lines the detector looks at: the non-blank lines of a text, in order."""
    return [ln for ln in text.split("\n") if ln and not ln.isspace()]


def doc_line_hashes(text: str) -> list[int]:
    """key_hash(line_key(line)) of every line of doc_lines(text), in order, computed for the whole text at once
    (one lower(), one digit pass: about half the cost of doing it line by line)."""
    low = text.lower()  # lower() never adds or removes a line break, so the lines stay aligned with doc_lines
    if HAS_DIGIT(low) is not None:
        low = DIGITS_RE.sub("0", low)
    return [
        (crc32(b) << 32) | adler32(b)
        for b in (ln.strip(" \t").encode("utf-8") for ln in low.split("\n") if ln and not ln.isspace())
    ]


def edge_zone(n_lines: int, edge_frac: float) -> int:
    """Lines at each end of a document counted as header/footer: the first/last `edge_frac` of lines, at least 1."""
    return max(1, math.ceil(edge_frac * n_lines))


HEAD, TAIL, INFORMATIVE = 1, 2, 4  # bits of a line occurrence's position code


class LineStats:
    """Per-shard accumulator of line statistics (pass 1): per distinct line of each document, its hash and a
    position code; per document, the chance of landing in one edge zone at random."""

    def __init__(self, edge_frac: float = 0.05):
        self.edge_frac = edge_frac
        self.hashes: list[int] = []
        self.codes: list[int] = []
        self.doc_entries: list[int] = []
        self.doc_chance: list[float] = []
        self.docs = 0

    def add_document(self, text: str) -> list[int]:
        """Records each distinct line of one document once (document frequency), with where it sits; returns
        the hash of every line of doc_lines(text) in order (pass 2 looks them up without hashing again)."""
        self.docs += 1
        hashes = doc_line_hashes(text)
        n = len(hashes)
        if n == 0:
            self.doc_entries.append(0)
            self.doc_chance.append(0.0)
            return hashes
        zone = edge_zone(n, self.edge_frac)
        # a one-line document says nothing about position; from two lines on, being first (or last) every time
        # is evidence, weighed against the chance zone/n of landing there at random
        self.doc_chance.append(zone / n if n >= 2 else 0.0)
        if len(set(hashes)) == n:  # every line distinct (the common case): positions are the line numbers
            self.hashes += hashes
            self.codes += (
                [INFORMATIVE | HEAD] * zone + [INFORMATIVE] * (n - 2 * zone) + [INFORMATIVE | TAIL] * zone
                if n >= 2
                else [0]
            )
            self.doc_entries.append(n)
            return hashes
        # a line repeated inside the document: its first and last position decide (repeated across the
        # document, it is locked nowhere)
        where: dict[int, list] = {}
        for i, h in enumerate(hashes):
            w = where.get(h)
            if w is None:
                where[h] = [i, i]
            else:
                w[1] = i
        for h, (first, last) in where.items():
            self.hashes.append(h)
            self.codes.append(INFORMATIVE | (HEAD if last < zone else 0) | (TAIL if first >= n - zone else 0))
        self.doc_entries.append(len(where))
        return hashes

    def table(self) -> LineTable:
        """Per distinct line hash of the shard: df, head, tail, informative occurrences, summed chance."""
        if not self.hashes:
            return LineTable.empty(self.docs)
        h = np.array(self.hashes, dtype=np.uint64)
        codes = np.array(self.codes, dtype=np.uint8)
        informative = (codes & INFORMATIVE) > 0
        chance = np.repeat(np.array(self.doc_chance), np.array(self.doc_entries)) * informative
        uniq, inv = np.unique(h, return_inverse=True)
        m = len(uniq)
        return LineTable(
            docs=self.docs,
            hash=uniq,
            df=np.bincount(inv, minlength=m).astype(np.float64),
            head=np.bincount(inv, weights=(codes & HEAD) > 0, minlength=m),
            tail=np.bincount(inv, weights=(codes & TAIL) > 0, minlength=m),
            informative=np.bincount(inv, weights=informative, minlength=m),
            chance=np.bincount(inv, weights=chance, minlength=m),
        )
