"""Step 5, one task per range of first documents: candidate pairs -> verified pairs.

A task reads the slice of its range from every candidate batch (sorted by first document) and drops the pairs seen
in several bands. A signature pre-filter rejects the pairs whose MinHash signatures, at the pair's shingle code (the
size of its longer key, in characters or words; pairs shingled in different units are rejected), agree on fewer
positions than a pair at the threshold does except with probability FILTER_MISS (low-entropy text: nearly every LSH
candidate; natural text: a few); the rest are compared exactly, by their shingle sets. Key lengths, signature rows
and keys are read by index from the per-chunk files, one chunk mapped at a time, so the task holds its pairs, a byte
per signature position of their documents, and one shingle set at a time per side, whatever the corpus size.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.layout import CANDIDATE_DIR, VERIFIED_DTYPE, Chunk, Corpus, NpyRows, releases_memory
from tokenmill.stages.dedup.settings import DedupSettings

FILTER_MISS = 1e-9  # chance that the pre-filter rejects a pair at the threshold (above it: less)
AGREEMENT_BATCH = 1 << 16  # pairs compared at once (two (batch, num_perm) byte arrays)
# keys read at once, in shingle units (code points or words) of the pairs' two sides: bounded by their size, not
# their count, so a task of short keys visits each chunk's key files once or a few times, not once per few thousand
# pairs (the pairs' second documents are spread over every chunk: chunk visits grew with the corpus squared)
KEY_BATCH_UNITS = 1 << 22
SECOND_SETS_BYTES = 64 << 20  # of the second documents' shingle sets kept for their next pair


@dataclass(frozen=True, kw_only=True)
class VerifyTask:
    out_dir: Path
    chunks: tuple[Chunk, ...]
    candidate_files: tuple[str, ...]
    lo: int  # first documents in [lo, hi)
    hi: int
    settings: DedupSettings
    out: Path


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    candidates: int
    signature_rejected: int
    verified: int


@functools.lru_cache(maxsize=16)
def min_agreement(threshold: float, num_perm: int, miss: float = FILTER_MISS) -> int:
    """The largest k with P(Binomial(num_perm, threshold) < k) <= miss: the signatures of a pair at Jaccard
    `threshold` agree on at least k of num_perm positions except with probability `miss` (folding values to a
    byte only adds agreements)."""
    if threshold >= 1.0:
        return num_perm
    log_p, log_q = math.log(threshold), math.log1p(-threshold)
    below = 0.0  # P(X < k)
    for k in range(num_perm + 1):
        pmf = math.exp(
            math.lgamma(num_perm + 1)
            - math.lgamma(k + 1)
            - math.lgamma(num_perm - k + 1)
            + k * log_p
            + (num_perm - k) * log_q
        )
        if below + pmf > miss:
            return k
        below += pmf
    return num_perm


def range_candidates(out_dir: Path, files: tuple[str, ...], lo: int, hi: int) -> np.ndarray:
    """Unique candidate pairs (k, 2) with the first document in [lo, hi), sorted."""
    parts = []
    for name in files:
        with NpyRows(Path(out_dir) / CANDIDATE_DIR / name) as f:
            a, b = f.searchsorted((0,), lo), f.searchsorted((0,), hi)
            if b > a:
                parts.append(np.stack([f.read((0,), a, b), f.read((1,), a, b)], axis=1))
    return mh.unique_pairs(np.concatenate(parts)) if parts else np.empty((0, 2), dtype=np.int64)


def signature_agreement(corpus: Corpus, pairs: np.ndarray, sizes: np.ndarray, num_perm: int) -> np.ndarray:
    """Signature positions each pair agrees on at its shingle size (num_perm when a side was not sketched at that
    size: such a pair is left to the exact comparison)."""
    sides = []
    for side in (0, 1):
        docs, inverse = np.unique(pairs[:, side] * 256 + sizes, return_inverse=True)
        rows, found = corpus.signature_bytes(docs // 256, docs % 256, num_perm)
        sides.append((rows, found, inverse.ravel()))
    (rows_a, found_a, inv_a), (rows_b, found_b, inv_b) = sides
    agree = np.empty(len(pairs), dtype=np.int64)
    for lo in range(0, len(pairs), AGREEMENT_BATCH):
        sl = slice(lo, lo + AGREEMENT_BATCH)
        agree[sl] = (rows_a[inv_a[sl]] == rows_b[inv_b[sl]]).sum(axis=1)
    agree[~(found_a[inv_a] & found_b[inv_b])] = num_perm
    return agree


def key_batches(cost: np.ndarray, budget: int) -> list[int]:
    """Bounds [0, ..., len(cost)] of consecutive batches whose summed cost stays within `budget` (at least one item
    each)."""
    ends = np.cumsum(cost)
    bounds = [0]
    while bounds[-1] < len(cost):
        lo = bounds[-1]
        hi = int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + budget, side="right"))
        bounds.append(max(hi, lo + 1))
    return bounds


class ExactJaccard:
    """Exact Jaccard of two of some documents (global indices) at the pair's shingle code, as verify_range measures
    it; 0 for a pair shingled in different units. Their keys are read at once. For one document compared with many
    (the second, `b`): its shingle set is kept; the first's only until another first comes."""

    def __init__(self, corpus: Corpus, docs: np.ndarray, settings: DedupSettings):
        docs = np.unique(docs)
        units, by_word = corpus.shingle_units(docs)
        self._keys = dict(zip(docs.tolist(), corpus.keys(docs)))
        self._units = dict(zip(docs.tolist(), zip(units.tolist(), by_word.tolist())))
        self._settings = settings
        self._kept: dict[tuple[int, int], np.ndarray] = {}
        self._held: tuple[int, int, np.ndarray] | None = None

    def __call__(self, a: int, b: int) -> float:
        (units_a, word_a), (units_b, word_b) = self._units[a], self._units[b]
        code = int(self._settings.pair_codes(np.array([[units_a, units_b]]), np.array([[word_a, word_b]]))[0])
        if not code:
            return 0.0
        if self._held is None or self._held[:2] != (a, code):
            self._held = (a, code, mh.coded_shingle_set(self._keys[a], code))
        if (b, code) not in self._kept:
            self._kept[b, code] = mh.coded_shingle_set(self._keys[b], code)
        return mh.jaccard(self._held[2], self._kept[b, code])


class _ShingleSets:
    """The second documents' shingle sets, kept while they fit SECOND_SETS_BYTES: a page copied many times is the
    second side of many pairs (each of its copies' first), and cutting its shingles again each time was most of
    the verification on the web."""

    def __init__(self, keys: dict[int, str]):
        self._keys = keys
        self._sets: dict[tuple[int, int], np.ndarray] = {}
        self._bytes = 0

    def get(self, doc: int, code: int) -> np.ndarray:
        found = self._sets.get((doc, code))
        if found is None:
            found = mh.coded_shingle_set(self._keys[doc], code)
            if self._bytes + found.nbytes > SECOND_SETS_BYTES:
                self._sets.clear()
                self._bytes = 0
            self._sets[doc, code] = found
            self._bytes += found.nbytes
        return found


@releases_memory
def verify_range(task: VerifyTask) -> VerifyResult:
    s = task.settings
    pairs = range_candidates(task.out_dir, task.candidate_files, task.lo, task.hi)
    corpus = Corpus(task.out_dir, list(task.chunks))
    units, by_word = corpus.shingle_units(pairs.ravel())
    sizes = s.pair_codes(units.reshape(-1, 2), by_word.reshape(-1, 2))
    passed = (sizes > 0) & (
        signature_agreement(corpus, pairs, sizes, s.num_perm) >= min_agreement(s.threshold, s.num_perm)
    )
    pairs, sizes = pairs[passed], sizes[passed]
    sims = np.empty(len(pairs), dtype=np.float64)
    held: tuple[int, int, np.ndarray] | None = None  # (doc, size, shingle set): pairs come sorted by first doc
    bounds = key_batches(units.reshape(-1, 2)[passed].sum(axis=1), KEY_BATCH_UNITS)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        block = pairs[lo:hi]
        docs = np.unique(block)
        keys = dict(zip(docs.tolist(), corpus.keys(docs)))
        seconds = _ShingleSets(keys)
        for i, ((a, b), n) in enumerate(zip(block.tolist(), sizes[lo:hi].tolist()), lo):
            if held is None or held[:2] != (a, n):
                held = (a, n, mh.coded_shingle_set(keys[a], n))
            sims[i] = mh.jaccard(held[2], seconds.get(b, n))
    ok = sims >= s.threshold - 1e-12
    rows = np.empty(int(ok.sum()), dtype=VERIFIED_DTYPE)
    rows["a"], rows["b"], rows["sim"] = pairs[ok, 0], pairs[ok, 1], sims[ok]
    np.save(task.out, rows)
    return VerifyResult(candidates=len(passed), signature_rejected=int((~passed).sum()), verified=len(rows))
