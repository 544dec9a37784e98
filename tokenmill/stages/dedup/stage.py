"""Orchestration of the dedup stage: the steps in order, each a map over small task dataclasses naming files.

`build_dedup_report(in_dir, out_dir, settings)` runs steps 1-7 and leaves in `out_dir`: report.json, clusters.jsonl,
decisions/ (the removed records per chunk) and _stats.json; the step files (signatures/ included: the index segment
keeps what later batches need of them, folded, and nothing reads them after the stage) are removed at the end.
`write_deduped` (apply.py) is step 8.

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
documents, a part of whole components of the documents in some exact group or verified pair) sized by
`Partitions`. Tasks read their slices of the step files with positioned reads (layout.NpyRows), never mapped. This
process holds counts, file names, the candidate pairs per BIN_DOCS documents and, to cut the components into parts,
a few integers per involved document (cluster_parts.plan_parts), never per-document arrays of the whole corpus.
With an index, the partitions are sized over the index and the batch together, and the clusters hold only the
indexed records that some record of the batch duplicates: memory per task stays bounded as the index grows.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tokenmill.common.parallel import default_workers, hash_ranges, map_ordered
from tokenmill.common.progress import Progress
from tokenmill.stages.dedup.buckets import (
    BIN_DOCS,
    BucketResult,
    BucketTask,
    LshInputTask,
    bucket_pairs,
    lsh_inputs,
)
from tokenmill.stages.dedup.cluster_parts import (
    ChunkTask,
    SampleTask,
    cluster_part,
    finish_chunk,
    merge_clusters,
    plan_parts,
    show_samples,
)
from tokenmill.stages.dedup.index import (
    indexed_band_shape,
    publish_segment,
    read_index,
    segment_items,
    sketch_settings,
    staging_folder,
)
from tokenmill.stages.dedup.keys import ExactResult, ExactTask, exact_groups
from tokenmill.stages.dedup.layout import (
    CANDIDATE_DIR,
    CLUSTER_PART_DIR,
    DECISION_DIR,
    DOCS_DIR,
    EXACT_DIR,
    KEYS_DIR,
    LSH_DIR,
    SIGNATURE_DIR,
    VERIFIED_DIR,
    Chunk,
    folder,
    plan_chunks,
)
from tokenmill.stages.dedup.quality import QualityTask, estimate_quality
from tokenmill.stages.dedup.report import ClusterCounts, DedupResult, RunSummary, choose_samples, write_report
from tokenmill.stages.dedup.settings import DedupSettings
from tokenmill.stages.dedup.signatures import SketchTask, sketch_chunk
from tokenmill.stages.dedup.verify import VerifyResult, VerifyTask, verify_range

# what only the steps read, removed when the report is written: the per-chunk signatures, band hashes and items
# (most of dedup_report's disk: docs/profile.md, 'Disk per input byte, first cuts') went into the index segment
# (index.py, folded to 16 bits) before that
STEP_DIRS = (DOCS_DIR, KEYS_DIR, SIGNATURE_DIR, EXACT_DIR, LSH_DIR, CANDIDATE_DIR, VERIFIED_DIR, CLUSTER_PART_DIR)
POOL_MIN_ITEMS = 1 << 22  # band items below which the bucket step runs in this process

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Partitions:
    """Size of one task of each partitioned step (the decisions do not depend on them, only memory per task)."""

    exact_docs: int = 1 << 18  # documents per digest range (~50 bytes each, a few copies while sorting)
    bucket_items: int = 1 << 19  # LSH items per band and hash range (16 bytes each)
    verify_pairs: int = 1 << 17  # candidate pairs per range of first documents (16 bytes each, and a byte per
    # signature position of each side's document in the pre-filter: ~300 bytes a pair)
    cluster_docs: int = 1 << 18  # involved documents per clustering part (whole components; ~500 bytes each)


@dataclass(kw_only=True)
class DedupRun:
    """What every step of one run reads (settings, folders, the index read, workers, log) and the seconds each step
    took (for the report)."""

    in_dir: Path
    out_dir: Path
    settings: DedupSettings
    partitions: Partitions
    workers: int
    log: Any  # a logging.Logger or Dagster's log manager, or None
    bands: int
    rows: int
    sketch: dict  # the settings the signatures depend on (index.sketch_settings)
    index_dirs: list[Path]  # dedup_batch: the earlier batches' segments, in order
    segment_out: Path | None  # dedup_batch: the batch's segment to write
    indexed: list[Chunk]  # the chunks of the index segments (numbered from 0)
    manifests: list[dict]  # the index segments' manifests
    started: float  # time.perf_counter() when the run started
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def start(cls, in_dir, out_dir, settings, workers, log, partitions, index) -> DedupRun:
        """A run over `in_dir` into `out_dir` (created); `index`: (segments to read, segment to write) or None."""
        started = time.perf_counter()
        # a plain DedupSettings (not the asset's Dagster config subclass) travels to the workers
        settings = DedupSettings.model_validate(settings.model_dump()) if settings else DedupSettings()
        bands, rows = settings.band_shape()
        if index and settings.bands == 0:
            bands, rows = indexed_band_shape(index[0]) or (bands, rows)
        sketch = sketch_settings(settings, bands, rows)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        indexed, manifests = read_index(index[0], sketch) if index else ([], [])
        return cls(
            in_dir=Path(in_dir),
            out_dir=Path(out_dir),
            settings=settings,
            partitions=partitions or Partitions(),
            workers=default_workers() if workers is None else workers,
            log=log,
            bands=bands,
            rows=rows,
            sketch=sketch,
            index_dirs=list(index[0]) if index else [],
            segment_out=Path(index[1]) if index else None,
            indexed=indexed,
            manifests=manifests,
            started=started,
        )

    @property
    def indexed_docs(self) -> int:
        """Records of the index segments: the documents numbered before the batch's."""
        return sum(c.records for c in self.indexed)

    def step(self, name: str, fn, tasks: list, pool: int | None = None, fold=None) -> list:
        """The results of fn over the tasks on `pool` workers (default: the run's), each passed through `fold` (if
        given) as it arrives; the seconds it took add to the step's timing."""
        with self.timed(name):
            progress = Progress(f"dedup: {name}", total=len(tasks), unit="tasks", log=self.log)
            results = []
            for r in map_ordered(fn, tasks, self.workers if pool is None else pool):
                results.append(fold(r) if fold else r)
                progress.advance()
            progress.finish()
        return results

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Adds the seconds the block takes to the step's timing."""
        t0 = time.perf_counter()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0


def build_dedup_report(
    in_dir: Path,
    out_dir: Path,
    settings: DedupSettings | None = None,
    workers: int | None = None,
    log=None,
    partitions: Partitions | None = None,
) -> DedupResult:
    """Finds exact and near duplicates in `in_dir` (record JSONL) and writes the decision to `out_dir`."""
    return _deduplicate(DedupRun.start(in_dir, out_dir, settings, workers, log, partitions, None))


def dedup_batch(
    cleaned_dir: Path,
    index_dirs: list[Path],
    report_out: Path,
    index_out: Path,
    settings: DedupSettings | None = None,
    workers: int | None = None,
    log=None,
    partitions: Partitions | None = None,
) -> DedupResult:
    """Deduplicates the batch `cleaned_dir` against the index segments `index_dirs` (the earlier batches', in
    order) and within itself; writes the decision to `report_out` and the batch's index segment to `index_out`."""
    index = (index_dirs, index_out)
    return _deduplicate(DedupRun.start(cleaned_dir, report_out, settings, workers, log, partitions, index))


def _deduplicate(run: DedupRun) -> DedupResult:
    """The steps over the run's input, after the index segments' chunks when it has an index."""
    chunks, sketches = _signatures(run)
    exact_files, exact = _exact_groups(run, chunks)
    buckets, first_docs = _buckets(run, chunks, exact_files)
    verified_files, verified = _verify(run, chunks, buckets, first_docs)
    clusters = _clusters(run, chunks, exact_files, verified_files)
    clusters_written, shown, index_summary = _write_outputs(run, chunks, clusters)
    summary = _summary(run, chunks, sketches, exact, buckets, verified, index_summary, len(clusters.candidates))
    summary.quality = _quality(run, chunks, buckets, verified_files, summary.verified_pairs)
    return _report(run, summary, clusters, shown, clusters_written)


def _quality(
    run: DedupRun, chunks: list[Chunk], buckets: list[BucketResult], verified_files: tuple[Path, ...], verified: int
) -> dict:
    """Step 7a, in this process: the recall and precision estimates on the run's own data (quality.py)."""
    task = QualityTask(
        out_dir=run.out_dir,
        chunks=tuple(chunks),
        lsh_files=tuple(c.step_file(run.out_dir, LSH_DIR, "") for c in chunks),
        firsts=tuple(c.first for c in chunks),
        oversized=np.concatenate([r.oversized for r in buckets]) if buckets else np.empty((0, 3), np.uint64),
        verified_files=verified_files,
        verified_pairs=verified,
        settings=run.settings,
        bands=run.bands,
        rows=run.rows,
        probe_from=run.indexed_docs,
    )
    with run.timed("quality"):
        return estimate_quality(task)


def _documents(chunks: list[Chunk]) -> int:
    """Documents in the chunks (the index's and the input's: every global index)."""
    return sum(c.records for c in chunks)


def _signatures(run: DedupRun) -> tuple[list[Chunk], list]:
    """Step 1, per chunk of the input: keys, digests, signatures and band hashes. Returns the index's chunks and
    the input's, numbered after them, with the input's ChunkSketch per chunk."""
    planned = plan_chunks(run.in_dir, run.settings.chunk_bytes)
    tasks = [
        SketchTask(chunk=c, out_dir=run.out_dir, settings=run.settings, bands=run.bands, rows=run.rows) for c in planned
    ]
    sketches = run.step("signatures", sketch_chunk, tasks)
    counts = np.cumsum([sk.records for sk in sketches], dtype=np.int64)
    firsts = (run.indexed_docs + np.concatenate(([0], counts))).tolist()
    numbered = [replace(c, first=f, records=sk.records) for c, f, sk in zip(planned, firsts, sketches)]
    return run.indexed + numbered, sketches


def _exact_groups(run: DedupRun, chunks: list[Chunk]) -> tuple[tuple[Path, ...], list[ExactResult]]:
    """Step 2, per digest range: the members of the exact groups, a file per range."""
    ranges = hash_ranges(max(1, math.ceil(_documents(chunks) / run.partitions.exact_docs)))
    files = tuple(folder(run.out_dir, EXACT_DIR) / f"p{k:04d}.npy" for k in range(len(ranges)))
    key_files = tuple(c.step_file(run.out_dir, KEYS_DIR, "") for c in chunks)
    firsts = tuple(c.first for c in chunks)
    tasks = [
        ExactTask(key_files=key_files, firsts=firsts, lo=lo, hi=hi, out=path) for (lo, hi), path in zip(ranges, files)
    ]
    return files, run.step("exact", exact_groups, tasks)


def _buckets(
    run: DedupRun, chunks: list[Chunk], exact_files: tuple[Path, ...]
) -> tuple[list[BucketResult], np.ndarray]:
    """Steps 3-4: the LSH items of one representative per exact group, per chunk of the batch; then the candidate
    pairs of their buckets, per band and hash range. Returns the bucket results and the candidate pairs per
    BIN_DOCS documents of their first document."""
    lsh_tasks = [
        LshInputTask(
            out_dir=run.out_dir,
            stem=c.stem,
            first=c.first,
            records=c.records,
            exact_files=exact_files,
            rows=run.rows,
        )
        for c in chunks
        if not c.root
    ]
    batch_items = run.step("buckets", lsh_inputs, lsh_tasks)
    items = segment_items(run.manifests) + sum(batch_items)
    hash_parts = hash_ranges(max(1, math.ceil(items / run.partitions.bucket_items)))
    first_docs = np.zeros(max(1, math.ceil(_documents(chunks) / BIN_DOCS)), dtype=np.int64)
    lsh_files, firsts = tuple(c.step_file(run.out_dir, LSH_DIR, "") for c in chunks), tuple(c.first for c in chunks)
    tasks = [
        BucketTask(
            out_dir=run.out_dir,
            lsh_files=lsh_files,
            firsts=firsts,
            band=band,
            part=part,
            lo=lo,
            hi=hi,
            max_bucket=run.settings.max_bucket,
            neighbours=run.settings.bucket_neighbours,
            hubs=run.settings.bucket_hubs,
            bins=len(first_docs),
            rows=run.rows,
            probe_from=run.indexed_docs,
        )
        for band in range(run.bands)
        for part, (lo, hi) in enumerate(hash_parts)
    ]
    # a pool is slow to start (docs/profile.md, 'What changed in this round')
    pool = run.workers if items * run.bands >= POOL_MIN_ITEMS else 1
    return run.step("buckets", bucket_pairs, tasks, pool, partial(_add_histogram, first_docs)), first_docs


def _add_histogram(total: np.ndarray, r: BucketResult) -> BucketResult:
    """Adds a bucket task's histogram to `total` as it arrives (tasks and bins grow with the corpus)."""
    assert r.first_doc_histogram is not None  # bucket_pairs sets it; only this fold clears it
    np.add(total, r.first_doc_histogram, out=total)
    return replace(r, first_doc_histogram=None)


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


def _verify(
    run: DedupRun, chunks: list[Chunk], buckets: list[BucketResult], first_docs: np.ndarray
) -> tuple[tuple[Path, ...], list[VerifyResult]]:
    """Step 5, per range of first documents: the exact Jaccard of the candidates, the verified pairs a file per
    range."""
    ranges = _verify_ranges(first_docs, BIN_DOCS, _documents(chunks), run.partitions.verify_pairs)
    candidate_files = tuple(f for r in buckets for f in r.files)
    files = tuple(folder(run.out_dir, VERIFIED_DIR) / f"v{k:04d}.npy" for k in range(len(ranges)))
    tasks = [
        VerifyTask(
            out_dir=run.out_dir,
            chunks=tuple(chunks),
            candidate_files=candidate_files,
            lo=lo,
            hi=hi,
            settings=run.settings,
            out=path,
        )
        for (lo, hi), path in zip(ranges, files)
    ]
    return files, run.step("verification", verify_range, tasks)


def _clusters(
    run: DedupRun, chunks: list[Chunk], exact_files: tuple[Path, ...], verified_files: tuple[Path, ...]
) -> ClusterCounts:
    """Step 6, per part of whole components: clusters and keep decisions (cluster_parts.py)."""
    with run.timed("clusters"):
        s = run.settings
        tasks = plan_parts(run.out_dir, chunks, exact_files, verified_files, s, run.partitions.cluster_docs)
    return ClusterCounts.total(run.step("clusters", cluster_part, tasks))


def write_output(write: Callable[[], T]) -> T:
    """A task of the outputs step (a bound call)."""
    return write()


def _write_outputs(run: DedupRun, chunks: list[Chunk], clusters: ClusterCounts) -> tuple[int, list[dict], dict | None]:
    """In one task list: clusters.jsonl merged from the parts (the longest task, first), the sample clusters the
    report shows from the parts holding them, and per chunk of the batch its decisions and, with an index, its rows
    of the batch's segment. Returns the clusters written, the samples and the index's summary (None without an
    index)."""
    segment_out = run.segment_out
    staged = staging_folder(segment_out) if segment_out else None
    parts = len(clusters.candidates)  # one per part
    keys = tuple(choose_samples(clusters, run.settings.sample_clusters))
    folder(run.out_dir, DECISION_DIR)
    try:
        finish = [
            ChunkTask(chunk=ch, out_dir=run.out_dir, parts=parts, segment=staged, rows=run.rows)
            for ch in chunks
            if not ch.root
        ]
        show = (
            [SampleTask(out_dir=run.out_dir, chunks=tuple(chunks), part=p, keys=keys) for p in range(parts)]
            if keys
            else []
        )
        writes = [
            partial(merge_clusters, run.out_dir, parts),
            *(partial(show_samples, t) for t in show),
            *(partial(finish_chunk, t) for t in finish),
        ]
        clusters_written, *results = run.step("outputs", write_output, writes)
        shown_by_key = {k: v for r in results[: len(show)] for k, v in r.items()}
        segment_parts = results[len(show) :]
        added = publish_segment(staged, segment_out, run.sketch, segment_parts) if staged and segment_out else None
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
    shown = [shown_by_key[k] for k in keys]
    if added is None:
        return clusters_written, shown, None
    index_summary = {
        "segments": [Path(p).name for p in run.index_dirs],  # names (the batch keys): paths differ between roots
        "records": run.indexed_docs,
        "kept": sum(m["kept"] for m in run.manifests),
        **added,
    }
    return clusters_written, shown, index_summary


def _summary(
    run: DedupRun,
    chunks: list[Chunk],
    sketches: list,
    exact: list[ExactResult],
    buckets: list[BucketResult],
    verified: list[VerifyResult],
    index_summary: dict | None,
    cluster_parts: int,
) -> RunSummary:
    """The counts the steps returned, for the report (a result per task of each step)."""
    return RunSummary(
        settings=run.settings,
        bands=run.bands,
        rows=run.rows,
        chunks=chunks,
        sketches=sketches,
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
            "digest_ranges": len(exact),
            "band_hash_ranges": len(buckets) // run.bands,  # a bucket task per band and hash range
            "verify_ranges": len(verified),
            "cluster_parts": cluster_parts,
        },
        started=run.started,
        timings=run.timings,
        index=index_summary,
    )


def _report(
    run: DedupRun, summary: RunSummary, clusters: ClusterCounts, shown: list[dict], clusters_written: int
) -> DedupResult:
    """Step 7: report.json and the result; the step files only the steps read are removed (STEP_DIRS). Returns the
    result."""
    result = write_report(run.out_dir, summary, clusters, shown, clusters_written)
    for name in STEP_DIRS:
        shutil.rmtree(run.out_dir / name, ignore_errors=True)
    return result
