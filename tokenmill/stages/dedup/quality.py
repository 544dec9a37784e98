"""Step 7a, after the clusters: dedup quality on the run's own data. An estimate of near-duplicate recall (of pairs)
with an interval, and the precision of the near removals, in report.json's `quality` (the dedup_report_quality
check reads it).

What is estimated. The population is every pair of two of the batch's records (exact-group representatives with a
key) whose exact Jaccard, at the pair's shingle code, reaches the threshold. A pair is found when its two records end
in one cluster. Every candidate pair is verified exactly, so a near pair is missed only when it never became a
candidate (or was cut from a chain, clusters='star'). That has two causes:
- LSH: the two signatures agree on no band. At Jaccard s this has probability 1 - P(s) (minhash.catch_probability),
  at most 1 - P(threshold) above the threshold: counted at that rate, an upper bound, not sampled.
- Oversized buckets: a bucket above max_bucket pairs each member with a few neighbours and hubs only (buckets.py),
  so two members at the threshold may never be compared. These pairs are sampled.

The sampled frame: the pairs of members of an oversized bucket of the batch that agree on at least MIN_LANES of the
bucket's ORDER_ROWS order values (the signature rows after its band, as the bucket step sorts by them). A pair at the
threshold agrees on each with probability about the threshold, so the frame holds all but ~0.1% of the near pairs
of these buckets, and few of the pairs of unrelated pages that share a template. Its size F (counted per band) is
exact for buckets of up to ENUMERATED_MEMBERS members; a larger bucket (low-entropy text) is counted on a seeded
subset of that many members, scaled. SAMPLE_PAIRS pairs are drawn from it uniformly (seeded by the input: its
chunks' names and byte ranges, so a rerun of the same data draws the same pairs, whatever the worker count), and
each is compared exactly. A pair counts only in the first band whose frame holds it, so each distinct pair is one
Bernoulli outcome: missed (at the threshold, in two clusters), found without being verified (at the threshold, one
cluster: joined through others) or neither (below the threshold, verified already, or in an earlier band's frame).
With k of n missed, the missed near pairs are F * k / n, and likewise the found ones; the verified pairs are
exact, split into those in one cluster (V) and those left in two (A: clusters='star' and keep='first_seen' cut
chains). Recall = found / (found + missed), found = V + F * k_found / n, missed = A + F * k_missed / n.

The interval: a Wilson interval for each of the two shares at Z (97.5% each, so both hold together with >= 95%),
the recall's lower bound from the found share's lower and the missed share's upper bound with the LSH bound added,
its upper bound the other way without it. Assumptions: pairs with an earlier batch's record (dedup_batch) are not
sampled (they were compared when that record was added, against its kept record only); frame pairs agreeing on
fewer than MIN_LANES order values in every band they share are taken as never near.

Precision needs no sample: every candidate is compared exactly, so every verified pair is a near pair (pair
precision 1), and every near removal is joined to the record it names through verified pairs. What is reported is
the direct precision: the share of the near removals that themselves reach the threshold with the record they name
(every removal's similarity is measured; in a chain, clusters='components', the far end does not), with its Wilson
interval.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.buckets import ORDER_ROWS, BucketTask, range_items
from tokenmill.stages.dedup.layout import DECISION_DIR, SIGNATURE_DIR, VERIFIED_DTYPE, Chunk, Corpus
from tokenmill.stages.dedup.settings import DedupSettings
from tokenmill.stages.dedup.verify import ExactJaccard

SAMPLE_PAIRS = 3000  # pairs compared exactly (~0.2 ms each on web pages)
MIN_LANES = 5  # order values of ORDER_ROWS a frame pair agrees on: a pair at 0.8 agrees on fewer w.p. 0.056 in one band
ENUMERATED_MEMBERS = 4096  # members of a bucket whose pairs are counted all (L^2 / 2 byte compares per row)
ROW_BLOCK = 256  # members compared with the whole bucket at once
Z = 2.2414  # two-sided 97.5%: the two shares' intervals hold together with probability >= 95%
RECALL_FLOOR = 0.95  # the check warns (or, with quality_blocking, fails) below this lower bound


@dataclass(frozen=True, kw_only=True)
class QualityTask:
    out_dir: Path
    chunks: tuple[Chunk, ...]
    lsh_files: tuple[Path, ...]
    firsts: tuple[int, ...]
    oversized: np.ndarray  # (runs, 3) uint64: band, hash, members of each oversized bucket
    verified_files: tuple[Path, ...]
    verified_pairs: int
    settings: DedupSettings
    bands: int
    rows: int
    probe_from: int


def wilson(k: int, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson score interval of a binomial share k / n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def seed_of(chunks: tuple[Chunk, ...], settings: DedupSettings) -> int:
    """The sample's seed: the input's chunks (names, byte ranges) and the MinHash seed."""
    text = "|".join(f"{c.name}:{c.start}:{c.end}:{c.records}" for c in chunks if not c.root)
    return zlib.crc32(f"{text}|{settings.seed}".encode())


def _lanes(words: np.ndarray) -> np.ndarray:
    """(members, ORDER_ROWS) uint16 order values of order_words rows (any lane order: only equality counts)."""
    return np.ascontiguousarray(words).view("<u2").reshape(len(words), -1)[:, :ORDER_ROWS]


def _frame_rows(lanes: np.ndarray, start: int, stop: int) -> np.ndarray:
    """(stop - start, members) bool: the frame pairs of members start..stop with every later member."""
    agree = np.zeros((stop - start, len(lanes)), dtype=np.int8)
    for c in range(lanes.shape[1]):
        agree += lanes[start:stop, c, None] == lanes[None, :, c]
    later = np.arange(len(lanes))[None, :] > np.arange(start, stop)[:, None]
    return (agree >= MIN_LANES) & later


def _bucket_members(task: QualityTask, band: int, h: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(docs, order lanes) of one oversized bucket's batch members, at most ENUMERATED_MEMBERS (a seeded subset)."""
    read = BucketTask(
        out_dir=task.out_dir,
        lsh_files=task.lsh_files,
        firsts=task.firsts,
        band=band,
        part=0,
        lo=h,
        hi=h + 1,
        max_bucket=task.settings.max_bucket,
        neighbours=task.settings.bucket_neighbours,
        hubs=task.settings.bucket_hubs,
        bins=1,
        rows=task.rows,
        probe_from=task.probe_from,
    )
    _, docs, words = range_items(read)
    batch = docs >= task.probe_from
    docs, lanes = docs[batch], _lanes(words[batch])
    if len(docs) > ENUMERATED_MEMBERS:
        keep = np.sort(rng.choice(len(docs), ENUMERATED_MEMBERS, replace=False))
        docs, lanes = docs[keep], lanes[keep]
    return docs, lanes


def _draw(task: QualityTask, rng: np.random.Generator) -> tuple[float, list[tuple[int, int, int]]]:
    """(F, samples): the frame's size (scaled where a bucket was subset) and SAMPLE_PAIRS (band, a, b) drawn
    uniformly from it."""
    buckets = []
    for band, h, members in task.oversized.tolist():
        docs, lanes = _bucket_members(task, int(band), int(h), rng)
        if len(docs) < 2:
            continue
        counts = np.array(
            [_frame_rows(lanes, s, min(s + ROW_BLOCK, len(docs))).sum() for s in range(0, len(docs), ROW_BLOCK)]
        )
        scale = members * (members - 1) / (len(docs) * (len(docs) - 1))  # 1 unless subset
        buckets.append((int(band), docs, lanes, counts, scale))
    weights = np.array([b[3].sum() * b[4] for b in buckets], dtype=np.float64)
    frame = float(weights.sum())
    if frame == 0:
        return 0.0, []
    picks = np.bincount(rng.choice(len(buckets), SAMPLE_PAIRS, p=weights / frame), minlength=len(buckets))
    samples = []
    for (band, docs, lanes, counts, _), k in zip(buckets, picks.tolist()):
        if not k:
            continue
        ranks = np.sort(rng.integers(0, int(counts.sum()), k))  # the k-th frame pair of the bucket, row by row
        ends = np.cumsum(counts)
        for block in np.unique(np.searchsorted(ends, ranks, side="right")).tolist():
            start = block * ROW_BLOCK
            rows_, cols = np.nonzero(_frame_rows(lanes, start, min(start + ROW_BLOCK, len(docs))))
            before = int(ends[block - 1]) if block else 0
            for r in ranks[(ranks >= before) & (ranks < ends[block])].tolist():
                samples.append((band, int(docs[start + rows_[r - before]]), int(docs[cols[r - before]])))
    return frame, samples


class _Items:
    """Band hashes and order lanes of documents of the batch (signature files of their chunks), per shingle code."""

    def __init__(self, task: QualityTask):
        self._task = task
        self._chunks = [c for c in task.chunks if not c.root]
        self._firsts = np.array([c.first for c in self._chunks], dtype=np.int64)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def _chunk(self, ci: int):
        if ci not in self._cache:
            base = self._task.out_dir / SIGNATURE_DIR / self._chunks[ci].stem
            items = np.load(f"{base}.items.npz")
            self._cache[ci] = (
                items["item_doc"],
                items["item_n"],
                np.load(f"{base}.bands.npy", mmap_mode="r"),
                np.load(f"{base}.npy", mmap_mode="r"),
            )
        return self._cache[ci]

    def of(self, doc: int, code: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(band hashes (bands,), fold16 signature (num_perm,)) of the document's item at `code`, None if none."""
        ci = int(np.searchsorted(self._firsts, doc, side="right")) - 1
        item_doc, item_n, bands, sig = self._chunk(ci)
        at = np.flatnonzero((item_doc == doc - self._chunks[ci].first) & (item_n == code))
        if not len(at):
            return None
        return np.asarray(bands[:, at[0]]), mh.fold16(np.asarray(sig[at[0]])[None, :])[0]


def _first_band(task: QualityTask, items: _Items, oversized: set, band: int, a, b) -> bool:
    """Whether `band` is the first band whose frame holds the pair (a, b: _Items.of)."""
    (hash_a, sig_a), (hash_b, sig_b) = a, b
    for earlier in range(band):
        if hash_a[earlier] != hash_b[earlier] or (earlier, int(hash_a[earlier])) not in oversized:
            continue
        cols = [((earlier + 1) * task.rows + j) % len(sig_a) for j in range(ORDER_ROWS)]
        if int((sig_a[cols] == sig_b[cols]).sum()) >= MIN_LANES:
            return False
    return True


def _verified(files: tuple[Path, ...], corpus: Corpus, out_dir: Path) -> tuple[np.ndarray, int]:
    """(the verified pairs as sorted a * 2^32 + b keys, how many of them ended in two clusters: clusters='star'
    and keep='first_seen' cut chains, so a verified pair is not always found)."""
    parts = [np.load(f) for f in files if Path(f).exists()]
    rows = np.concatenate(parts) if parts else np.empty(0, dtype=VERIFIED_DTYPE)
    a, b = rows["a"].astype(np.int64), rows["b"].astype(np.int64)
    docs, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    cluster = _kept_of(out_dir, corpus.rows(docs).ids) if len(docs) else np.empty(0, dtype=object)
    apart = int((cluster[inverse[: len(a)]] != cluster[inverse[len(a) :]]).sum())
    return np.sort(a * (1 << 32) + b), apart


def _kept_of(out_dir: Path, ids: np.ndarray) -> np.ndarray:
    """Each id's cluster, named by its kept record's id (its own when kept)."""
    kept: dict[bytes, bytes] = {}
    for f in sorted((Path(out_dir) / DECISION_DIR).glob("*.npz")):
        z = np.load(f)
        kept.update(zip(z["id"].tolist(), z["kept_id"].tolist()))
    return np.array([kept.get(x, x) for x in ids.tolist()], dtype=object)


def precision(out_dir: Path, threshold: float) -> dict:
    """The near removals reaching the threshold with the record they name, with a Wilson interval."""
    n = k = 0
    for f in sorted((Path(out_dir) / DECISION_DIR).glob("*.npz")):
        z = np.load(f)
        near = z["level"] == 1
        n += int(near.sum())
        k += int((z["similarity"][near] >= np.float32(threshold - 1e-6)).sum())
    low, high = wilson(k, n)
    return {
        "direct_precision": k / n if n else 1.0,
        "direct_precision_low": low,
        "direct_precision_high": high,
        "near_removals": n,
    }


def estimate_quality(task: QualityTask) -> dict:
    """report.json's `quality`: recall (pairs) and direct precision estimates with their intervals, and what they rest
    on (see the module docstring)."""
    s = task.settings
    rng = np.random.default_rng(seed_of(task.chunks, s))
    frame, samples = _draw(task, rng)
    items, oversized = _Items(task), {(int(b), int(h)) for b, h, _ in task.oversized.tolist()}
    docs = np.unique(np.array([(a, b) for _, a, b in samples], dtype=np.int64).reshape(-1, 2))
    corpus = Corpus(task.out_dir, list(task.chunks))
    jaccard = ExactJaccard(corpus, docs, s)
    cluster = dict(zip(docs.tolist(), _kept_of(task.out_dir, corpus.rows(docs).ids).tolist())) if len(docs) else {}
    units, by_word = corpus.shingle_units(docs) if len(docs) else (np.empty(0), np.empty(0))
    unit = dict(zip(docs.tolist(), zip(units.tolist(), by_word.tolist())))
    verified, verified_apart = _verified(task.verified_files, corpus, task.out_dir)
    missed = found = 0
    for band, a, b in samples:
        a, b = min(a, b), max(a, b)
        if jaccard(a, b) < s.threshold - 1e-12:
            continue
        key = a * (1 << 32) + b
        pos = int(np.searchsorted(verified, key))
        if pos < len(verified) and verified[pos] == key:
            continue  # counted in V (found) or verified_apart (missed), exactly
        code = int(s.pair_codes(np.array([[unit[a][0], unit[b][0]]]), np.array([[unit[a][1], unit[b][1]]]))[0])
        ia, ib = items.of(a, code), items.of(b, code)
        if ia is None or ib is None or not _first_band(task, items, oversized, band, ia, ib):
            continue
        if cluster[a] == cluster[b]:
            found += 1
        else:
            missed += 1
    n = len(samples)
    miss_low, miss_high = wilson(missed, n)
    found_low, found_high = wilson(found, n)
    lsh_miss = 1.0 - mh.catch_probability(s.threshold, task.bands, task.rows)
    v = task.verified_pairs - verified_apart
    near = v + frame * found / n if n else float(v)
    est_missed = verified_apart + (frame * missed / n if n else 0.0)

    def recall(found_pairs: float, missed_pairs: float) -> float:
        total = found_pairs + missed_pairs
        return found_pairs / total if total else 1.0

    lsh_bound = (task.verified_pairs + frame * found_high + frame * miss_high) * lsh_miss / (1 - lsh_miss)
    return {
        "recall": recall(near, est_missed),
        "recall_low": recall(v + frame * found_low, verified_apart + frame * miss_high + lsh_bound),
        "recall_high": recall(v + frame * found_high, verified_apart + frame * miss_low),
        **precision(task.out_dir, s.threshold),
        "recall_floor": RECALL_FLOOR,
        "verified_pairs": task.verified_pairs,
        "verified_pairs_apart": verified_apart,
        "frame_pairs": round(frame),
        "sampled_pairs": n,
        "sampled_missed": missed,
        "sampled_found_unverified": found,
        "estimated_missed_pairs": round(est_missed),
        "lsh_miss_rate_at_threshold": lsh_miss,
        "seed": seed_of(task.chunks, s),
    }
