"""The dedup_report settings, declared once: the asset's run config and the plain stage functions share them."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from tokenmill.settings import StageSettings
from tokenmill.stages.dedup import minhash as mh

# shingle sizes below the first length bound, below the second, beyond. Words: a short text has few word 2-grams, so
# one word added or swapped keeps Jaccard high ("AEdiles, seize him!" / "Seize him, AEdiles!"): 3-grams there
CHAR_SIZES, WORD_SIZES = (2, 3, 5), (3, 2, 5)


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
    shingles: Literal["by_script", "chars"] = Field(
        "by_script",
        description="Shingle unit: 'by_script' = words for texts mostly in space-separated scripts (Latin, "
        "Cyrillic, Greek, Arabic, Hangul, ...: reordered words are not near duplicates), characters for texts "
        "mostly in scripts written without spaces (Han, kana, Thai, Lao, Khmer, Myanmar, Tibetan); 'chars' = "
        "characters for every text",
    )
    ngram: int = Field(
        0,
        ge=0,
        le=64,
        description="Shingle size in units (characters, or words); 0 = by the key's length in those units: 2 "
        "below the first bound (ngram_bounds for characters, word_ngram_bounds for words), 3 below the second, "
        "else 5 (one substitution in a 28-character poem leaves Jaccard 0.86 with 2-grams, 0.79 with 3-grams, "
        "0.66 with 5-grams)",
    )
    ngram_bounds: list[int] = Field(
        [100, 1000],
        min_length=2,
        max_length=2,
        description="Key-length bounds (characters) of the automatic character shingle size: two increasing lengths",
    )
    word_ngram_bounds: list[int] = Field(
        [20, 2000],
        min_length=2,
        max_length=2,
        description="Word-count bounds of the automatic word shingle size: two increasing counts (the demo's "
        "planted Latin near duplicates, 33-157 words, reach Jaccard 0.80-0.91 with word 2-grams, 0.68-0.88 "
        "with 3-grams)",
    )
    bands: int = Field(
        0,
        ge=0,
        le=1024,
        description="LSH bands; 0 = chosen for the threshold (with rows), favouring recall, or the "
        "shape the data root's dedup index was built with (so batches indexed under an earlier default still match)",
    )
    rows: int = Field(
        0, ge=0, le=1024, description="LSH rows per band; 0 = chosen with bands. bands * rows <= num_perm"
    )
    fn_weight: float = Field(
        0.999,
        ge=0.0,
        le=1.0,
        description="Weight of missed pairs against false candidates when choosing bands x rows (0.999 at threshold "
        "0.8: 21 x 6, which catches a pair at 0.8 with probability 0.998; every candidate is verified exactly, so a "
        "false one costs only time)",
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
        description="Survivor of a cluster: 'richest_meta' (most non-empty meta fields, then quality: fewer "
        "replacement/garbage characters, proper casing, fewer repeated words; then earliest source (path in natural "
        "order, then line/index), then smallest id), 'first' (earliest in the input), 'longest' (longest text, then "
        "quality as richest_meta, then earliest source, then smallest id), 'first_seen' (records in input order: "
        "removed if an earlier record has the "
        "same key, else if it is within the threshold of an earlier kept record; what batches added one by one "
        "keep)",
    )
    clusters: Literal["components", "star"] = Field(
        "components",
        description="What a near duplicate is removed against: 'components' (every record joined to the kept one "
        "through verified pairs is removed, as datatrove and NeMo Curator do: one record kept per group of verified "
        "pairs, so in a chain A ~ B ~ C with A and C below the threshold only A is kept; a removed record can be below "
        "the threshold to the record it names, its similarity measured and counted as chained_removals), 'star' (a "
        "record is removed only as a near duplicate of a kept record it reaches the threshold with: the chain keeps A "
        "and C). keep 'first_seen' decides record by record in input order, as 'star' does",
    )
    max_bucket: int = Field(
        64,
        ge=2,
        le=4096,  # all m^2/2 pairs below it: 8M candidate pairs for one bucket of 4096
        description="LSH buckets larger than this (natural text: a few members; "
        "low-entropy text or a page copied a thousand times: thousands, growing with the corpus) pair "
        "each member with its next bucket_neighbours members in "
        "signature order and with the bucket's bucket_hubs hubs instead of all m^2/2 pairs; counted in the "
        "report",
    )
    bucket_neighbours: int = Field(
        4,
        ge=1,
        le=1024,
        description="Neighbours in signature order each member of a bucket above max_bucket is paired with",
    )
    bucket_hubs: int = Field(
        2,
        ge=0,
        le=64,
        description="Members of a bucket above max_bucket that every member of it is also paired with: those "
        "sharing the most signature values (outside the band) with the others, the center of a family of "
        "copies (0: neighbours only). On 50,000 web pages 2 raise near-duplicate recall from 97.1% to 99.5% for "
        "15% more candidates: neighbours alone leave such families in pieces (docs/dedup-quality.md)",
    )
    chunk_bytes: int = Field(
        8 << 20,
        ge=1,
        le=1 << 30,  # a task holds its chunk's keys, signatures and shingles (~10x the bytes)
        description="Input is split into line-aligned byte ranges of about this size: one parallel task each",
    )
    quality_blocking: bool = Field(
        False,
        description="Fail the step (the batch's earlier dedup_report stays published) when the dedup_report_quality "
        "check fails: the near-duplicate recall estimated on the batch (quality.py) has its lower bound below 0.95; "
        "False: a warning",
    )
    sample_clusters: int = Field(
        12, ge=0, le=1000, description="Sample clusters (with texts) kept in report.json and shown in the UI"
    )

    @field_validator("ngram_bounds", "word_ngram_bounds")
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

    def cluster_mode(self) -> str:
        """`clusters` as applied: keep 'first_seen' walks record by record, as 'star' does."""
        return "star" if self.keep == "first_seen" else self.clusters

    def band_shape(self) -> tuple[int, int]:
        if self.bands > 0:
            return self.bands, self.rows
        return mh.choose_bands(self.threshold, self.num_perm, self.fn_weight)

    def _tier(self, units: np.ndarray, by_word: np.ndarray) -> np.ndarray:
        """Length tier of documents of `units` characters or words: 0 below the first bound of their unit, 1 below
        the second, else 2 (always 0 with a fixed ngram)."""
        if self.ngram > 0:
            return np.zeros(len(units), dtype=np.int64)
        (w0, w1), (c0, c1) = self.word_ngram_bounds, self.ngram_bounds
        return (units >= np.where(by_word, w0, c0)).astype(np.int64) + (units >= np.where(by_word, w1, c1))

    def _code(self, tier: np.ndarray, by_word: np.ndarray) -> np.ndarray:
        """Shingle code (minhash.shingle_code) of a length tier: its size in the document's unit."""
        if self.ngram > 0:
            size = np.full(len(tier), self.ngram, dtype=np.int64)
        else:
            size = np.where(by_word, np.asarray(WORD_SIZES)[tier], np.asarray(CHAR_SIZES)[tier])
        return np.where(by_word, size | mh.WORD, size)

    def pair_codes(self, units: np.ndarray, by_word: np.ndarray) -> np.ndarray:
        """Shingle code of each pair (rows of `units`, `by_word`: (pairs, 2)): the code of its longer member; 0 (no
        shingles in common) when one side is shingled by words and the other by characters."""
        codes = self._code(self._tier(units.max(axis=1), by_word[:, 0]), by_word[:, 0])
        return np.where(by_word[:, 0] == by_word[:, 1], codes, 0)

    def items(self, units: np.ndarray, by_word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(document, shingle code) pairs to sketch, ordered by document then code: every non-empty key at the
        codes of the lengths within the threshold's ratio of its own (slack below the threshold: shingle counts are
        not exactly key lengths), so two documents near a length bound that could reach the threshold always share
        one code (a pair is compared at its longer member's)."""
        slack = self.threshold * 0.9
        lo = self._tier((units * slack).astype(np.int64), by_word)
        hi = self._tier(np.ceil(units / slack).astype(np.int64), by_word)
        docs, codes = [], []
        for tier in range(3):
            d = np.flatnonzero((units > 0) & (lo <= tier) & (tier <= hi))
            docs.append(d)
            codes.append(self._code(np.full(len(d), tier), by_word[d]).astype(np.uint8))
        doc, code = np.concatenate(docs), np.concatenate(codes)
        order = np.lexsort((code, doc))
        return doc[order].astype(np.int64), code[order]
