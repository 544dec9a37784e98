"""Two-level deduplication: exact (SHA-256 of a normalized key) and near (MinHash + LSH + exact Jaccard).

Two stage functions, each paths in, stats out:

- `build_dedup_report(in_dir, out_dir, settings)` reads `cleaned_jsonl` and writes the decision:
  `report.json` (parameters, counts, per-file counts, cluster-size histogram, sample clusters with texts),
  `clusters.jsonl` (one cluster per line: kept id, members with level and similarity, verified pairs),
  `decisions.npz` (the removed records: shard, ordinal, id, kept id, level, similarity),
  `signatures/` (per input chunk: MinHash signatures `.npy`, band hashes and the document table, so the
  signature step can run on other processes or machines) and `_stats.json`.
- `write_deduped(in_dir, report_dir, out_dir)` applies it: survivors to `part-*.jsonl` (same shard names
  as the input, lines copied byte for byte), every removed record to `removed.jsonl` with the id it
  duplicates, the level and the measured similarity, and `_stats.json`. Records in = kept + removed.

Steps of build_dedup_report (datatrove-style, each a pass handing off through arrays):
1. per input chunk, in parallel: dedup key, SHA-256, shingle hashes, MinHash signatures, band hashes;
2. global: exact groups (equal SHA-256), LSH buckets over one representative per group -> candidate pairs;
3. exact Jaccard of every candidate pair on its shingle sets (keys re-read for candidates only);
   pairs below the threshold are rejected (counted);
4. union-find over exact groups joined by verified pairs -> components; within them, in keep-rule order, a
   group joins the most preferred kept record it has a verified pair with, else it is kept itself
   (so every removed record is within the threshold of the record it names; chains are cut, not merged).

Memory: the global steps hold fixed-width arrays per document (~100 bytes: id, SHA-256, counters, source),
one band column at a time, and exact shingle arrays of candidate documents only; workers hold one chunk.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tokenmill import minhash as mh
from tokenmill.common.io import (REMOVED_FILE, STATS_FILE, JsonlWriter, atomic_write_json, concat_files,
                          read_json, record_shards)
from tokenmill.common.parallel import default_workers, map_ordered
from tokenmill.common.progress import Progress

REPORT_FILE = "report.json"
CLUSTERS_FILE = "clusters.jsonl"
DECISIONS_FILE = "decisions.npz"
SIGNATURE_DIR = "signatures"
IO_POOL_MIN_TASKS = 16  # see _io_workers
SHINGLE_BATCH = 1 << 20  # shingles hashed at once in a worker (~40 MB of temporaries)
SAMPLE_MEMBERS = 8  # records shown per sample cluster (the kept one first); clusters.jsonl lists them all
KEEP_RULES = ("richest_meta", "first", "longest")
LEVEL_NAMES = ("exact", "near")
_LOC_KIND = ("line", "index", None)


@dataclass(frozen=True)
class DedupSettings:
    """Settings of the dedup stage (the dedup_report asset's config mirrors them)."""

    threshold: float = 0.8
    """Jaccard similarity of shingle sets at or above which two records are near duplicates."""
    num_perm: int = 128
    """MinHash permutations (signature length)."""
    seed: int = 1
    """MinHash seed; signatures equal datasketch.MinHash(num_perm, seed, hashfunc=...) for the same seed."""
    ngram: int = 0
    """Shingle size in characters of the key; 0 = by key length: 2 below ngram_bounds[0], 3 below
    ngram_bounds[1], else 5. Short texts need short shingles: one substitution in a 28-character poem
    leaves Jaccard 0.86 with 2-grams, 0.79 with 3-grams, 0.66 with 5-grams."""
    ngram_bounds: tuple[int, int] = (100, 1000)
    """Key-length bounds of the automatic shingle size (see ngram)."""
    bands: int = 0
    """LSH bands; 0 = chosen for the threshold (with rows) by choose_bands, favouring recall."""
    rows: int = 0
    """LSH rows per band; 0 = chosen with bands. bands * rows <= num_perm."""
    fn_weight: float = 0.97
    """Weight of missed pairs against false candidates when choosing bands x rows (0..1)."""
    shingle_hash: str = "poly"
    """Shingle hash: 'poly' (vectorized, tokenmill.minhash.shingle_hash32) or 'sha1' (datasketch's default
    sha1_hash32, much slower, for signatures that stock datasketch reproduces without a custom hashfunc)."""
    strip_symbols: bool = True
    """Remove Unicode symbols (S*: emoji, ©, ★, math signs) from the key, besides punctuation and spaces."""
    fold_chinese: bool = False
    """Fold traditional to simplified Chinese in the key (needs the optional 'opencc' package)."""
    keep: str = "richest_meta"
    """Which record of a cluster survives: 'richest_meta' (most non-empty meta fields, then earliest
    source (path in natural order, then line/index), then smallest id), 'first' (earliest in the input),
    'longest' (longest text, then earliest source, then smallest id)."""
    max_bucket: int = 1000
    """LSH buckets larger than this emit 2m candidate pairs instead of m^2/2 (counted in the report)."""
    chunk_bytes: int = 8 << 20
    """Input is split into line-aligned byte ranges of about this size: one parallel task each."""
    sample_clusters: int = 12
    """Sample clusters (with texts) kept in report.json and shown in the UI."""

    def __post_init__(self):
        object.__setattr__(self, "ngram_bounds", tuple(int(x) for x in self.ngram_bounds))
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.ngram < 0 or len(self.ngram_bounds) != 2 or not 0 < self.ngram_bounds[0] <= self.ngram_bounds[1]:
            raise ValueError(f"ngram must be >= 0 (0 = by length) and ngram_bounds two increasing lengths, got "
                             f"{self.ngram}, {self.ngram_bounds}")
        if self.num_perm < 1 or self.chunk_bytes < 1:
            raise ValueError("num_perm and chunk_bytes must be positive")
        if self.keep not in KEEP_RULES:
            raise ValueError(f"keep must be one of {KEEP_RULES}, got {self.keep!r}")
        if self.shingle_hash not in mh.HASHFUNCS:
            raise ValueError(f"shingle_hash must be one of {tuple(mh.HASHFUNCS)}, got {self.shingle_hash!r}")
        if (self.bands > 0) != (self.rows > 0):
            raise ValueError("set both bands and rows, or neither (0 = chosen for the threshold)")
        if self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands * rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")

    def band_shape(self) -> tuple[int, int]:
        if self.bands > 0:
            return self.bands, self.rows
        return mh.choose_bands(self.threshold, self.num_perm, self.fn_weight)

    def pair_ngram(self, len_a: int, len_b: int) -> int:
        """Shingle size a pair is compared with: the size of its longer key."""
        return mh.ngram_size(max(len_a, len_b), self.ngram, self.ngram_bounds)

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
        b0, b1 = self.ngram_bounds
        rule = lambda L: np.where(L < b0, 2, np.where(L < b1, 3, 5))  # noqa: E731 - mh.ngram_size, vectorized
        lo, hi = rule(lo_len), rule(hi_len)
        for n in (2, 3, 5):
            d = np.flatnonzero((key_lens > 0) & (lo <= n) & (n <= hi))
            docs.append(d)
            sizes.append(np.full(len(d), n, dtype=np.uint8))
        doc, size = np.concatenate(docs), np.concatenate(sizes)
        order = np.lexsort((size, doc))
        return doc[order].astype(np.int64), size[order]


# ------------------------------------------------------------------------------------------------
# Input chunks (line-aligned byte ranges of the shards)
# ------------------------------------------------------------------------------------------------


def _chunks(in_dir: Path, chunk_bytes: int) -> list[dict]:
    chunks = []
    for s, path in enumerate(record_shards(in_dir)):
        size = path.stat().st_size
        bounds = [0]
        with open(path, "rb") as f:
            while bounds[-1] + chunk_bytes < size:
                f.seek(bounds[-1] + chunk_bytes)
                f.readline()
                pos = f.tell()
                if pos >= size:
                    break
                bounds.append(pos)
        bounds.append(size)
        for c in range(len(bounds) - 1):
            chunks.append({"shard": s, "name": path.name, "path": str(path), "start": bounds[c],
                           "end": bounds[c + 1], "chunk": c})
    return chunks


def _lines(chunk: dict):
    """Non-blank lines of a chunk with their 0-based record ordinal within the chunk."""
    with open(chunk["path"], "rb") as f:
        f.seek(chunk["start"])
        data = f.read(chunk["end"] - chunk["start"])
    ordinal = 0
    for line in data.split(b"\n"):
        if line.strip():
            yield ordinal, line
            ordinal += 1


def _parse(chunk: dict, ordinal: int, line: bytes) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{chunk['path']}: record {ordinal + 1} of the chunk at byte {chunk['start']} "
                         f"is not JSON ({e.msg})") from e


def _meta_count(meta) -> int:
    if not isinstance(meta, dict):
        return 0
    return sum(1 for v in meta.values() if v not in (None, "", [], {}))


# ------------------------------------------------------------------------------------------------
# Step 1: per chunk, in workers
# ------------------------------------------------------------------------------------------------


def _stem(chunk: dict) -> str:
    return f"{Path(chunk['name']).stem}-c{chunk['chunk']:04d}"


def _sketch_chunk(task: tuple) -> dict:
    chunk, sig_dir, settings, bands, rows = task
    ids, meta_counts, text_lens, paths, locs, kinds = [], [], [], [], [], []
    path_index: dict[str, int] = {}
    texts = []
    for ordinal, line in _lines(chunk):
        rec = _parse(chunk, ordinal, line)
        text = rec.get("text")
        text = text if isinstance(text, str) else ""
        texts.append(text)
        ids.append(str(rec.get("id", "")).encode("utf-8"))
        meta_counts.append(_meta_count(rec.get("meta")))
        text_lens.append(len(text))
        src = rec.get("source") if isinstance(rec.get("source"), dict) else {}
        p = str(src.get("path", ""))
        paths.append(path_index.setdefault(p, len(path_index)))
        if isinstance(src.get("line"), int):
            locs.append(src["line"]); kinds.append(0)
        elif isinstance(src.get("index"), int):
            locs.append(src["index"]); kinds.append(1)
        else:
            locs.append(-1); kinds.append(2)
    keys = mh.dedup_keys(texts, settings.strip_symbols, settings.fold_chinese)
    del texts
    digests = [mh.key_digest(k) for k in keys]
    key_lens = [len(k) for k in keys]
    n_docs = len(keys)
    # items: (document, shingle size); a document near a length bound is sketched at both sizes
    item_doc, item_n = settings.items(np.asarray(key_lens, dtype=np.int64))
    sig = np.empty((len(item_doc), settings.num_perm), dtype=np.uint32)
    key_len_arr = np.asarray(key_lens, dtype=np.int64)
    for n in np.unique(item_n).tolist():
        sel_all = np.flatnonzero(item_n == n)
        # batches of about SHINGLE_BATCH shingles bound the worker's memory whatever the chunk holds
        cut = np.searchsorted(np.cumsum(key_len_arr[item_doc[sel_all]]),
                              np.arange(SHINGLE_BATCH, int(key_len_arr.sum()) + SHINGLE_BATCH, SHINGLE_BATCH))
        for sel in np.split(sel_all, np.unique(cut[cut < len(sel_all)])):
            if len(sel) == 0:
                continue
            hashes, offsets = mh.shingle_hashes([keys[d] for d in item_doc[sel].tolist()], n, settings.shingle_hash)
            sig[sel] = mh.signatures(hashes, offsets, settings.num_perm, settings.seed)
    band = mh.band_hashes(sig, bands, rows, salt=item_n.astype(np.uint64))
    stem = _stem(chunk)
    np.save(sig_dir / f"{stem}.npy", sig)
    np.save(sig_dir / f"{stem}.bands.npy", band)
    np.savez(sig_dir / f"{stem}.docs.npz",
             ids=np.asarray(ids, dtype=f"S{max([len(i) for i in ids] + [1])}"),
             digest=np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(n_docs, 32),
             meta_count=np.asarray(meta_counts, dtype=np.int32),
             text_len=np.asarray(text_lens, dtype=np.int64), key_len=np.asarray(key_lens, dtype=np.int64),
             path=np.asarray(paths, dtype=np.int32), paths=np.asarray(list(path_index), dtype=str),
             loc=np.asarray(locs, dtype=np.int64), loc_kind=np.asarray(kinds, dtype=np.int8),
             item_doc=item_doc, item_n=item_n)
    return {"stem": stem, "records": n_docs, "items": int(len(item_doc)),
            "shingle_sizes": dict(Counter(item_n.tolist()))}


def _fetch_keys(task: tuple) -> dict:
    """Keys (and texts when asked) of the wanted ordinals of one chunk."""
    chunk, wanted, settings, with_text = task
    wanted = set(wanted)
    ordinals, texts = [], []
    for ordinal, line in _lines(chunk):
        if ordinal in wanted:
            text = _parse(chunk, ordinal, line).get("text")
            ordinals.append(ordinal)
            texts.append(text if isinstance(text, str) else "")
    keys = mh.dedup_keys(texts, settings.strip_symbols, settings.fold_chinese)
    return {o: (k, t if with_text else None) for o, k, t in zip(ordinals, keys, texts)}


# ------------------------------------------------------------------------------------------------
# Step 2-4: global
# ------------------------------------------------------------------------------------------------


def _load_docs(sig_dir: Path, results: list[dict], chunks: list[dict]) -> dict:
    parts = [np.load(sig_dir / f"{r['stem']}.docs.npz") for r in results]
    paths_all = sorted({str(p) for part in parts for p in part["paths"].tolist()}, key=mh.natural_key)
    rank = {p: i for i, p in enumerate(paths_all)}
    cols = {k: [] for k in ("ids", "digest", "meta_count", "text_len", "key_len", "path", "loc", "loc_kind",
                            "chunk", "ordinal")}
    for c, part in enumerate(parts):
        n = len(part["meta_count"])
        remap = np.asarray([rank[str(p)] for p in part["paths"].tolist()], dtype=np.int32)
        for k in ("ids", "digest", "meta_count", "text_len", "key_len", "loc", "loc_kind"):
            cols[k].append(part[k])
        cols["path"].append(remap[part["path"]] if n else np.empty(0, dtype=np.int32))
        cols["chunk"].append(np.full(n, c, dtype=np.int32))
        cols["ordinal"].append(np.arange(n, dtype=np.int64))
    docs = {}
    for k, v in cols.items():
        if k == "ids":
            width = max([a.dtype.itemsize for a in v] + [1])
            docs[k] = np.concatenate([a.astype(f"S{width}") for a in v]) if v else np.empty(0, dtype="S1")
        elif k == "digest":
            docs[k] = np.concatenate(v) if v else np.empty((0, 32), dtype=np.uint8)
        else:
            docs[k] = np.concatenate(v) if v else np.empty(0, dtype=np.int64)
    docs["paths"] = paths_all
    docs["chunk_first"] = np.cumsum([0] + [r["records"] for r in results])
    return docs


def _exact_groups(digest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group id per document (equal SHA-256 of the key) and the representative (first doc) per group."""
    if len(digest) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    view = np.ascontiguousarray(digest).view(np.dtype((np.void, 32))).ravel()
    _, first, group = np.unique(view, return_index=True, return_inverse=True)
    # renumber groups by first occurrence so numbering follows input order
    order = np.argsort(first, kind="stable")
    renum = np.empty_like(order)
    renum[order] = np.arange(len(order))
    return renum[group.ravel()].astype(np.int64), first[order].astype(np.int64)


def _candidates(sig_dir: Path, results: list[dict], docs: dict, group: np.ndarray, reps: np.ndarray,
                bands: int, max_bucket: int) -> tuple[np.ndarray, dict]:
    first = docs["chunk_first"]
    is_rep = np.zeros(len(group), dtype=bool)
    is_rep[reps] = True
    is_rep &= docs["key_len"] > 0
    item_docs, keep_masks = [], []
    for c, r in enumerate(results):
        part = np.load(sig_dir / f"{r['stem']}.docs.npz")
        d = part["item_doc"] + first[c]
        m = is_rep[d]
        item_docs.append(d[m]); keep_masks.append(m)
    members = np.concatenate(item_docs) if item_docs else np.empty(0, dtype=np.int64)
    stats = {"oversized_buckets": 0, "pairs_not_emitted": 0, "band_collisions": 0}
    pairs = []
    bands_mm = [np.load(sig_dir / f"{r['stem']}.bands.npy", mmap_mode="r") for r in results]
    for b in range(bands):
        h = np.concatenate([bm[b][m] for bm, m in zip(bands_mm, keep_masks)]) if bands_mm else np.empty(0, np.uint64)
        p, st = mh.bucket_pairs(h, members, max_bucket)
        stats["oversized_buckets"] += st["oversized_buckets"]
        stats["pairs_not_emitted"] += st["pairs_not_emitted"]
        stats["band_collisions"] += len(p)
        pairs.append(mh.unique_pairs(p))
    del bands_mm
    allp = mh.unique_pairs(np.concatenate(pairs)) if pairs else np.empty((0, 2), dtype=np.int64)
    return allp, stats


def _verify(pairs: np.ndarray, keys: dict, settings: DedupSettings) -> np.ndarray:
    """Exact Jaccard of every candidate pair, at the pair's shingle size. Shingle arrays are built once per
    (document, size) and dropped after the document's last pair, so only the active ones are held."""
    last = {}
    for i, (a, b) in enumerate(pairs.tolist()):
        last[a] = last[b] = i
    cache: dict[tuple, np.ndarray] = {}
    sims = np.empty(len(pairs), dtype=np.float64)
    for i, (a, b) in enumerate(pairs.tolist()):
        n = settings.pair_ngram(len(keys[a]), len(keys[b]))
        sets = []
        for d in (a, b):
            s = cache.get((d, n))
            if s is None:
                s = cache[(d, n)] = mh.shingle_set(keys[d], n)
            sets.append(s)
        sims[i] = mh.jaccard(*sets)
        for d in (a, b):
            if last[d] == i:
                for m in (2, 3, 5, settings.ngram):
                    cache.pop((d, m), None)
                keys.pop(d, None)
    return sims


def _io_workers(workers: int, tasks: int) -> int:
    """Workers for a read-mostly pass: a process pool costs ~0.5-1 s to start, reading a chunk ~0.05 s, so a
    pass over fewer than IO_POOL_MIN_TASKS chunks runs in this process (measured: 6 chunks of chinese-poetry,
    write_deduped 0.6 s in-process vs 1.6 s with 2 workers)."""
    return workers if tasks >= IO_POOL_MIN_TASKS else 1


def _fetch(chunks: list[dict], docs: dict, wanted: np.ndarray, settings: DedupSettings, workers: int,
           with_text: bool) -> dict:
    """{global doc index: (key, text or None)} for the wanted documents (re-read from their chunks)."""
    wanted = np.unique(wanted)
    by_chunk = {}
    for d in wanted.tolist():
        by_chunk.setdefault(int(docs["chunk"][d]), []).append(int(docs["ordinal"][d]))
    order = sorted(by_chunk)
    tasks = [(chunks[c], by_chunk[c], settings, with_text) for c in order]
    out = {}
    for c, got in zip(order, map_ordered(_fetch_keys, tasks, _io_workers(workers, len(tasks)))):
        base = int(docs["chunk_first"][c])
        for o, v in got.items():
            out[base + o] = v
    return out


def _preference(docs: dict, rule: str) -> np.ndarray:
    """Rank of every document under the keep rule (0 = most preferred); ties are impossible (ids are unique,
    and the input position breaks any remaining tie)."""
    idx = np.arange(len(docs["meta_count"]))
    id_rank = np.argsort(np.argsort(docs["ids"], kind="stable"), kind="stable")
    if rule == "first":
        keys = (idx,)
    elif rule == "longest":
        keys = (idx, id_rank, docs["loc"], docs["path"], -docs["text_len"])
    else:  # richest_meta
        keys = (idx, id_rank, docs["loc"], docs["path"], -docs["meta_count"])
    rank = np.empty(len(idx), dtype=np.int64)
    rank[np.lexsort(keys)] = idx
    return rank


def _assign(group: np.ndarray, n_groups: int, rank: np.ndarray, edges: np.ndarray, edge_sims: np.ndarray):
    """Greedy star clustering over the verified group pairs, in keep-rule order.

    Every exact group is represented by its most preferred record. Groups are visited from the most
    preferred: a group with a verified edge to an already chosen center joins the most preferred such center
    (its records are removed as near duplicates of the center's record, with that edge's measured
    similarity); otherwise it becomes a center (its best record is kept, the rest of the group are exact
    duplicates of it). So every removed record is within the threshold of the record it names, and no two
    kept records share a verified edge; in a chain A~B~C where A and C are below the threshold, A and C
    both survive. Returns (center group per group, similarity to the center per group, best doc per group).
    """
    best = np.full(n_groups, -1, dtype=np.int64)
    by_rank = np.argsort(rank, kind="stable")
    g_sorted = group[by_rank]
    _, first_pos = np.unique(g_sorted, return_index=True)
    best[g_sorted[first_pos]] = by_rank[first_pos]
    center = np.arange(n_groups, dtype=np.int64)
    sim = np.ones(n_groups, dtype=np.float64)
    if len(edges):
        # adjacency as sorted arrays (no Python object per edge)
        src = np.concatenate([edges[:, 0], edges[:, 1]])
        dst = np.concatenate([edges[:, 1], edges[:, 0]])
        both = np.concatenate([edge_sims, edge_sims])
        by_src = np.argsort(src, kind="stable")
        src, dst, both = src[by_src], dst[by_src], both[by_src]
        nodes = np.unique(src)
        lo = np.searchsorted(src, nodes)
        hi = np.searchsorted(src, nodes, side="right")
        g_rank = rank[best]
        visit = np.argsort(g_rank[nodes], kind="stable")
        for g, a, b in zip(nodes[visit].tolist(), lo[visit].tolist(), hi[visit].tolist()):
            choice, choice_rank = -1, g_rank[g]
            for h, s in zip(dst[a:b].tolist(), both[a:b].tolist()):
                if center[h] == h and g_rank[h] < choice_rank:
                    choice, choice_rank, choice_sim = h, g_rank[h], s
            if choice >= 0:
                center[g], sim[g] = choice, choice_sim
    return center, sim, best


def _source(docs: dict, d: int) -> dict:
    src = {"path": docs["paths"][int(docs["path"][d])]}
    kind = _LOC_KIND[int(docs["loc_kind"][d])]
    if kind:
        src[kind] = int(docs["loc"][d])
    return src


def _id(docs: dict, d: int) -> str:
    return docs["ids"][d].decode("utf-8")


def _histogram(sizes: np.ndarray) -> list[dict]:
    bins = [(2, 2), (3, 3), (4, 4), (5, 5), (6, 10), (11, 100), (101, None)]
    out = []
    for lo, hi in bins:
        m = (sizes >= lo) if hi is None else ((sizes >= lo) & (sizes <= hi))
        label = f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi else f">{lo - 1}")
        out.append({"size": label, "clusters": int(m.sum()), "records": int(sizes[m].sum())})
    return out


def build_dedup_report(in_dir: Path, out_dir: Path, settings: DedupSettings = DedupSettings(),
                       workers: int | None = None, log=None) -> dict:
    """Finds exact and near duplicates in `in_dir` (record JSONL) and writes the decision to `out_dir`."""
    t_start = time.perf_counter()
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    workers = default_workers() if workers is None else workers
    bands, rows = settings.band_shape()
    sig_dir = out_dir / SIGNATURE_DIR
    sig_dir.mkdir(parents=True, exist_ok=True)
    timings = {}

    # 1. signatures, per chunk
    t0 = time.perf_counter()
    chunks = _chunks(in_dir, settings.chunk_bytes)
    progress = Progress("dedup: signatures", unit="records", log=log)
    results = []
    for r in map_ordered(_sketch_chunk, [(c, sig_dir, settings, bands, rows) for c in chunks], workers):
        results.append(r)
        progress.advance(r["records"])
    progress.finish()
    docs = _load_docs(sig_dir, results, chunks)
    n_docs = len(docs["meta_count"])
    timings["signatures"] = time.perf_counter() - t0

    # 2. exact groups, LSH candidates among one representative per group
    t0 = time.perf_counter()
    group, reps = _exact_groups(docs["digest"])
    cand, bucket_stats = _candidates(sig_dir, results, docs, group, reps, bands, settings.max_bucket)
    timings["candidates"] = time.perf_counter() - t0

    # 3. exact Jaccard of every candidate pair
    t0 = time.perf_counter()
    keys = {d: v[0] for d, v in _fetch(chunks, docs, cand.ravel(), settings, workers, with_text=False).items()}
    sims = _verify(cand, keys, settings)
    del keys
    ok = sims >= settings.threshold - 1e-12
    verified, verified_sims = cand[ok], sims[ok]
    timings["verification"] = time.perf_counter() - t0

    # 4. components by union-find; the keep rule and greedy star assignment decide what survives
    t0 = time.perf_counter()
    n_groups = len(reps)
    g_edges = np.stack([group[verified[:, 0]], group[verified[:, 1]]], axis=1) if len(verified) else \
        np.empty((0, 2), dtype=np.int64)
    uf = mh.UnionFind(n_groups)
    uf.union_pairs(g_edges.tolist())
    comp_of_group = uf.roots()
    comp = comp_of_group[group] if n_docs else np.empty(0, dtype=np.int64)
    comp_size = np.bincount(comp, minlength=n_groups) if n_docs else np.empty(0, dtype=np.int64)
    rank = _preference(docs, settings.keep)
    center, center_sim, best = _assign(group, n_groups, rank, g_edges, verified_sims)
    star = center[group] if n_docs else np.empty(0, dtype=np.int64)  # cluster = center group
    kept_doc = best[star] if n_docs else np.empty(0, dtype=np.int64)
    removed = np.flatnonzero(kept_doc != np.arange(n_docs))
    level = np.where(group[removed] == star[removed], 0, 1).astype(np.uint8)
    similarity = np.where(level == 0, 1.0, center_sim[group[removed]])
    timings["clusters"] = time.perf_counter() - t0

    # 5. outputs
    t0 = time.perf_counter()
    np.savez(out_dir / DECISIONS_FILE,
             chunk=docs["chunk"][removed], ordinal=docs["ordinal"][removed], id=docs["ids"][removed],
             kept_id=docs["ids"][kept_doc[removed]] if len(removed) else np.empty(0, dtype="S1"),
             level=level, similarity=similarity.astype(np.float32))
    star_size = np.bincount(star, minlength=n_groups) if n_docs else np.empty(0, dtype=np.int64)
    cluster_roots = np.flatnonzero(star_size >= 2)
    sizes = star_size[cluster_roots]
    kept_per_comp = np.bincount(comp_of_group[np.unique(star)], minlength=n_groups) if n_docs else star_size
    n_exact, n_near = int((level == 0).sum()), int((level == 1).sum())
    clusters_written = _write_clusters(out_dir, docs, star, comp, comp_size, removed, level, similarity,
                                       verified, verified_sims, cluster_roots, rank)
    per_source = _per_source(docs, removed, level, kept_doc)
    samples = _samples(chunks, docs, star, kept_doc, group, removed, level, similarity, cluster_roots,
                       sizes, settings, workers)
    catch = {f"{s:g}": round(mh.catch_probability(s, bands, rows), 4)
             for s in sorted({0.5, 0.7, 0.8, 0.85, 0.9, settings.threshold})}
    ngram_rule = (f"{settings.ngram}-grams" if settings.ngram > 0 else
                  f"by key length: 2-grams below {settings.ngram_bounds[0]} chars, 3-grams below "
                  f"{settings.ngram_bounds[1]}, else 5-grams; documents within the threshold's length "
                  f"ratio of a bound are sketched at both sizes; a pair is compared at its longer key's size")
    counts = {
        "records_in": n_docs, "records_kept": n_docs - len(removed), "records_removed": int(len(removed)),
        "exact_duplicates_removed": n_exact, "near_duplicates_removed": n_near,
        "exact_groups": int((np.bincount(group, minlength=len(reps)) >= 2).sum()) if n_docs else 0,
        "lsh_items": int(sum(r["items"] for r in results)),
        "candidate_pairs": int(len(cand)), "verified_pairs": int(len(verified)),
        "rejected_candidates": int(len(cand) - len(verified)),
        "band_collisions": bucket_stats["band_collisions"],
        "oversized_buckets": bucket_stats["oversized_buckets"],
        "pairs_not_emitted": bucket_stats["pairs_not_emitted"],
        "clusters": int(len(cluster_roots)), "largest_cluster": int(sizes.max()) if len(sizes) else 0,
        "components": int((comp_size >= 2).sum()),
        "components_with_several_kept": int((kept_per_comp >= 2).sum()),
        "cross_file_duplicates": int(sum(p["cross_file"] for p in per_source)),
        "empty_keys": int((docs["key_len"] == 0).sum()),
    }
    params = {
        "threshold": settings.threshold, "num_perm": settings.num_perm, "seed": settings.seed,
        "bands": bands, "rows": rows, "bands_chosen": settings.bands == 0, "ngram": settings.ngram,
        "ngram_bounds": list(settings.ngram_bounds), "ngram_rule": ngram_rule,
        "shingle_sizes": dict(sorted(sum((Counter({int(k): v for k, v in r["shingle_sizes"].items()})
                                          for r in results), Counter()).items())),
        "catch_probability": catch, "shingle_hash": settings.shingle_hash,
        "minhash": "datasketch affine32 scheme: datasketch.MinHash(num_perm, seed, hashfunc="
                   + ("tokenmill.minhash.shingle_hash32" if settings.shingle_hash == "poly"
                      else "datasketch.hashfunc.sha1_hash32 (bytes)") + ")",
        "key": "NFKC, casefold, remove punctuation/separators/controls" + (" /symbols" if settings.strip_symbols
                                                                          else "")
               + (", traditional->simplified" if settings.fold_chinese else "") + "; SHA-256",
        "keep": settings.keep, "settings": {k: (list(v) if isinstance(v, tuple) else v)
                                            for k, v in asdict(settings).items()},
    }
    shards = {}
    for c, r in zip(chunks, results):
        s = shards.setdefault(c["name"], {"name": c["name"], "bytes": Path(c["path"]).stat().st_size,
                                          "records": 0})
        s["records"] += r["records"]
    timings["outputs"] = time.perf_counter() - t0
    seconds = time.perf_counter() - t_start
    report = {
        "parameters": params, "counts": counts, "per_source": per_source,
        "cluster_sizes": _histogram(sizes), "samples": samples,
        "input": {"shards": list(shards.values()),
                  "chunks": [{"name": c["name"], "chunk": c["chunk"], "start": c["start"], "end": c["end"],
                              "records": r["records"], "stem": r["stem"]} for c, r in zip(chunks, results)]},
        "files": {"clusters": CLUSTERS_FILE, "decisions": DECISIONS_FILE, "signatures": SIGNATURE_DIR,
                  "clusters_written": clusters_written,
                  "signature_layout": "signatures/<chunk>.npy: uint32 (items, num_perm) MinHash signatures; row i "
                                      "is document item_doc[i] (0-based record of the chunk) sketched with "
                                      "item_n[i]-grams (both in <chunk>.docs.npz); <chunk>.bands.npy: uint64 "
                                      "(bands, items) band hashes. datasketch.MinHash(num_perm, seed, hashfunc="
                                      + ("tokenmill.minhash.shingle_hash32" if settings.shingle_hash == "poly"
                                         else "datasketch.hashfunc.sha1_hash32")
                                      + ", hashvalues=row, scheme='affine32') rebuilds a row as a datasketch "
                                      "MinHash."},
        "seconds": round(seconds, 3), "timings": {k: round(v, 3) for k, v in timings.items()},
    }
    atomic_write_json(out_dir / REPORT_FILE, report)
    stats = {"docs_in": n_docs, "docs_out": n_docs - len(removed), "dropped_exact_duplicate": n_exact,
             "dropped_near_duplicate": n_near, "seconds": round(seconds, 3),
             **{k: v for k, v in counts.items() if k not in ("records_in", "records_kept")},
             "bands": bands, "rows": rows, "timings": report["timings"]}
    atomic_write_json(out_dir / STATS_FILE, stats)
    return stats


def _write_clusters(out_dir, docs, star, comp, comp_size, removed, level, similarity, verified, verified_sims,
                    cluster_roots, rank) -> int:
    """clusters.jsonl: one line per cluster (one kept record and the records removed as its duplicates),
    ordered by the kept record's input position; `component` links clusters that union-find joined."""
    lvl = dict(zip(removed.tolist(), zip(level.tolist(), similarity.tolist())))
    edges: dict[int, list] = {}
    links: dict[int, list] = {}  # verified pairs between two clusters of one component (a chain cut)
    for (a, b), s in zip(verified.tolist(), verified_sims.tolist()):
        pair = [_id(docs, a), _id(docs, b), round(float(s), 4)]
        if star[a] == star[b]:
            edges.setdefault(int(star[a]), []).append(pair)
        else:
            links.setdefault(int(star[a]), []).append(pair)
            links.setdefault(int(star[b]), []).append(pair)
    members_sorted = np.flatnonzero(np.isin(star, cluster_roots))
    members_sorted = members_sorted[np.lexsort((rank[members_sorted], star[members_sorted]))]
    bounds = np.flatnonzero(np.diff(star[members_sorted])) + 1
    runs = np.split(members_sorted, bounds) if len(members_sorted) else []
    runs.sort(key=lambda r: int(r[0]))
    with JsonlWriter(out_dir / CLUSTERS_FILE) as w:
        for i, run in enumerate(runs):
            kept = int(run[0])
            members = [{"id": _id(docs, kept), "role": "kept", "source": _source(docs, kept)}]
            for d in run[1:].tolist():
                lv, sim = lvl[d]
                members.append({"id": _id(docs, d), "role": "removed", "level": LEVEL_NAMES[lv],
                                "similarity": round(sim, 4), "source": _source(docs, d)})
            levels = {m.get("level") for m in members[1:]}
            w.write({"cluster": i, "kept": _id(docs, kept), "size": len(run),
                     "level": levels.pop() if len(levels) == 1 else "mixed", "members": members,
                     "verified_pairs": edges.get(int(star[kept]), []),
                     "linked_pairs": links.get(int(star[kept]), []),
                     "component": int(comp[kept]), "component_size": int(comp_size[comp[kept]])})
        return w.count


def _per_source(docs, removed, level, kept_doc) -> list[dict]:
    n_paths = len(docs["paths"])
    path = docs["path"]
    rin = np.bincount(path, minlength=n_paths)
    ex = np.bincount(path[removed[level == 0]], minlength=n_paths)
    ne = np.bincount(path[removed[level == 1]], minlength=n_paths)
    cross_mask = path[removed] != path[kept_doc[removed]]
    cross = np.bincount(path[removed[cross_mask]], minlength=n_paths)
    return [{"path": p, "records_in": int(rin[i]), "kept": int(rin[i] - ex[i] - ne[i]),
             "exact_removed": int(ex[i]), "near_removed": int(ne[i]), "cross_file": int(cross[i])}
            for i, p in enumerate(docs["paths"])]


def _samples(chunks, docs, star, kept_doc, group, removed, level, similarity, cluster_roots, sizes,
             settings, workers) -> list[dict]:
    """A few clusters with their texts: the largest, the lowest similarity (borderline), cross-file ones,
    and near and exact ones spread over the input (deterministic)."""
    if len(cluster_roots) == 0 or settings.sample_clusters <= 0:
        return []
    k = settings.sample_clusters
    near_removed = removed[level == 1]
    chosen: list[int] = []

    def add(roots):
        for r in roots:
            r = int(r)
            if r not in chosen and len(chosen) < k:
                chosen.append(r)

    add(cluster_roots[np.argsort(-sizes, kind="stable")][: max(1, k // 4)])
    if len(near_removed):
        by_sim = near_removed[np.argsort(similarity[level == 1], kind="stable")]
        add(star[by_sim][: max(1, k // 4)])
        cross = near_removed[docs["path"][near_removed] != docs["path"][kept_doc[near_removed]]]
        add(star[cross][:: max(1, len(cross) // max(1, k // 4))][: max(1, k // 4)])
        spread = np.unique(star[near_removed])
        add(spread[:: max(1, len(spread) // max(1, k // 4))])
    exact_roots = np.unique(star[removed[level == 0]])
    add(exact_roots[:: max(1, len(exact_roots) // max(1, k))])
    in_sample = np.flatnonzero(np.isin(star, chosen))
    shown = {}
    sim_of = dict(zip(removed.tolist(), similarity.tolist()))
    for r in chosen:  # the kept record and up to SAMPLE_MEMBERS - 1 removed ones, lowest similarity first
        members = in_sample[star[in_sample] == r]
        kept = int(kept_doc[members[0]])
        others = members[members != kept]
        others = sorted(others.tolist(), key=lambda d: (sim_of[d], d))[:SAMPLE_MEMBERS - 1]
        shown[r] = (len(members), [kept] + others)
    texts = _fetch(chunks, docs, np.asarray([d for _, ds in shown.values() for d in ds], dtype=np.int64), settings,
                   workers, with_text=True)
    lvl = dict(zip(removed.tolist(), zip(level.tolist(), similarity.tolist())))
    out = []
    for r in chosen:
        size, (kept, *others) = shown[r]
        rows = [{"id": _id(docs, kept), "role": "kept", "level": "", "similarity": 1.0,
                 "source": _source(docs, kept), "text": texts[kept][1]}]
        for d in others:
            lv, sim = lvl[d]
            rows.append({"id": _id(docs, d), "role": "removed", "level": LEVEL_NAMES[lv],
                         "similarity": round(float(sim), 4), "source": _source(docs, d), "text": texts[d][1]})
        out.append({"size": size, "kept": rows[0]["id"], "members_shown": len(rows), "members": rows})
    return out


# ------------------------------------------------------------------------------------------------
# Applying the decision
# ------------------------------------------------------------------------------------------------


def _apply_chunk(task: tuple) -> dict:
    chunk, tmp_dir, (ordinals, ids, kept_ids, levels, sims) = task  # this chunk's rows of decisions.npz
    removed = {o: (i.decode("utf-8"), k.decode("utf-8"), lv, float(s))
               for o, i, k, lv, s in zip(ordinals.tolist(), ids.tolist(), kept_ids.tolist(), levels.tolist(),
                                         sims.tolist())}
    stem = _stem(chunk)
    kept_path, removed_path = tmp_dir / f"{stem}.kept", tmp_dir / f"{stem}.removed"
    kept = dropped = 0
    with open(kept_path, "wb") as fk, JsonlWriter(removed_path) as fr:
        for ordinal, line in _lines(chunk):
            hit = removed.get(ordinal)
            if hit is None:
                fk.write(line.rstrip(b"\r"))
                fk.write(b"\n")
                kept += 1
                continue
            rec = _parse(chunk, ordinal, line)
            rid, kept_id, lv, sim = hit
            if str(rec.get("id")) != rid:
                raise ValueError(f"{chunk['path']}: record {ordinal + 1} of chunk {chunk['chunk']} has id "
                                 f"{rec.get('id')!r}, the dedup report expected {rid!r}: cleaned_jsonl changed "
                                 "since dedup_report was built; rematerialize dedup_report")
            fr.write({"id": rid, "duplicate_of": kept_id, "level": LEVEL_NAMES[lv],
                      "similarity": round(sim, 4), "reason": f"{LEVEL_NAMES[lv]}_duplicate",
                      "source": rec.get("source")})
            dropped += 1
    return {"kept": kept, "removed": dropped, "kept_path": str(kept_path), "removed_path": str(removed_path)}


def write_deduped(in_dir: Path, report_dir: Path, out_dir: Path, workers: int | None = None, log=None) -> dict:
    """Writes the survivors of `in_dir` to `out_dir` (same shard names) and removed.jsonl, per the report."""
    t_start = time.perf_counter()
    in_dir, report_dir, out_dir = Path(in_dir), Path(report_dir), Path(out_dir)
    report = read_json(report_dir / REPORT_FILE)
    shards = {p.name: p for p in record_shards(in_dir)}
    expected = {s["name"]: s["bytes"] for s in report["input"]["shards"]}
    actual = {name: p.stat().st_size for name, p in shards.items()}
    if expected != actual:
        raise ValueError(f"cleaned_jsonl shards {sorted(actual)} differ from those dedup_report read "
                         f"({sorted(expected)}, or sizes changed): rematerialize dedup_report")
    dec = np.load(report_dir / DECISIONS_FILE)
    chunks = report["input"]["chunks"]
    by_chunk = np.argsort(dec["chunk"], kind="stable")
    bounds = np.searchsorted(dec["chunk"][by_chunk], np.arange(len(chunks) + 1))
    per_chunk = [tuple(dec[k][by_chunk[bounds[i]:bounds[i + 1]]] for k in ("ordinal", "id", "kept_id", "level",
                                                                           "similarity"))
                 for i in range(len(chunks))]
    tmp_dir = out_dir / ".chunks"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tasks = [({**c, "path": str(shards[c["name"]])}, tmp_dir, per_chunk[i]) for i, c in enumerate(chunks)]
    progress = Progress("dedup: writing survivors", unit="records", log=log)
    results = []
    for r in map_ordered(_apply_chunk, tasks, _io_workers(workers, len(tasks))):
        results.append(r)
        progress.advance(r["kept"] + r["removed"])
    progress.finish()
    by_shard: dict[str, list] = {}
    for c, r in zip(chunks, results):
        by_shard.setdefault(c["name"], []).append(r["kept_path"])
    for name, parts in by_shard.items():
        concat_files(parts, out_dir / name)
    for name in shards:  # an empty input shard stays an (empty) output shard
        if name not in by_shard:
            (out_dir / name).touch()
    concat_files([r["removed_path"] for r in results], out_dir / REMOVED_FILE)
    tmp_dir.rmdir()
    kept, dropped = sum(r["kept"] for r in results), sum(r["removed"] for r in results)
    lv = Counter(dec["level"].tolist())
    stats = {"docs_in": kept + dropped, "docs_out": kept, "dropped_exact_duplicate": int(lv.get(0, 0)),
             "dropped_near_duplicate": int(lv.get(1, 0)), "seconds": round(time.perf_counter() - t_start, 3),
             "shards": len(shards)}
    if dropped != len(dec["chunk"]):
        raise ValueError(f"removed {dropped} records but the report lists {len(dec['chunk'])}")
    atomic_write_json(out_dir / STATS_FILE, stats)
    return stats
