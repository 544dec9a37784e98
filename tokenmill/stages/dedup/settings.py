"""The dedup_report settings, declared once: the asset's run config and the plain stage functions share them."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from tokenmill.settings import StageSettings
from tokenmill.stages.dedup import minhash as mh


class DedupSettings(StageSettings):
    """Exact (SHA-256 of a normalized key) and near (MinHash + LSH + exact Jaccard) duplicate detection."""

    asset_key: ClassVar[str] = "dedup_report"

    threshold: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="Jaccard similarity of shingle sets at or above which two records are near duplicates",
    )
    num_perm: int = Field(128, ge=1, le=1024, description="MinHash permutations (signature length)")
    seed: int = Field(
        1,
        ge=0,
        le=2**32 - 1,
        description="MinHash seed; signatures equal datasketch.MinHash(num_perm, seed, hashfunc=...) for the same seed",
    )
    ngram: int = Field(
        0,
        ge=0,
        le=64,
        description="Shingle size in characters of the key; 0 = by key length: 2 "
        "below ngram_bounds[0], 3 below ngram_bounds[1], else 5 (one "
        "substitution in a 28-character poem leaves Jaccard 0.86 with "
        "2-grams, 0.79 with 3-grams, 0.66 with 5-grams)",
    )
    ngram_bounds: list[int] = Field(
        [100, 1000],
        min_length=2,
        max_length=2,
        description="Key-length bounds of the automatic shingle size (see ngram): two increasing lengths",
    )
    bands: int = Field(
        0, ge=0, le=1024, description="LSH bands; 0 = chosen for the threshold (with rows), favouring recall"
    )
    rows: int = Field(
        0, ge=0, le=1024, description="LSH rows per band; 0 = chosen with bands. bands * rows <= num_perm"
    )
    fn_weight: float = Field(
        0.97, ge=0.0, le=1.0, description="Weight of missed pairs against false candidates when choosing bands x rows"
    )
    shingle_hash: Literal["poly", "sha1"] = Field(
        "poly",
        description="Shingle hash: 'poly' (vectorized) or "
        "'sha1' (datasketch's default sha1_hash32, "
        "much slower, for stock-datasketch "
        "signatures)",
    )
    strip_symbols: bool = Field(
        True,
        description="Remove Unicode symbols (emoji, ©, ★, math signs) from the key, besides punctuation and spaces",
    )
    fold_chinese: bool = Field(
        False, description="Fold traditional to simplified Chinese in the key (needs the optional 'opencc' package)"
    )
    keep: Literal["richest_meta", "first", "longest", "first_seen"] = Field(
        "richest_meta",
        description="Survivor of a cluster: 'richest_meta' (most non-empty meta fields, then "
        "earliest source (path in natural order, then line/index), then smallest id), "
        "'first' (earliest in the input), 'longest' (longest text, then earliest "
        "source, then smallest id), 'first_seen' (records in input order: removed if an earlier record has the "
        "same key, else if it is within the threshold of an earlier kept record; what batches added one by one "
        "keep)",
    )
    max_bucket: int = Field(
        64,
        ge=2,
        description="LSH buckets larger than this (natural text: a few members; "
        "low-entropy text: thousands, growing with the corpus) pair "
        "each member with its next bucket_neighbours members in "
        "signature order instead of all m^2/2 pairs; counted in the "
        "report",
    )
    bucket_neighbours: int = Field(
        4,
        ge=1,
        le=1024,
        description="Neighbours in signature order each member of a bucket above max_bucket is paired with",
    )
    chunk_bytes: int = Field(
        8 << 20,
        ge=1,
        description="Input is split into line-aligned byte ranges of about this size: one parallel task each",
    )
    sample_clusters: int = Field(
        12, ge=0, le=1000, description="Sample clusters (with texts) kept in report.json and shown in the UI"
    )

    @field_validator("ngram_bounds")
    @classmethod
    def _increasing(cls, v: list[int]) -> list[int]:
        if not 0 < v[0] <= v[1]:
            raise ValueError(f"ngram_bounds must be two increasing positive lengths, got {list(v)}")
        return v

    @model_validator(mode="after")
    def _check_combinations(self) -> DedupSettings:
        if (self.bands > 0) != (self.rows > 0):
            raise ValueError(
                f"set both bands and rows, or neither (0 = chosen for the threshold); got bands "
                f"{self.bands}, rows {self.rows}"
            )
        if self.bands * self.rows > self.num_perm:
            raise ValueError(
                f"bands * rows = {self.bands} * {self.rows} = {self.bands * self.rows} exceeds "
                f"num_perm = {self.num_perm}"
            )
        return self

    def band_shape(self) -> tuple[int, int]:
        if self.bands > 0:
            return self.bands, self.rows
        return mh.choose_bands(self.threshold, self.num_perm, self.fn_weight)

    def pair_ngram(self, len_a: int, len_b: int) -> int:
        """Shingle size a pair is compared with: the size of its longer key."""
        return mh.ngram_size(max(len_a, len_b), self.ngram, self.ngram_bounds)

    def _ngram_rule(self, lengths: np.ndarray) -> np.ndarray:
        """mh.ngram_size by key length, vectorized."""
        if self.ngram > 0:
            return np.full(len(lengths), self.ngram, dtype=np.int64)
        b0, b1 = self.ngram_bounds
        return np.where(lengths < b0, 2, np.where(lengths < b1, 3, 5))

    def pair_ngrams(self, len_a: np.ndarray, len_b: np.ndarray) -> np.ndarray:
        """pair_ngram of many pairs."""
        return self._ngram_rule(np.maximum(len_a, len_b))

    def doc_ngrams(self, length: int) -> list[int]:
        # slack below the threshold: shingle counts are not exactly key lengths
        return mh.ngram_sizes_for(length, self.ngram, self.ngram_bounds, self.threshold * 0.9)

    def items(self, key_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(document, shingle size) pairs to sketch, ordered by document then size: doc_ngrams of every
        non-empty key, vectorized."""
        docs, sizes = [], []
        if self.ngram > 0:
            d = np.flatnonzero(key_lens > 0)
            return d.astype(np.int64), np.full(len(d), self.ngram, dtype=np.uint8)
        slack = self.threshold * 0.9
        lo_len = (key_lens * slack).astype(np.int64)
        hi_len = np.ceil(key_lens / slack).astype(np.int64)
        lo, hi = self._ngram_rule(lo_len), self._ngram_rule(hi_len)
        for n in (2, 3, 5):
            d = np.flatnonzero((key_lens > 0) & (lo <= n) & (n <= hi))
            docs.append(d)
            sizes.append(np.full(len(d), n, dtype=np.uint8))
        doc, size = np.concatenate(docs), np.concatenate(sizes)
        order = np.lexsort((size, doc))
        return doc[order].astype(np.int64), size[order]
