"""Step 6, partitioned: clusters by connected components, a task per part, then the outputs gathered.

The run process finds the components (union-find over the exact groups joined by the verified pairs: a few integers
per involved document, no document fields) and cuts them into parts of about `docs_per_part` documents, whole
components each, so every cluster and keep decision is made inside one task (clusters.py). A part's task writes to
the staging folder (CLUSTER_PART_DIR) its lines of clusters.jsonl, its decisions per chunk and its clustering (for
the report's sample clusters; plain arrays, never a pickle: save_clustering), and returns its counts
(report.ClusterCounts). The outputs step then merges the lines into clusters.jsonl, numbered in the order of their
kept records; gathers each chunk's decisions (and, with an index, copies the chunk's rows into the segment); and
shows the sample clusters the report chose, each from the part that holds it. Nothing depends on where the parts are
cut: the output is the same over any `docs_per_part`.
"""

from __future__ import annotations

import heapq
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import JsonlWriter, atomic_file
from tokenmill.stages.dedup.clusters import (
    Clusters,
    ClusterTask,
    build_clusters,
    components_of,
    write_cluster_lines,
    write_part_decisions,
)
from tokenmill.stages.dedup.index import SegmentChunk, SegmentTask, write_segment_chunk
from tokenmill.stages.dedup.keys import EXACT_DTYPE
from tokenmill.stages.dedup.layout import (
    CLUSTER_PART_DIR,
    CLUSTERS_FILE,
    DECISION_DIR,
    VERIFIED_DTYPE,
    Chunk,
    DocumentTable,
    folder,
)
from tokenmill.stages.dedup.report import ClusterCounts, sample_clusters
from tokenmill.stages.dedup.settings import DedupSettings


def _load(files, dtype) -> np.ndarray:
    parts = [np.load(f) for f in files]
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def plan_parts(
    out_dir: Path,
    chunks: list[Chunk],
    exact_files: tuple[Path, ...],
    verified_files: tuple[Path, ...],
    settings: DedupSettings,
    docs_per_part: int,
) -> list[ClusterTask]:
    """The parts of the documents in some exact group of two or more or in some verified pair: whole components,
    about `docs_per_part` documents each, in the order of their smallest group."""
    exact = np.sort(_load(exact_files, EXACT_DTYPE), order="doc")
    ver = _load(verified_files, VERIFIED_DTYPE)  # files in range order, each sorted: sorted
    doc = np.union1d(exact["doc"], np.concatenate([ver["a"], ver["b"]]))
    rep = doc.copy()
    rep[np.searchsorted(doc, exact["doc"])] = exact["rep"]
    reps, group = np.unique(rep, return_inverse=True)
    group = group.ravel()
    pairs = np.stack([np.searchsorted(doc, ver["a"]), np.searchsorted(doc, ver["b"])], axis=1).astype(np.int64)
    component = components_of(len(reps), group[pairs])[group]
    # a group's number over the input: its first member's index less the documents before it that are not first
    not_first = np.sort(exact["doc"][exact["doc"] != exact["rep"]])
    number = (reps - np.searchsorted(not_first, reps))[group]
    # a component's part: where its first document falls when the components are laid out by smallest group
    per_component = np.bincount(component, minlength=len(reps))
    starts = np.cumsum(per_component) - per_component
    part = starts[component] // max(1, docs_per_part)
    part_ids = np.unique(part)
    pair_part = part[pairs[:, 0]]
    local = np.empty(len(doc), dtype=np.int64)
    tasks = []
    for k, p in enumerate(part_ids.tolist()):
        members = np.flatnonzero(part == p)
        local[members] = np.arange(len(members))
        in_part = pair_part == p
        tasks.append(
            ClusterTask(
                out_dir=Path(out_dir),
                chunks=tuple(chunks),
                part=k,
                doc=doc[members],
                rep=rep[members],
                group_number=number[members],
                pairs=local[pairs[in_part]],
                sims=ver["sim"][in_part],
                settings=settings,
            )
        )
    return tasks


def _lines(staged: Path, part: int) -> Path:
    return staged / f"c{part:05d}.jsonl"


def _kept(staged: Path, part: int) -> Path:
    return staged / f"c{part:05d}.kept.npy"


def _decisions(staged: Path, part: int) -> Path:
    return staged / f"d{part:05d}"


def _clustering(staged: Path, part: int) -> Path:
    return staged / f"c{part:05d}.clusters.npz"


# a part's clustering as plain numpy arrays (never a pickle: the staging folder lies in the data root, and a pickle
# anyone can write there runs code in every task that loads it). Each field of Clusters is an array of the file, its
# document table's fields under DOCS_PREFIX; the few others (counts, the keep rule, the source paths) are arrays too.
DOCS_PREFIX = "docs."


def _as_arrays(obj, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for name, hint in typing.get_type_hints(type(obj)).items():
        value = getattr(obj, name)
        if hint is DocumentTable:
            out.update(_as_arrays(value, DOCS_PREFIX))
            continue
        array = np.asarray(value, dtype=str) if hint == list[str] else np.asarray(value)
        if array.dtype.hasobject:  # np.savez(allow_pickle=False) would refuse it too: say which field
            raise TypeError(f"{type(obj).__name__}.{name}: an object array, which only a pickle could hold")
        out[prefix + name] = array
    return out


def _from_arrays(cls, arrays, prefix: str = ""):
    values: dict = {}
    for name, hint in typing.get_type_hints(cls).items():
        if hint is DocumentTable:
            values[name] = _from_arrays(DocumentTable, arrays, DOCS_PREFIX)
            continue
        array = arrays[prefix + name]
        if hint is np.ndarray:
            values[name] = array
        elif hint in (int, str):
            values[name] = hint(array[()])
        elif hint == list[str]:
            values[name] = [str(x) for x in array.tolist()]
        else:
            raise TypeError(f"{cls.__name__}.{name}: no array form for {hint}")
    return cls(**values)


def save_clustering(path: Path, c: Clusters) -> None:
    """The part's clustering as one .npz of plain arrays, renamed into place whole."""
    with atomic_file(path, "wb") as f:
        np.savez(f, allow_pickle=False, **_as_arrays(c))


def load_clustering(path: Path) -> Clusters:
    """save_clustering's file back (allow_pickle=False: an object array is refused, never unpickled)."""
    with np.load(path, allow_pickle=False) as arrays:
        return _from_arrays(Clusters, arrays)


def cluster_part(task: ClusterTask) -> ClusterCounts:
    """One part's clusters and keep decisions: its files in the staging folder, its counts returned."""
    staged = folder(task.out_dir, CLUSTER_PART_DIR)
    c = build_clusters(task)
    np.save(_kept(staged, task.part), write_cluster_lines(_lines(staged, task.part), c))
    write_part_decisions(_decisions(staged, task.part), task.chunks, c)
    save_clustering(_clustering(staged, task.part), c)
    return ClusterCounts.of(c, task.settings.sample_clusters)


def _numbered_lines(staged: Path, part: int) -> Iterator[tuple[int, bytes]]:
    """(kept record, line) of the part's clusters, in the order of their kept records."""
    kept = np.load(_kept(staged, part)).tolist()
    with open(_lines(staged, part), "rb") as f:
        yield from zip(kept, f)


def merge_clusters(out_dir: Path, parts: int) -> int:
    """clusters.jsonl: the parts' lines merged in the order of their kept records, each numbered; returns the
    clusters written."""
    staged = Path(out_dir) / CLUSTER_PART_DIR
    merged = heapq.merge(*(_numbered_lines(staged, p) for p in range(parts)), key=lambda kv: kv[0])
    with JsonlWriter(Path(out_dir) / CLUSTERS_FILE) as w:
        for i, (_, line) in enumerate(merged):
            w.buffer.write(b'{"cluster": %d, ' % i + line[1:])
            w.count += 1
        return w.count


@dataclass(frozen=True, kw_only=True)
class ChunkTask:
    chunk: Chunk  # a chunk of the batch
    out_dir: Path
    parts: int
    segment: Path | None  # the index segment being written (dedup_batch), else None
    rows: int


def finish_chunk(task: ChunkTask) -> SegmentChunk | None:
    """decisions/<stem>.npz from the parts' decisions on the chunk (where it has removals) and, with an index,
    the chunk's rows of the segment: its records but the exact duplicates, those removed as near duplicates
    without LSH data."""
    staged = Path(task.out_dir) / CLUSTER_PART_DIR
    stem = task.chunk.stem
    found = [np.load(f) for p in range(task.parts) if (f := _decisions(staged, p) / f"{stem}.npz").exists()]
    fields = ("ordinal", "id", "kept_id", "level", "similarity", "dropped")
    arrays = {k: np.concatenate([d[k] for d in found]) for k in fields} if found else {}
    if arrays:
        order = np.argsort(arrays["ordinal"], kind="stable")
        arrays = {k: v[order] for k, v in arrays.items()}
        np.savez(
            folder(task.out_dir, DECISION_DIR) / f"{stem}.npz",
            ordinal=arrays["ordinal"],
            id=arrays["id"],
            kept_id=arrays["kept_id"],
            level=arrays["level"],
            similarity=arrays["similarity"],
        )
    if task.segment is None:
        return None
    ordinal = arrays.get("ordinal", np.empty(0, dtype=np.int64))
    dropped = arrays.get("dropped", np.empty(0, dtype=bool))
    return write_segment_chunk(
        SegmentTask(
            chunk=task.chunk,
            out_dir=task.out_dir,
            segment=task.segment,
            dropped=ordinal[dropped],
            near=ordinal[~dropped],
            rows=task.rows,
        )
    )


@dataclass(frozen=True, kw_only=True)
class SampleTask:
    out_dir: Path
    chunks: tuple[Chunk, ...]
    part: int
    keys: tuple[int, ...]  # the chosen sample clusters (report.choose_samples)


def show_samples(task: SampleTask) -> dict[int, dict]:
    """{key: sample} of the chosen clusters the part holds."""
    c = load_clustering(_clustering(Path(task.out_dir) / CLUSTER_PART_DIR, task.part))
    return sample_clusters(list(task.chunks), c, list(task.keys))
