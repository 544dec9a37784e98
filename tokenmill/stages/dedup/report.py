"""Step 7: report.json: parameters, counts, per-source counts, cluster-size histogram, sample clusters with texts."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_write_json
from tokenmill.common.results import StageResult, run_fact, write_result
from tokenmill.explain import find_line
from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.clusters import (
    Clusters,
    _id,
    _source,
    keep_criteria,
    keep_reason,
    kept_role,
    removal_levels,
)
from tokenmill.stages.dedup.layout import (
    CLUSTERS_FILE,
    DECISION_DIR,
    LEVEL_NAMES,
    REPORT_FILE,
    Chunk,
    DocumentTable,
    chunk_lines,
    parse,
)
from tokenmill.stages.dedup.settings import CHAR_SIZES, WORD_SIZES, DedupSettings
from tokenmill.stages.dedup.verify import FILTER_MISS, min_agreement

_TIES = (
    "then fewer replacement/garbage characters, proper casing (not all one case), fewer repeated words, then earliest "
    "source (path in natural order, line), smallest id"
)
KEEP_ORDER = {
    "richest_meta": "most non-empty meta fields, " + _TIES,
    "longest": "longest text, " + _TIES,
    "first": "earliest in the input (no ties)",
    "first_seen": "greedy in input order: the first record seen is kept (no ties, no quality)",
}  # each cluster's reason (clusters.jsonl, samples) is the first of these its kept record wins on
SAMPLE_MEMBERS = 8  # records shown per sample cluster (the kept one first); clusters.jsonl lists them all


def _texts(chunks: list[Chunk], docs: DocumentTable, wanted: list[int]) -> dict:
    """{local index: text} of the wanted documents, re-read from their chunks; an indexed record's from its own
    batch's cleaned records (the folder next to this batch's named as its index segment; None where absent)."""
    by_chunk: dict[int, dict[int, int]] = {}
    out = dict.fromkeys(wanted)
    batch_dir = next((Path(ch.path).parent for ch in chunks if not ch.root), None)
    for d in wanted:
        chunk = chunks[int(docs.chunk[d])]
        if not chunk.root:
            by_chunk.setdefault(int(docs.chunk[d]), {})[int(docs.ordinal[d])] = d
        elif batch_dir is not None:  # the segment's ordinals count indexed records only: found by id
            record = find_line(batch_dir.parent / Path(chunk.root).name / chunk.name, _id(docs, d))
            out[d] = record.get("text") if record else None
    for c, ordinals in sorted(by_chunk.items()):
        for ordinal, line in chunk_lines(chunks[c]):
            if ordinal in ordinals:
                text = parse(chunks[c], ordinal, line).get("text")
                out[ordinals[ordinal]] = text if isinstance(text, str) else ""
    return out


@dataclass(frozen=True, kw_only=True)
class SampleCandidates:
    """What choose_samples needs of one part to choose the sample clusters as over the whole input; a cluster is
    named by its key (the first member of its center group, a global index: keys order clusters as the stage
    numbers them)."""

    largest: list[tuple[int, int]]  # (-size, key) of the part's few largest clusters
    lowest: list[tuple[float, int, int]]  # (similarity, document, key) of its few lowest near removals
    cross_docs: np.ndarray  # its near removals whose kept record is in another file (global, ascending)
    cross_keys: np.ndarray  # and their clusters
    near_keys: np.ndarray  # its clusters with a near removal (ascending)
    exact_keys: np.ndarray  # its clusters with an exact removal (ascending)


@dataclass(frozen=True, kw_only=True)
class ClusterCounts:
    """What the report needs of the clusters of one part, or of all (`total`): no per-document data but the sample
    candidates' few arrays."""

    removed: int
    exact: int
    near: int
    exact_cross_batch: int  # removed as a duplicate of an indexed record (dedup_batch)
    near_cross_batch: int
    by_source: dict[str, tuple[int, int, int]]  # path: (exact removed, near removed, removed across files)
    sizes: np.ndarray  # members per cluster
    components: int
    components_with_several_kept: int
    second_look_pairs: int
    second_look_joins: int
    chained_removals: int
    candidates: list[SampleCandidates]

    @classmethod
    def of(cls, c: Clusters, k: int) -> ClusterCounts:
        """The counts of one part's clusters, with its sample candidates for k sample clusters."""
        path, names, removed, level = c.docs.path, c.docs.paths, c.removed, c.level
        kept_path = path[c.kept_doc[removed]]
        ex = Counter(names[p] for p in path[removed[level == 0]].tolist())
        ne = Counter(names[p] for p in path[removed[level == 1]].tolist())
        cross = Counter(names[p] for p in path[removed][path[removed] != kept_path].tolist())
        by_batch = c.docs.indexed[c.kept_doc[removed]]
        return cls(
            removed=len(removed),
            exact=int((level == 0).sum()),
            near=int((level == 1).sum()),
            exact_cross_batch=int((by_batch & (level == 0)).sum()),
            near_cross_batch=int((by_batch & (level == 1)).sum()),
            by_source={p: (ex[p], ne[p], cross[p]) for p in sorted(ex.keys() | ne.keys() | cross.keys())},
            sizes=c.sizes,
            components=c.components,
            components_with_several_kept=c.components_with_several_kept,
            second_look_pairs=c.second_look_pairs,
            second_look_joins=c.second_look_joins,
            chained_removals=c.chained_removals,
            candidates=[_sample_candidates(c, k)],
        )

    @classmethod
    def total(cls, parts: list[ClusterCounts]) -> ClusterCounts:
        by_source: dict[str, tuple[int, int, int]] = {}
        for part in parts:
            for p, n in part.by_source.items():
                by_source[p] = tuple(a + b for a, b in zip(by_source.get(p, (0, 0, 0)), n))  # type: ignore[assignment]
        return cls(
            removed=sum(p.removed for p in parts),
            exact=sum(p.exact for p in parts),
            near=sum(p.near for p in parts),
            exact_cross_batch=sum(p.exact_cross_batch for p in parts),
            near_cross_batch=sum(p.near_cross_batch for p in parts),
            by_source=by_source,
            sizes=np.concatenate([p.sizes for p in parts]) if parts else np.empty(0, dtype=np.int64),
            components=sum(p.components for p in parts),
            components_with_several_kept=sum(p.components_with_several_kept for p in parts),
            second_look_pairs=sum(p.second_look_pairs for p in parts),
            second_look_joins=sum(p.second_look_joins for p in parts),
            chained_removals=sum(p.chained_removals for p in parts),
            candidates=[cand for p in parts for cand in p.candidates],
        )


def per_source(c: ClusterCounts, records_per_path: Counter) -> list[dict]:
    """Per source path (natural order): records in, kept, exact and near removed, removed across files."""
    rows = []
    for p, n in sorted(records_per_path.items(), key=lambda kv: (mh.natural_key(kv[0]), kv[0])):
        ex, ne, cross = c.by_source.get(p, (0, 0, 0))
        kept = n - ex - ne
        rows.append(
            {"path": p, "records_in": n, "kept": kept, "exact_removed": ex, "near_removed": ne, "cross_file": cross}
        )
    return rows


def _sample_candidates(c: Clusters, k: int) -> SampleCandidates:
    """The part's candidates for each pick choose_samples makes: the few largest clusters and lowest near
    removals, and every cluster a spread over the input could pick."""
    few = max(1, k // 4)
    key = c.reps[c.star]  # each document's cluster
    near_removed = c.removed[c.level == 1]
    by_size = np.lexsort((c.reps[c.cluster_roots], -c.sizes))[:few]
    by_sim = np.lexsort((c.doc[near_removed], c.similarity[c.level == 1]))[:few]
    cross = near_removed[c.docs.path[near_removed] != c.docs.path[c.kept_doc[near_removed]]]
    return SampleCandidates(
        largest=list(zip((-c.sizes[by_size]).tolist(), c.reps[c.cluster_roots[by_size]].tolist())),
        lowest=list(
            zip(
                c.similarity[c.level == 1][by_sim].tolist(),
                c.doc[near_removed[by_sim]].tolist(),
                key[near_removed[by_sim]].tolist(),
            )
        ),
        cross_docs=c.doc[cross],
        cross_keys=key[cross],
        near_keys=np.unique(key[near_removed]),
        exact_keys=np.unique(key[c.removed[c.level == 0]]),
    )


def choose_samples(c: ClusterCounts, k: int) -> list[int]:
    """The keys of at most k sample clusters, in the order they are shown: the largest, the lowest similarity
    (borderline), cross-file ones, and near and exact ones spread over the input (deterministic: the same over any
    parts)."""
    if len(c.sizes) == 0 or k <= 0:
        return []
    few = max(1, k // 4)
    chosen: list[int] = []

    def add(keys):
        for r in keys:
            r = int(r)
            if r not in chosen and len(chosen) < k:
                chosen.append(r)

    cands = c.candidates
    add([key for _, key in sorted(x for p in cands for x in p.largest)[:few]])
    if c.near:
        add([key for _, _, key in sorted(x for p in cands for x in p.lowest)[:few]])
        cross_docs = np.concatenate([p.cross_docs for p in cands])
        cross = np.concatenate([p.cross_keys for p in cands])[np.argsort(cross_docs, kind="stable")]
        add(cross[:: max(1, len(cross) // few)][:few])
        spread = np.unique(np.concatenate([p.near_keys for p in cands]))
        add(spread[:: max(1, len(spread) // few)])
    exact_keys = np.unique(np.concatenate([p.exact_keys for p in cands]))
    add(exact_keys[:: max(1, len(exact_keys) // max(1, k))])
    return chosen


def sample_clusters(chunks: list[Chunk], c: Clusters, keys: list[int]) -> dict[int, dict]:
    """{key: sample} of the chosen clusters this part holds, with their texts."""
    key_of_root = dict(zip(c.reps[c.cluster_roots].tolist(), c.cluster_roots.tolist()))
    roots = [key_of_root[key] for key in keys if key in key_of_root]
    if not roots:
        return {}
    in_sample = np.flatnonzero(np.isin(c.star, roots))
    levels = removal_levels(c)
    criteria = keep_criteria(c.docs, c.keep)
    shown = {r: _shown_members(c, in_sample[c.star[in_sample] == r], levels, criteria) for r in roots}
    texts = _texts(chunks, c.docs, [d for _, ds, _ in shown.values() for d in ds])
    out = {}
    for r in roots:
        size, (kept, *others), reason = shown[r]
        rows = [_sample_kept(c.docs, kept, texts[kept])]
        rows += [_sample_removed(c.docs, d, levels[d], texts[d]) for d in others]
        out[int(c.reps[r])] = {
            "size": size,
            "kept": rows[0]["id"],
            "reason": reason,
            "members_shown": len(rows),
            "members": rows,
        }
    return out


def _shown_members(c: Clusters, members: np.ndarray, levels: dict, criteria: list) -> tuple[int, list[int], str]:
    """(size, shown, reason) of a sample cluster: the kept record and up to SAMPLE_MEMBERS - 1 removed ones, lowest
    similarity first, and why the keep rule kept that one."""
    kept = int(c.kept_doc[members[0]])
    others = members[members != kept]
    shown = sorted(others.tolist(), key=lambda d: (levels[d][1], d))[: SAMPLE_MEMBERS - 1]
    runner_up = int(others[np.argmin(c.rank[others])])
    return len(members), [kept] + shown, keep_reason(criteria, kept, runner_up)


def _sample_kept(docs: DocumentTable, d: int, text: str | None) -> dict:
    return {
        "id": _id(docs, d),
        "role": kept_role(docs, d),
        "level": "",
        "similarity": 1.0,
        "source": _source(docs, d),
        "text": text,
    }


def _sample_removed(docs: DocumentTable, d: int, removal: tuple[int, float], text: str | None) -> dict:
    level, similarity = removal
    return {
        "id": _id(docs, d),
        "role": "removed",
        "level": LEVEL_NAMES[level],
        "similarity": round(float(similarity), 4),
        "source": _source(docs, d),
        "text": text,
    }


def histogram(sizes: np.ndarray) -> list[dict]:
    bins = [(2, 2), (3, 3), (4, 4), (5, 5), (6, 10), (11, 100), (101, None)]
    out = []
    for lo, hi in bins:
        m = (sizes >= lo) if hi is None else ((sizes >= lo) & (sizes <= hi))
        label = f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi else f">{lo - 1}")
        out.append({"size": label, "clusters": int(m.sum()), "records": int(sizes[m].sum())})
    return out


@dataclass(kw_only=True)
class RunSummary:
    """Counts the steps returned (no per-document data), for the report."""

    settings: DedupSettings
    bands: int
    rows: int
    chunks: list[Chunk]  # the index's chunks (dedup_batch), then the input's
    sketches: list  # ChunkSketch per input chunk
    exact_groups: int
    candidate_pairs: int
    signature_rejected: int
    verified_pairs: int
    bucket_stats: dict  # band_collisions, oversized_buckets, pairs_not_emitted
    partitions: dict  # tasks per partitioned step
    started: float  # time.perf_counter() when the stage started
    timings: dict = field(default_factory=dict)
    index: dict | None = None  # dedup_batch: the index read and the segment written (counts), see stage.py
    quality: dict = field(default_factory=dict)  # quality.estimate_quality: recall and precision estimates


def _incremental(run: RunSummary, index: dict, c: ClusterCounts, n_exact: int, n_near: int) -> tuple[dict, dict]:
    """(report section, stats) of a batch deduplicated against the index: removals split into cross-batch (the
    record duplicates an indexed one) and within-batch, with the keep rule's difference from a one-shot build."""
    exact_cross, near_cross = c.exact_cross_batch, c.near_cross_batch
    counts = {
        "dropped_exact_cross_batch": exact_cross,
        "dropped_near_cross_batch": near_cross,
        "dropped_exact_within_batch": n_exact - exact_cross,
        "dropped_near_within_batch": n_near - near_cross,
        "index_segments": len(index["segments"]),
        **{f"index_{k}": v for k, v in index.items() if k != "segments"},
    }
    keep_rule = (
        "first_seen: the greedy walk of a one-shot build with keep=first_seen, continued from the index, so the "
        "batches together keep exactly what one build over all of them keeps"
        if run.settings.keep == "first_seen"
        else f"{run.settings.keep} within the batch, among the records no indexed record removes; a one-shot "
        f"build applies it to each cluster over all batches (an earlier batch's record can lose to a later one "
        f"there, never here)"
    )
    section = {
        "segments": index["segments"],
        "keep_rule": keep_rule,
        "cross_batch": "a record with the key of an indexed record is its exact duplicate; else one verifying at "
        "or above the threshold against an indexed kept record (same LSH bands) is a near duplicate of the "
        "earliest such; indexed records are never removed (first seen wins across batches)",
        "counts": counts,
    }
    return section, counts


def _hashfunc(s: DedupSettings) -> str:
    """The datasketch hashfunc the signatures were computed with."""
    return (
        "tokenmill.stages.dedup.minhash.shingle_hash32"
        if s.shingle_hash == "poly"
        else "datasketch.hashfunc.sha1_hash32"
    )


def _ngram_rule(s: DedupSettings) -> str:
    unit = (
        "words for texts mostly in space-separated scripts, characters for CJK, Thai, Lao, Khmer, Myanmar, Tibetan"
        if s.shingles == "by_script"
        else "characters"
    )
    if s.ngram > 0:
        return f"{s.ngram}-grams of {unit}"
    return (
        f"shingles of {unit}; characters by key length: {CHAR_SIZES[0]}-grams below {s.ngram_bounds[0]} "
        f"chars, {CHAR_SIZES[1]}-grams below {s.ngram_bounds[1]}, else {CHAR_SIZES[2]}-grams"
        + (
            f"; words by word count: {WORD_SIZES[0]}-grams below {s.word_ngram_bounds[0]} words, {WORD_SIZES[1]}-"
            f"grams below {s.word_ngram_bounds[1]}, else {WORD_SIZES[2]}-grams"
            if s.shingles == "by_script"
            else ""
        )
        + "; documents within the threshold's length ratio of a bound are sketched at both sizes; a pair is "
        "compared at its longer key's size (never across units)"
    )


def _parameters(s: DedupSettings, bands: int, rows: int, shingle_sizes: dict) -> dict:
    catch = {
        f"{x:g}": round(mh.catch_probability(x, bands, rows), 4)
        for x in sorted({0.5, 0.7, 0.8, 0.85, 0.9, s.threshold})
    }
    hashfunc = _hashfunc(s) + ("" if s.shingle_hash == "poly" else " (bytes)")
    return {
        "threshold": s.threshold,
        "num_perm": s.num_perm,
        "seed": s.seed,
        "bands": bands,
        "rows": rows,
        "bands_chosen": s.bands == 0,
        "ngram": s.ngram,
        "ngram_bounds": list(s.ngram_bounds),
        "ngram_rule": _ngram_rule(s),
        "shingle_sizes": {mh.shingle_label(code): n for code, n in sorted(shingle_sizes.items())},
        "catch_probability": catch,
        "signature_filter": {
            "min_agreement": min_agreement(s.threshold, s.num_perm),
            "of": s.num_perm,
            "miss_probability_at_threshold": FILTER_MISS,
        },
        "bucket_limit": f"buckets above {s.max_bucket} members pair each member with its next "
        f"{s.bucket_neighbours} in signature order and with its {s.bucket_hubs} hubs",
        "shingle_hash": s.shingle_hash,
        "minhash": f"datasketch affine32 scheme: datasketch.MinHash(num_perm, seed, hashfunc={hashfunc})",
        "key": "NFKC, casefold, remove punctuation/separators/controls"
        + (" /symbols" if s.strip_symbols else "")
        + (", traditional->simplified" if s.fold_chinese else "")
        + "; SHA-256",
        "keep": s.keep,
        "clusters": s.cluster_mode(),
        "keep_order": KEEP_ORDER[s.keep],
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.model_dump().items()},
    }


def _counts(run: RunSummary, c: ClusterCounts, sources: list[dict]) -> dict:
    """The report's counts: records in, kept and removed, and what each step found."""
    n_docs = sum(sk.records for sk in run.sketches)
    return {
        "records_in": n_docs,
        "records_kept": n_docs - c.removed,
        "records_removed": c.removed,
        "exact_duplicates_removed": c.exact,
        "near_duplicates_removed": c.near,
        "exact_groups": run.exact_groups,
        "lsh_items": int(sum(sk.items for sk in run.sketches)),
        "candidate_pairs": run.candidate_pairs,
        "verified_pairs": run.verified_pairs,
        "rejected_candidates": run.candidate_pairs - run.verified_pairs,
        "signature_rejected": run.signature_rejected,
        **run.bucket_stats,
        "clusters": len(c.sizes),
        "largest_cluster": int(c.sizes.max()) if len(c.sizes) else 0,
        "components": c.components,
        "components_with_several_kept": c.components_with_several_kept,
        "second_look_pairs": c.second_look_pairs,
        "second_look_joins": c.second_look_joins,
        "chained_removals": c.chained_removals,
        "cross_file_duplicates": int(sum(p["cross_file"] for p in sources)),
        "empty_keys": int(sum(sk.empty_keys for sk in run.sketches)),
    }


def _input(chunks: list[Chunk]) -> dict:
    """The input shards (name, bytes, records) and chunks, which write_deduped checks and applies the report to."""
    shards: dict[str, dict] = {}
    inputs = [ch for ch in chunks if not ch.root]
    for ch in inputs:
        sh = shards.setdefault(ch.name, {"name": ch.name, "bytes": Path(ch.path).stat().st_size, "records": 0})
        sh["records"] += ch.records
    return {
        "shards": list(shards.values()),
        "chunks": [
            {
                "name": ch.name,
                "chunk": ch.chunk,
                "start": ch.start,
                "end": ch.end,
                "records": ch.records,
                "stem": ch.stem,
            }
            for ch in inputs
        ],
    }


def _files(clusters_written: int) -> dict:
    """The report's files (the step files, signatures/ among them, are removed at the end: stage.STEP_DIRS)."""
    return {"clusters": CLUSTERS_FILE, "decisions": DECISION_DIR, "clusters_written": clusters_written}


@dataclass(frozen=True, kw_only=True)
class DedupResult(StageResult):
    """dedup_report of one batch: records in, kept and removed as exact or near duplicates (`dropped`), what each
    step found (report.json's counts), the LSH bands x rows, and for a batch deduplicated against the index
    (dedup_batch) the removals split into cross- and within-batch with the index's figures."""

    records_removed: int
    exact_duplicates_removed: int
    near_duplicates_removed: int
    exact_groups: int
    lsh_items: int
    candidate_pairs: int
    verified_pairs: int
    rejected_candidates: int
    signature_rejected: int
    band_collisions: int
    oversized_buckets: int
    pairs_not_emitted: int
    clusters: int
    largest_cluster: int
    components: int
    components_with_several_kept: int
    second_look_pairs: int  # kept records of one component compared exactly (clusters._look_again)
    second_look_joins: int  # of them at the threshold
    chained_removals: int  # near removals below the threshold to the record they name (clusters='components')
    cross_file_duplicates: int
    empty_keys: int
    bands: int
    rows: int
    incremental: dict[str, int] | None = None
    # quality.py: near-duplicate recall of pairs estimated on a sample, its interval, the removals' direct precision
    recall_estimate: float = 1.0
    recall_low: float = 0.0
    recall_high: float = 1.0
    direct_precision: float = 1.0
    timings: dict[str, float] = run_fact()  # seconds per step


def write_report(
    out_dir: Path, run: RunSummary, c: ClusterCounts, shown: list[dict], clusters_written: int
) -> DedupResult:
    """Writes report.json (`shown`: the sample clusters) and the result (`write_result`); returns it."""
    t0 = time.perf_counter()
    sources = per_source(c, sum((Counter(sk.records_per_path) for sk in run.sketches), Counter()))
    counts = _counts(run, c, sources)
    shingle_sizes = sum((Counter(sk.shingle_sizes) for sk in run.sketches), Counter())
    run.timings["outputs"] = run.timings.get("outputs", 0.0) + time.perf_counter() - t0
    seconds = time.perf_counter() - run.started
    report = {
        "parameters": _parameters(run.settings, run.bands, run.rows, dict(shingle_sizes)),
        "counts": counts,
        "per_source": sources,
        "cluster_sizes": histogram(c.sizes),
        "samples": shown,
        "input": _input(run.chunks),
        "files": _files(clusters_written),
        "partitions": run.partitions,
        "quality": run.quality,
    }
    incremental: dict = {}
    if run.index is not None:
        report["incremental"], incremental = _incremental(
            run, run.index, c, counts["exact_duplicates_removed"], counts["near_duplicates_removed"]
        )
    atomic_write_json(out_dir / REPORT_FILE, report)
    removed = {
        "exact_duplicate": counts["exact_duplicates_removed"],
        "near_duplicate": counts["near_duplicates_removed"],
    }
    result = DedupResult(
        docs_in=counts["records_in"],
        docs_out=counts["records_kept"],
        dropped=removed,
        **{k: v for k, v in counts.items() if k not in ("records_in", "records_kept")},
        bands=run.bands,
        rows=run.rows,
        incremental=incremental or None,
        recall_estimate=round(run.quality.get("recall", 1.0), 5),
        recall_low=round(run.quality.get("recall_low", 0.0), 5),
        recall_high=round(run.quality.get("recall_high", 1.0), 5),
        direct_precision=round(run.quality.get("direct_precision", 1.0), 5),
        timings={k: round(v, 3) for k, v in run.timings.items()},
        seconds=round(seconds, 3),
    )
    write_result(out_dir, result)
    return result
