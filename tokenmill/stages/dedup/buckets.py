"""Steps 3-4: LSH band buckets -> candidate pairs, partitioned by band and by band-hash range.

lsh_inputs (one task per chunk): the items of the chunk's group representatives with a non-empty key, each band
sorted by (hash, ordinal), so a bucket task reads only its hash range of every chunk; with each item its order words
(signature values of the rows after the band: how the members of an oversized bucket are ordered). Ordinals, not
global indices: an index segment's chunk (see index.py) keeps its files while its global position changes.
bucket_pairs (one task per band and hash range): candidate pairs of every bucket, written in sorted batches of at
most PAIR_BATCH pairs, with a histogram of their first documents (the parent cuts verification ranges with it).
A bucket never spans two hash ranges, so partitioned buckets are exactly the unpartitioned ones. With an index
(dedup_batch), the documents below `probe_from` are the earlier batches' kept records: they are read only where a
bucket holds a document of the batch, and two of them are never paired (they were compared when they were added).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.layout import (
    CANDIDATE_DIR,
    DOCS_DIR,
    LSH_DIR,
    SIGNATURE_DIR,
    NpyRows,
    folder,
    releases_memory,
)

PAIR_BATCH = 1 << 18  # candidate pairs a bucket task holds before it writes a sorted batch (4 MB, ~10x that in
# temporaries while sorting: with 1 << 20 a bucket task was the largest process of a 1.5M-document run)
ORDER_ROWS = 8  # signature rows an oversized bucket's members are ordered by (ample to separate thousands)
FENCE = 64  # every FENCE-th hash of each band goes to <stem>.fence.npy: a bucket task finds its hash range in a
# chunk's band with one read of the fence and two of FENCE hashes, not a binary search of ~14 reads per bound
BIN_DOCS = 128  # documents per histogram bin of first documents (verification ranges are cut on bin edges): a
# document is the first of at most bands * (max_bucket - 1) pairs, so a bin's pairs stay bounded (128 * 16 * 63 = 129k
# pairs with the defaults) whatever the corpus size, where a fixed count of bins grew them with it


@dataclass(frozen=True, kw_only=True)
class LshInputTask:
    out_dir: Path
    stem: str
    first: int
    records: int
    exact_files: tuple[Path, ...]
    rows: int


@releases_memory
def lsh_inputs(task: LshInputTask) -> int:
    """Writes lsh/<stem>.hash.npy and .doc.npy (ordinals in the chunk): (bands, items) of the chunk's
    representatives, .order.npy (bands, items, words) their order words and .fence.npy every FENCE-th hash of each
    band; returns items."""
    non_rep = np.zeros(task.records, dtype=bool)
    for path in task.exact_files:
        with NpyRows(path) as rows:
            part = rows.read(
                (), rows.searchsorted((), task.first, "doc"), rows.searchsorted((), task.first + task.records, "doc")
            )
        non_rep[part["doc"][part["doc"] != part["rep"]] - task.first] = True
    key_len = np.load(task.out_dir / DOCS_DIR / f"{task.stem}.npy", mmap_mode="r")["key_len"]
    items = np.load(task.out_dir / SIGNATURE_DIR / f"{task.stem}.items.npz")
    item_doc = items["item_doc"]
    keep = ~non_rep[item_doc] & (np.asarray(key_len)[item_doc] > 0)
    bands = np.load(task.out_dir / SIGNATURE_DIR / f"{task.stem}.bands.npy")[:, keep]
    sig = np.load(task.out_dir / SIGNATURE_DIR / f"{task.stem}.npy")[keep]
    return write_lsh(folder(task.out_dir, LSH_DIR), task.stem, item_doc[keep], bands, sig, task.rows)


def write_lsh(lsh_dir: Path, stem: str, item_doc: np.ndarray, bands: np.ndarray, sig: np.ndarray, rows: int) -> int:
    """Writes the LSH files of a batch chunk's items (their ordinals, ascending; (bands, items) band hashes;
    signatures); returns items."""
    by_band = _sort_bands(lsh_dir, stem, bands)
    words = np.empty((bands.shape[0], bands.shape[1], -(-ORDER_ROWS // 4)), dtype=np.uint64)
    folded = mh.fold16(sig)  # once for every band; the sort then moves each item's few words, not its signature
    for b, order in enumerate(by_band):
        words[b] = mh.order_words(folded, (b + 1) * rows, ORDER_ROWS)[order]
    np.save(lsh_dir / f"{stem}.doc.npy", item_doc[by_band].astype(np.int32))  # ordinals in a chunk (a few MiB)
    np.save(lsh_dir / f"{stem}.order.npy", words)
    return bands.shape[1]


def write_index_lsh(lsh_dir: Path, stem: str, bands: np.ndarray) -> int:
    """Writes the LSH files of an index segment's chunk: band hashes and item numbers (.item.npy, uint16 where they
    fit), no order words: a bucket task derives the few it needs from the segment's fold16 signatures (index
    format 4; the order words were a large part of a segment: docs/profile.md, 'Run 4 (2026-12-04, 74f3dff): no
    serial part left in the run process'); returns items."""
    by_band = _sort_bands(lsh_dir, stem, bands)
    np.save(lsh_dir / f"{stem}.item.npy", by_band.astype(np.uint16 if bands.shape[1] <= 1 << 16 else np.int32))
    return bands.shape[1]


def _sort_bands(lsh_dir: Path, stem: str, bands: np.ndarray) -> np.ndarray:
    """Saves each band's hashes sorted (.hash.npy) and every FENCE-th of them (.fence.npy); returns (bands, items)
    the item order of each band: by (hash, item), and items come by ordinal."""
    by_band = np.stack([mh.stable_argsort(h) for h in bands])
    hashes = np.take_along_axis(bands, by_band, axis=1).astype(np.uint64, copy=False)
    np.save(lsh_dir / f"{stem}.hash.npy", hashes)
    np.save(lsh_dir / f"{stem}.fence.npy", np.ascontiguousarray(hashes[:, ::FENCE]))
    return by_band


@dataclass(frozen=True, kw_only=True)
class BucketTask:
    out_dir: Path
    lsh_files: tuple[Path, ...]  # per chunk: its LSH files without the suffix (Chunk.step_file(out_dir, LSH_DIR, ""))
    firsts: tuple[int, ...]  # per chunk: global index of its first record
    band: int
    part: int
    lo: int
    hi: int
    max_bucket: int
    neighbours: int
    hubs: int
    bins: int  # histogram bins: ceil(documents / BIN_DOCS)
    rows: int  # LSH rows per band (where the band's order words start)
    pair_batch: int = PAIR_BATCH
    probe_from: int = 0  # documents below are indexed (earlier batches): only looked up, never paired together


@dataclass(frozen=True, kw_only=True)
class BucketResult:
    files: tuple[str, ...]
    band_collisions: int
    oversized_buckets: int
    pairs_not_emitted: int
    first_doc_histogram: np.ndarray | None  # candidate pairs per BIN_DOCS documents of their first document
    oversized: np.ndarray  # (buckets, 3) uint64: band, hash and members of each oversized bucket (quality.py)


def _found(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Positions of the values that are in `sorted_keys` (a binary search each: np.isin hashes both sides, much
    slower here)."""
    if len(sorted_keys) == 0:
        return np.empty(0, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_keys, values), len(sorted_keys) - 1)
    return np.flatnonzero(sorted_keys[pos] == values)


def _band_slice(base: str | Path, hashes: NpyRows, band: int, lo: int, hi: int) -> tuple[int, int]:
    """[a, b): the positions of the band's hashes in [lo, hi) in a chunk's sorted `hashes`, found through its fence
    (a binary search of the file where there is none: index segments of format 2)."""
    try:
        with NpyRows(f"{base}.fence.npy") as f:
            fence = f.read((band,), 0, f.shape[1])
    except FileNotFoundError:
        return hashes.searchsorted((band,), lo), hashes.searchsorted((band,), hi)
    return _bound(hashes, band, fence, lo), _bound(hashes, band, fence, hi)


def _bound(hashes: NpyRows, band: int, fence: np.ndarray, value: int) -> int:
    """The first position of the band whose hash is >= value (a Python int: 2**64 is past every hash)."""
    n = hashes.shape[1]
    if value >= 1 << 64:
        return n
    i = int(np.searchsorted(fence, np.uint64(value)))  # fence[i - 1] < value <= fence[i]
    if i == 0:
        return 0
    start, stop = (i - 1) * FENCE + 1, min(i * FENCE, n)
    return start + int(np.searchsorted(hashes.read((band,), start, stop), np.uint64(value)))


def range_items(task: BucketTask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hashes, docs, order words) of the band's items in the hash range, sorted by (hash, doc); an indexed item
    only where a document of the batch shares its hash."""
    band = (task.band,)
    sources = sorted(zip(task.lsh_files, task.firsts), key=lambda s: s[1] < task.probe_from)  # the batch first
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []  # (first, hashes, docs, words) per chunk
    probe = None
    for base, first in sources:
        if first < task.probe_from and probe is None:
            probe = np.sort(np.concatenate([p[1] for p in parts])) if parts else np.empty(0, dtype=np.uint64)
        with NpyRows(f"{base}.hash.npy") as f:
            a, b = _band_slice(base, f, task.band, task.lo, task.hi)
            h = f.read(band, a, b)
        rows = slice(None) if probe is None else _found(h, probe)
        if os.path.exists(f"{base}.item.npy"):  # an index segment of format 4
            with NpyRows(f"{base}.item.npy") as f:
                d, w = _index_items(Path(base), f.read(band, a, b)[rows], (task.band + 1) * task.rows)
        else:
            with NpyRows(f"{base}.doc.npy") as f:
                d = f.read(band, a, b)[rows].astype(np.int64)  # int32 ordinals (int64 in format 2 segments)
            with NpyRows(f"{base}.order.npy") as f:
                w = f.read(band, a, b)[rows]
        parts.append((first, h[rows], d + first, w))
    # in document order each chunk's items sorted by (hash, doc) follow the previous chunk's: a stable sort by hash
    # sorts them by (hash, doc)
    parts.sort(key=lambda p: p[0])
    h = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, dtype=np.uint64)
    d = np.concatenate([p[2] for p in parts]) if parts else np.empty(0, dtype=np.int64)
    w = np.concatenate([p[3] for p in parts]) if parts else np.empty((0, -(-ORDER_ROWS // 4)), dtype=np.uint64)
    order = mh.stable_argsort(h)
    return h[order], d[order], w[order]


def _index_items(base: Path, items: np.ndarray, first_row: int) -> tuple[np.ndarray, np.ndarray]:
    """(ordinals, order words) of an index segment chunk's items, from its item table and fold16 signatures (only
    the items a batch document shares a bucket with: a few rows of the mapped signatures)."""
    if len(items) == 0:
        return np.empty(0, dtype=np.int64), np.empty((0, -(-ORDER_ROWS // 4)), dtype=np.uint64)
    signatures = base.parent.parent / SIGNATURE_DIR / base.name
    item_doc = np.load(f"{signatures}.items.npz")["item_doc"]
    folded = np.load(f"{signatures}.npy", mmap_mode="r")
    return item_doc[items].astype(np.int64), mh.order_words(np.asarray(folded[items]), first_row, ORDER_ROWS)


@releases_memory
def bucket_pairs(task: BucketTask) -> BucketResult:
    h, d, words = range_items(task)
    starts = np.flatnonzero(np.concatenate(([True], h[1:] != h[:-1]))) if len(h) else np.empty(0, dtype=np.int64)
    lens = np.diff(np.append(starts, len(h)))
    big = lens > task.max_bucket
    # pairs each bucket emits (all pairs, or m * neighbours when oversized): cut the runs into groups of about
    # pair_batch pairs, so one call of mh.bucket_pairs never holds more
    emitted = mh.pairs_per_bucket(lens, task.max_bucket, task.neighbours, task.hubs)
    cuts = np.searchsorted(
        np.cumsum(emitted),
        np.arange(task.pair_batch, int(emitted.sum()) + task.pair_batch, task.pair_batch),
        side="right",
    )
    cuts = np.unique(np.concatenate(([0], np.minimum(cuts, len(starts)), [len(starts)])))
    stats = {"oversized_buckets": 0, "pairs_not_emitted": 0}
    collisions = 0
    held: list[np.ndarray] = []
    files: list[str] = []
    hist = np.zeros(task.bins, dtype=np.int64)
    cand_dir = folder(task.out_dir, CANDIDATE_DIR)

    def flush():
        pairs = mh.unique_pairs(np.concatenate(held))
        held.clear()
        path = cand_dir / f"b{task.band:03d}-h{task.part:04d}-{len(files):04d}.npy"
        np.save(path, np.ascontiguousarray(pairs.T))
        hist[:] += np.bincount(pairs[:, 0] // BIN_DOCS, minlength=task.bins)
        files.append(path.name)

    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        a = int(starts[lo])
        b = int(starts[hi]) if hi < len(starts) else len(h)
        p, st = mh.bucket_pairs(h[a:b], d[a:b], task.max_bucket, task.neighbours, words[a:b], task.hubs)
        p = p[(p[:, 0] >= task.probe_from) | (p[:, 1] >= task.probe_from)]
        for k in stats:
            stats[k] += st[k]
        collisions += len(p)
        if len(p):
            held.append(p)
        if sum(len(x) for x in held) >= task.pair_batch:
            flush()
    if held:
        flush()
    return BucketResult(
        files=tuple(files),
        band_collisions=collisions,
        oversized_buckets=stats["oversized_buckets"],
        pairs_not_emitted=stats["pairs_not_emitted"],
        first_doc_histogram=hist,
        oversized=np.stack(
            [np.full(int(big.sum()), task.band, dtype=np.uint64), h[starts[big]], lens[big].astype(np.uint64)], axis=1
        ),
    )
