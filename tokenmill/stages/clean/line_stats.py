"""Pass 1 of the boilerplate rule: per-shard line statistics (hash, document frequency, position) as numpy arrays.

Each normalized line is hashed to 64 bits; per shard, each distinct line gets its document frequency, how often
it sits in a document's head or tail zone, and the chance of landing there at random (`LineTable`). Only these
arrays cross process boundaries (48 bytes per distinct line per shard), never the lines themselves.
Lines are hashed and placed a batch of documents at a time (one lower/digit/encode pass, numpy positions).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from itertools import compress, repeat
from zlib import adler32, crc32

import numpy as np

from tokenmill.common.io import atomic_file

DIGITS_RE = re.compile(r"\d+")
HAS_DIGIT = re.compile(r"\d").search
COUNT_FIELDS = ("df", "head", "tail", "informative", "chance")  # LineTable's arrays after `hash`, in order
# a shard's line statistics on disk (`save_lines`): one row per distinct line, sorted by hash
LINE_ROW = np.dtype([("hash", "<u8"), *((k, "<f8") for k in COUNT_FIELDS)])


@dataclass(frozen=True, kw_only=True)
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
    candidates: int = 0
    """Lines that passed min_df before pruning (set by prune_candidates)."""

    @classmethod
    def empty(cls, docs: int) -> LineTable:
        return cls(
            docs=docs,
            hash=np.zeros(0, np.uint64),
            df=np.zeros(0, np.float64),
            head=np.zeros(0, np.float64),
            tail=np.zeros(0, np.float64),
            informative=np.zeros(0, np.float64),
            chance=np.zeros(0, np.float64),
        )

    def __len__(self) -> int:
        return len(self.hash)

    def select(self, keep: np.ndarray) -> LineTable:
        """The rows where `keep` is true."""
        return replace(self, hash=self.hash[keep], **{k: getattr(self, k)[keep] for k in COUNT_FIELDS})

    @classmethod
    def concat(cls, tables: list[LineTable]) -> LineTable:
        """Tables of consecutive hash ranges as one (documents: the first's, each covers the same documents)."""
        return cls(
            docs=tables[0].docs,
            hash=np.concatenate([t.hash for t in tables]),
            **{k: np.concatenate([getattr(t, k) for t in tables]) for k in COUNT_FIELDS},
            candidates=sum(t.candidates for t in tables),
        )


def save_lines(table: LineTable, path: str | os.PathLike) -> None:
    """A shard's line statistics as one .npy of LINE_ROW rows, which the merge tasks map and cut by hash range."""
    rows = np.empty(len(table), LINE_ROW)
    rows["hash"] = table.hash
    for k in COUNT_FIELDS:
        rows[k] = getattr(table, k)
    with atomic_file(path, "wb") as f:
        np.save(f, rows)


def load_lines(path: str | os.PathLike, docs: int, lo: int, hi: int) -> LineTable:
    """The rows of `save_lines`' file whose hash is in [lo, hi) (hi up to 2**64), read from a memory map: a merge
    task holds its range of every shard, never a whole shard's table."""
    rows = np.load(path, mmap_mode="r")
    hashes = rows["hash"]
    start = int(np.searchsorted(hashes, np.uint64(lo)))
    end = len(hashes) if hi >= 1 << 64 else int(np.searchsorted(hashes, np.uint64(hi)))
    part = np.array(rows[start:end])
    return LineTable(docs=docs, hash=part["hash"].copy(), **{k: part[k].copy() for k in COUNT_FIELDS})


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


HEAD, TAIL, INFORMATIVE = 1, 2, 4  # bits of a line occurrence's position code


def batch_line_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """doc_line_hashes of every text, concatenated (uint64), and how many each text has: one lower(), one digit
    pass and one encode over the texts joined by newlines, the hashes taken by C-level map (a joining newline
    cannot change how lower() or the digit pass treat a text's ends, and no UTF-8 sequence holds a newline
    byte, so the str and bytes lines stay aligned)."""
    if not texts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    low = DIGITS_RE.sub("0", "\n".join(texts).lower())  # nearly every batch holds a digit: no search first
    raw_counts = np.fromiter(map(str.count, texts, repeat("\n")), np.int64, len(texts)) + 1
    blines = low.encode("utf-8").split(b"\n")
    if " " in low or "\t" in low:
        blines = list(map(bytes.strip, blines, repeat(b" \t")))
    lines = low.split("\n")
    if "" in lines or any(map(str.isspace, lines)):  # blank lines are left out (rare: most texts hold none)
        keep = np.fromiter((bool(ln) and not ln.isspace() for ln in lines), bool, len(lines))
        blines = list(compress(blines, keep))
        counts = np.add.reduceat(keep, np.cumsum(raw_counts) - raw_counts).astype(np.int64)
    else:
        counts = raw_counts
    crc = np.fromiter(map(crc32, blines), np.uint64, len(blines))
    return (crc << np.uint64(32)) | np.fromiter(map(adler32, blines), np.uint64, len(blines)), counts


class LineStats:
    """Per-shard accumulator of line statistics (pass 1): per distinct line of each document, its hash, a
    position code and the document's chance of landing in one edge zone at random, batch by batch in numpy."""

    def __init__(self, edge_frac: float = 0.05):
        self.edge_frac = edge_frac
        self.hashes: list[np.ndarray] = []
        self.codes: list[np.ndarray] = []
        self.chance: list[np.ndarray] = []
        self.docs = 0

    def add_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Records each distinct line of each document once (document frequency), with where it sits; returns
        batch_line_hashes(texts) (pass 2 looks them up without hashing again)."""
        self.docs += len(texts)
        hashes, n = batch_line_hashes(texts)
        total = len(hashes)
        if total == 0:
            return hashes, n
        doc = np.repeat(np.arange(len(n)), n)
        pos = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
        # a line repeated inside a document: its first and last position decide (repeated across the document,
        # it is locked nowhere); a distinct line's first and last position are its own
        order = np.lexsort((pos, hashes, doc))
        sorted_doc, sorted_hash, sorted_pos = doc[order], hashes[order], pos[order]
        starts = np.ones(total, bool)
        starts[1:] = (sorted_doc[1:] != sorted_doc[:-1]) | (sorted_hash[1:] != sorted_hash[:-1])
        group = np.cumsum(starts) - 1
        ends = np.append(np.flatnonzero(starts)[1:] - 1, total - 1)
        first, last = np.empty(total, np.int64), np.empty(total, np.int64)
        first[order] = sorted_pos[starts][group]
        last[order] = sorted_pos[ends][group]
        lines = n[doc]
        zone = np.maximum(1, np.ceil(self.edge_frac * n)).astype(np.int64)
        # a one-line document says nothing about position; from two lines on, being first (or last) every time
        # is evidence, weighed against the chance zone/n of landing there at random
        informative = lines >= 2
        codes = np.where(
            informative,
            INFORMATIVE | np.where(last < zone[doc], HEAD, 0) | np.where(first >= lines - zone[doc], TAIL, 0),
            0,
        ).astype(np.uint8)
        chance = np.where(n >= 2, zone / np.maximum(n, 1), 0.0)[doc] * informative
        entry = pos == first  # each distinct line once per document, at its first occurrence
        self.hashes.append(hashes[entry])
        self.codes.append(codes[entry])
        self.chance.append(chance[entry])
        return hashes, n

    def table(self) -> LineTable:
        """Per distinct line hash of the shard: df, head, tail, informative occurrences, summed chance."""
        if not self.hashes:
            return LineTable.empty(self.docs)
        h = np.concatenate(self.hashes)
        codes = np.concatenate(self.codes)
        informative = (codes & INFORMATIVE) > 0
        chance = np.concatenate(self.chance)
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
