"""Orchestration of the dedup stage: the steps in order, each a map over small task dataclasses naming files.

`build_dedup_report(in_dir, out_dir, settings)` runs steps 1-7 and leaves in `out_dir`: report.json, clusters.jsonl,
decisions/ (the removed records per chunk), signatures/ (per chunk MinHash signatures, band hashes and items) and
_stats.json; the other step files are removed at the end. `write_deduped` (apply.py) is step 8.

`dedup_batch(cleaned_dir, index_dirs, report_out, index_out, settings)` deduplicates one batch against the index
segments of the earlier batches (index.py) and within itself: the same steps over the index's chunks followed by
the batch's, numbered in that order, where the index's chunks only join in: their digests in the exact step,
their band hashes where a bucket holds a record of the batch, their keys and signatures where such a pair is
verified. It writes the same files as build_dedup_report to `report_out` (so `write_deduped` applies it unchanged)
and the batch's index segment to `index_out`. The keep rule, across batches: an indexed record is never removed (it
was published with its batch); a record of the batch with the key of an indexed record is its exact duplicate, one
verifying at or above the threshold against an indexed kept record is a near duplicate of the earliest such, and
the keep rule decides among the others. With keep="first_seen" that is exactly what one build over all batches in
order with keep="first_seen" keeps (a greedy walk in input order, see clusters.py), as long as no LSH bucket is
oversized (max_bucket: such a bucket's members are paired with neighbours, which depend on who is in it). With the
other rules a one-shot build picks each cluster's survivor over all batches, so a later batch's record may win
there, never here (first seen wins across batches).

Memory: every task holds one chunk, or one partition (a digest range, a band and hash range, a range of first
documents) sized by `Partitions`, or (clusters) only the documents that are in some exact group or verified pair.
Tasks read their slices of the step files with positioned reads (layout.NpyRows), never mapped. This process holds
counts, file names and the candidate pairs per BIN_DOCS documents, never per-document arrays of the corpus. With
an index, the partitions are sized over the index and the batch together, and the clusters hold only the indexed
records that some record of the batch duplicates: memory per task stays bounded as the index grows.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from tokenmill.common.parallel import default_workers, map_ordered
from tokenmill.common.progress import Progress
from tokenmill.stages.dedup.buckets import (
    BIN_DOCS,
    BucketResult,
    BucketTask,
    LshInputTask,
    bucket_pairs,
    hash_ranges,
    lsh_inputs,
)
from tokenmill.stages.dedup.clusters import Clusters, ClusterTask, build_clusters, write_clusters, write_decisions
from tokenmill.stages.dedup.index import (
    SegmentTask,
    publish_segment,
    read_index,
    segment_items,
    sketch_settings,
    staging_folder,
    write_segment_chunk,
)
from tokenmill.stages.dedup.keys import ExactTask, digest_ranges, exact_groups
from tokenmill.stages.dedup.layout import (
    CANDIDATE_DIR,
    DOCS_DIR,
    EXACT_DIR,
    KEYS_DIR,
    LSH_DIR,
    VERIFIED_DIR,
    Chunk,
    folder,
    plan_chunks,
)
from tokenmill.stages.dedup.report import RunSummary, write_report
from tokenmill.stages.dedup.settings import DedupSettings
from tokenmill.stages.dedup.signatures import SketchTask, sketch_chunk
from tokenmill.stages.dedup.verify import VerifyTask, verify_range

POOL_MIN_ITEMS = 1 << 22  # band items below which the bucket step runs in this process

T = TypeVar("T")


@dataclass(frozen=True)
class Partitions:
    """Size of one task of each partitioned step (the decisions do not depend on them, only memory per task)."""

    exact_docs: int = 1 << 18  # documents per digest range (~50 bytes each, a few copies while sorting)
    bucket_items: int = 1 << 19  # LSH items per band and hash range (16 bytes each)
    verify_pairs: int = 1 << 17  # candidate pairs per range of first documents (16 bytes each, and a byte per
    # signature position of each side's document in the pre-filter: ~300 bytes a pair)


def _verify_ranges(hist: np.ndarray, bin_width: int, n_docs: int, per_task: int) -> list[tuple[int, int]]:
    """Consecutive ranges of first documents holding about `per_task` candidate pairs each (cut on bin edges)."""
    ranges, lo, held = [], 0, 0
    for b, n in enumerate(hist.tolist()):
        if held and held + n > per_task:
            ranges.append((lo, b * bin_width))
            lo, held = b * bin_width, 0
        held += n
    if held:
        ranges.append((lo, n_docs))
    return ranges


def build_dedup_report(
    in_dir: Path,
    out_dir: Path,
    settings: DedupSettings | None = None,
    workers: int | None = None,
    log=None,
    partitions: Partitions | None = None,
) -> dict:
    """Finds exact and near duplicates in `in_dir` (record JSONL) and writes the decision to `out_dir`."""
    return _deduplicate(in_dir, out_dir, settings, workers, log, partitions)


def dedup_batch(
    cleaned_dir: Path,
    index_dirs: list[Path],
    report_out: Path,
    index_out: Path,
    settings: DedupSettings | None = None,
    workers: int | None = None,
    log=None,
    partitions: Partitions | None = None,
) -> dict:
    """Deduplicates the batch `cleaned_dir` against the index segments `index_dirs` (the earlier batches', in
    order) and within itself; writes the decision to `report_out` and the batch's index segment to `index_out`."""
    return _deduplicate(cleaned_dir, report_out, settings, workers, log, partitions, (list(index_dirs), index_out))


def write_output(write: Callable[[], T]) -> T:
    """A task of the outputs step: clusters.jsonl, or one chunk of the index segment (a bound call)."""
    return write()


def _segment_tasks(c: Clusters, chunks: list[Chunk], out_dir: Path, staged: Path, rows: int) -> list[SegmentTask]:
    """Per chunk of the batch: the records left out of the index (exact duplicates: not the best of their exact
    group, or in a group with an indexed record) and those indexed without LSH data (removed as near duplicates)."""
    involved = np.arange(len(c.doc))
    dropped = ~c.docs["indexed"] & (c.group_best != involved)
    near = np.zeros(len(c.doc), dtype=bool)
    near[c.removed] = True
    near &= ~dropped
    chunk, ordinal = c.docs["chunk"], c.docs["ordinal"]
    return [
        SegmentTask(ch, out_dir, staged, ordinal[dropped & (chunk == ci)], ordinal[near & (chunk == ci)], rows)
        for ci, ch in enumerate(chunks)
        if not ch.root
    ]


def _deduplicate(
    in_dir: Path,
    out_dir: Path,
    settings: DedupSettings | None,
    workers: int | None,
    log,
    partitions: Partitions | None,
    index: tuple[list[Path], Path] | None = None,
) -> dict:
    """The steps over `in_dir`, after the index segments when `index` (segments, segment to write) is given."""
    # a plain DedupSettings (not the asset's Dagster config subclass) travels to the workers
    settings = DedupSettings.model_validate(settings.model_dump()) if settings else DedupSettings()
    partitions = partitions or Partitions()
    t_start = time.perf_counter()
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = default_workers() if workers is None else workers
    bands, rows = settings.band_shape()
    timings = {}
    sketch = sketch_settings(settings, bands, rows)
    indexed, manifests = read_index(index[0], sketch) if index else ([], [])
    base = sum(c.records for c in indexed)

    def step(name: str, fn, tasks: list, pool: int, fold=None):
        """The results of fn over the tasks, each passed through `fold` (if given) as it arrives."""
        t0 = time.perf_counter()
        progress = Progress(f"dedup: {name}", total=len(tasks), unit="tasks", log=log)
        results = []
        for r in map_ordered(fn, tasks, pool):
            results.append(fold(r) if fold else r)
            progress.advance()
        progress.finish()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0
        return results

    # 1. keys, digests, signatures and band hashes, per chunk
    chunks = plan_chunks(in_dir, settings.chunk_bytes)
    sketches = step(
        "signatures", sketch_chunk, [SketchTask(c, out_dir, settings, bands, rows) for c in chunks], workers
    )
    firsts = np.concatenate(([base], base + np.cumsum([sk.records for sk in sketches], dtype=np.int64))).tolist()
    chunks = indexed + [replace(c, first=f, records=sk.records) for c, f, sk in zip(chunks, firsts, sketches)]
    n_docs = firsts[-1]

    # 2. exact groups, per digest range
    digest_parts = digest_ranges(max(1, math.ceil(n_docs / partitions.exact_docs)))
    exact_files = tuple(folder(out_dir, EXACT_DIR) / f"p{k:04d}.npy" for k in range(len(digest_parts)))
    exact = step(
        "exact",
        exact_groups,
        [
            ExactTask(
                tuple(c.step_file(out_dir, KEYS_DIR, "") for c in chunks), tuple(c.first for c in chunks), lo, hi, path
            )
            for (lo, hi), path in zip(digest_parts, exact_files)
        ],
        workers,
    )

    # 3-4. LSH buckets over one representative per exact group, per band and hash range
    batch = [c for c in chunks if not c.root]
    rep_items = segment_items(manifests) + sum(
        step(
            "buckets",
            lsh_inputs,
            [LshInputTask(out_dir, c.stem, c.first, c.records, exact_files, rows) for c in batch],
            workers,
        )
    )
    hash_parts = hash_ranges(max(1, math.ceil(rep_items / partitions.bucket_items)))
    hist = np.zeros(max(1, math.ceil(n_docs / BIN_DOCS)), dtype=np.int64)

    def add_histogram(r: BucketResult) -> BucketResult:  # summed as they arrive: tasks and bins grow with the corpus
        np.add(hist, r.first_doc_histogram, out=hist)
        return replace(r, first_doc_histogram=None)

    lsh_files, chunk_firsts = tuple(c.step_file(out_dir, LSH_DIR, "") for c in chunks), tuple(c.first for c in chunks)
    tasks = [
        BucketTask(
            out_dir,
            lsh_files,
            chunk_firsts,
            b,
            k,
            lo,
            hi,
            settings.max_bucket,
            settings.bucket_neighbours,
            len(hist),
            probe_from=base,
        )
        for b in range(bands)
        for k, (lo, hi) in enumerate(hash_parts)
    ]
    # a pool costs ~1 s to start: small corpora bucket in this process
    buckets = step("buckets", bucket_pairs, tasks, workers if rep_items * bands >= POOL_MIN_ITEMS else 1, add_histogram)

    # 5. exact Jaccard of the candidates, per range of first documents
    doc_parts = _verify_ranges(hist, BIN_DOCS, n_docs, partitions.verify_pairs)
    files = tuple(f for r in buckets for f in r.files)
    verified_files = tuple(folder(out_dir, VERIFIED_DIR) / f"v{k:04d}.npy" for k in range(len(doc_parts)))
    verified = step(
        "verification",
        verify_range,
        [
            VerifyTask(out_dir, tuple(chunks), files, lo, hi, settings, path)
            for (lo, hi), path in zip(doc_parts, verified_files)
        ],
        workers,
    )

    # 6. clusters and keep decisions over the pairs
    t0 = time.perf_counter()
    clusters = build_clusters(ClusterTask(out_dir, tuple(chunks), exact_files, verified_files, settings.keep, base))
    write_decisions(out_dir, chunks, clusters)
    timings["clusters"] = time.perf_counter() - t0
    # clusters.jsonl and the batch's index segment in one task list: one worker writes clusters.jsonl (the longest
    # task, first) while the others copy the segment's chunks
    index_summary = None
    staged = staging_folder(Path(index[1])) if index else None
    try:
        segment = _segment_tasks(clusters, chunks, out_dir, staged, rows) if index else []
        writes = [partial(write_clusters, out_dir, clusters), *(partial(write_segment_chunk, t) for t in segment)]
        clusters_written, *parts = step("outputs", write_output, writes, workers)
        if index:
            added = publish_segment(staged, Path(index[1]), sketch, parts)
            index_summary = {
                "segments": [Path(p).name for p in index[0]],  # names (the batch keys): paths differ between roots
                "records": base,
                "kept": sum(m["kept"] for m in manifests),
                **added,
            }
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)

    # 7. report
    run = RunSummary(
        settings,
        bands,
        rows,
        chunks,
        sketches,
        exact_groups=sum(r.groups for r in exact),
        candidate_pairs=sum(r.candidates for r in verified),
        signature_rejected=sum(r.signature_rejected for r in verified),
        verified_pairs=sum(r.verified for r in verified),
        bucket_stats={
            "band_collisions": sum(r.band_collisions for r in buckets),
            "oversized_buckets": sum(r.oversized_buckets for r in buckets),
            "pairs_not_emitted": sum(r.pairs_not_emitted for r in buckets),
        },
        partitions={
            "chunks": len(chunks),
            "digest_ranges": len(digest_parts),
            "band_hash_ranges": len(hash_parts),
            "verify_ranges": len(doc_parts),
        },
        started=t_start,
        timings=timings,
        index=index_summary,
    )
    stats = write_report(out_dir, run, clusters, clusters_written)
    for name in (DOCS_DIR, KEYS_DIR, EXACT_DIR, LSH_DIR, CANDIDATE_DIR, VERIFIED_DIR):
        shutil.rmtree(out_dir / name, ignore_errors=True)
    return stats
