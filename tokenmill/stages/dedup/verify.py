"""Step 5, one task per range of first documents: exact Jaccard of every candidate pair -> verified pairs.

A task reads the slice of its range from every candidate batch (sorted by first document), drops the pairs seen
in several bands, and compares each pair's exact shingle sets at the pair's shingle size (the size of its longer
key). Keys are read by index from the per-chunk key files, so the task holds its pairs and one shingle set at a
time per side, whatever the corpus size.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.layout import CANDIDATE_DIR, VERIFIED_DTYPE, Chunk, Corpus
from tokenmill.stages.dedup.settings import DedupSettings


@dataclass(frozen=True)
class VerifyTask:
    out_dir: Path
    chunks: tuple[Chunk, ...]
    candidate_files: tuple[str, ...]
    lo: int  # first documents in [lo, hi)
    hi: int
    settings: DedupSettings
    out: Path


@dataclass(frozen=True)
class VerifyResult:
    candidates: int
    verified: int


def range_candidates(out_dir: Path, files: tuple[str, ...], lo: int, hi: int) -> np.ndarray:
    """Unique candidate pairs (k, 2) with the first document in [lo, hi), sorted."""
    parts = []
    for name in files:
        pairs = np.load(Path(out_dir) / CANDIDATE_DIR / name, mmap_mode="r")
        a, b = np.searchsorted(pairs[0], lo), np.searchsorted(pairs[0], hi)
        if b > a:
            parts.append(np.asarray(pairs[:, a:b]).T)
    return mh.unique_pairs(np.concatenate(parts)) if parts else np.empty((0, 2), dtype=np.int64)


def verify_range(task: VerifyTask) -> VerifyResult:
    pairs = range_candidates(task.out_dir, task.candidate_files, task.lo, task.hi)
    corpus = Corpus(task.out_dir, list(task.chunks))
    sims = np.empty(len(pairs), dtype=np.float64)
    held: tuple[int, int, np.ndarray] | None = None  # (doc, size, shingle set): pairs come sorted by first doc
    key_a = ""
    for i, (a, b) in enumerate(pairs.tolist()):
        if held is None or held[0] != a:
            key_a = corpus.key(a)
            held = None
        key_b = corpus.key(b)
        n = task.settings.pair_ngram(len(key_a), len(key_b))
        if held is None or held[1] != n:
            held = (a, n, mh.shingle_set(key_a, n))
        sims[i] = mh.jaccard(held[2], mh.shingle_set(key_b, n))
    corpus.close()
    ok = sims >= task.settings.threshold - 1e-12
    rows = np.empty(int(ok.sum()), dtype=VERIFIED_DTYPE)
    rows["a"], rows["b"], rows["sim"] = pairs[ok, 0], pairs[ok, 1], sims[ok]
    np.save(task.out, rows)
    return VerifyResult(len(pairs), len(rows))
