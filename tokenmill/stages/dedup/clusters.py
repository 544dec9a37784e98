"""Step 6, over pairs: exact groups joined by verified pairs -> clusters and keep decisions.

Only the documents that are in some exact group of two or more or in some verified pair take part (their fields
are read by index from the per-chunk document tables), never the whole corpus. Union-find over the groups gives
the components; within them, in keep-rule order, a group joins the most preferred kept record it has a verified
pair with, else it is kept itself (so every removed record is within the threshold of the record it names;
chains are cut, not merged). Writes the decisions per chunk (decisions/) and clusters.jsonl.

keep="first_seen" is that walk in input order, with one difference from "first": a record with the key of an earlier
record is an exact duplicate of that record (the first with the key) even when that one was itself removed as a
near duplicate; "first" names the kept record of the cluster for every member. So first_seen removes a record iff
an earlier record has its key, or it verifies against an earlier kept record (its candidates come from the LSH
buckets), which is what dedup_batch computes batch after batch (stage.py).

With an index (dedup_batch), the documents below `base_docs` are the earlier batches' records: they come first in
every keep rule's order, so they are never removed and a record of the batch duplicating one of them names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import JsonlWriter
from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.keys import EXACT_DTYPE
from tokenmill.stages.dedup.layout import (
    CLUSTERS_FILE,
    DECISION_DIR,
    LEVEL_NAMES,
    LOC_KIND,
    VERIFIED_DTYPE,
    Chunk,
    Corpus,
    folder,
)


@dataclass(frozen=True)
class ClusterTask:
    out_dir: Path
    chunks: tuple[Chunk, ...]
    exact_files: tuple[Path, ...]
    verified_files: tuple[Path, ...]
    keep: str
    base_docs: int = 0  # documents below are indexed (earlier batches)


@dataclass
class Clusters:
    """The clustering of the involved documents, indexed locally (0..n-1 in input order); `doc` maps a local index
    to the global one. `group` is the exact group (numbered by first member), `star` the cluster's center group."""

    doc: np.ndarray
    docs: dict
    group: np.ndarray
    star: np.ndarray
    kept_doc: np.ndarray
    removed: np.ndarray
    level: np.ndarray
    similarity: np.ndarray
    verified: np.ndarray
    verified_sims: np.ndarray
    cluster_roots: np.ndarray
    sizes: np.ndarray
    components: int
    components_with_several_kept: int
    group_best: np.ndarray  # the most preferred record of each document's exact group (local index)
    keep: str  # the keep rule


def _load(files, dtype) -> np.ndarray:
    parts = [np.load(f) for f in files]
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


# quality ties of richest_meta and longest, fewer first (signatures.text_quality), with the reason each gives
QUALITY = (
    ("garbage", "fewer replacement/garbage characters"),
    ("bad_case", "proper casing"),
    ("repeats", "fewer repeated words"),
)
SOURCE_ORDER = (("path", "earlier in source"), ("loc", "earlier in source"), ("id_rank", "smaller id"))


def keep_criteria(docs: dict, rule: str) -> list[tuple[np.ndarray, str]]:
    """The keep rule's order as (key, reason) pairs, most significant first, smaller preferred: indexed records
    (earlier batches) first, then the rule's own criterion, quality ties (richest_meta, longest), source order."""
    indexed = [(~docs["indexed"], "kept by an earlier batch")]
    if rule in ("first", "first_seen"):
        return [*indexed, (np.arange(len(docs["meta_count"])), "earlier in input")]
    main = (-docs["meta_count"], "richer metadata") if rule == "richest_meta" else (-docs["text_len"], "longer text")
    quality = [(docs[k], reason) for k, reason in QUALITY]
    id_rank = np.argsort(np.argsort(docs["ids"], kind="stable"), kind="stable")
    source = [(id_rank if k == "id_rank" else docs[k], reason) for k, reason in SOURCE_ORDER]
    return [*indexed, main, *quality, *source]


def _preference(docs: dict, rule: str) -> np.ndarray:
    """Rank of every document under the keep rule (0 = most preferred); ties are impossible (ids are unique, and
    the input position breaks any remaining tie)."""
    keys = [k for k, _ in keep_criteria(docs, rule)]
    idx = np.arange(len(docs["meta_count"]))
    rank = np.empty(len(idx), dtype=np.int64)
    rank[np.lexsort((idx, *keys[::-1]))] = idx
    return rank


def keep_reason(criteria: list[tuple[np.ndarray, str]], kept: int, runner_up: int) -> str:
    """Why the keep rule put `kept` before `runner_up`: the first criterion they differ on."""
    return next((reason for key, reason in criteria if key[kept] != key[runner_up]), "earlier in input")


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
    kind = LOC_KIND[int(docs["loc_kind"][d])]
    if kind:
        src[kind] = int(docs["loc"][d])
    return src


def _id(docs: dict, d: int) -> str:
    return docs["ids"][d].decode("utf-8")


def kept_role(docs: dict, d: int) -> str:
    """A cluster's surviving record: "kept", or "indexed" when an earlier batch kept it (dedup_batch)."""
    return "indexed" if docs["indexed"][d] else "kept"


def _write_clusters(
    out_dir,
    docs,
    star,
    comp,
    comp_size,
    removed,
    level,
    similarity,
    verified,
    verified_sims,
    cluster_roots,
    rank,
    kept_doc,
    keep: str,
) -> int:
    """clusters.jsonl: one line per cluster (one kept record and the records removed as its duplicates),
    ordered by the kept record's input position; `component` links clusters that union-find joined. A removed
    member names what it duplicates (`duplicate_of`) where that is not the cluster's kept record (first_seen: an
    exact copy of a near duplicate)."""
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
    criteria = keep_criteria(docs, keep)
    with JsonlWriter(out_dir / CLUSTERS_FILE) as w:
        for i, run in enumerate(runs):
            kept = int(run[0])
            members = [{"id": _id(docs, kept), "role": kept_role(docs, kept), "source": _source(docs, kept)}]
            for d in run[1:].tolist():
                lv, sim = lvl[d]
                member = {"id": _id(docs, d), "role": "removed", "level": LEVEL_NAMES[lv], "similarity": round(sim, 4)}
                if kept_doc[d] != kept:
                    member["duplicate_of"] = _id(docs, int(kept_doc[d]))
                members.append({**member, "source": _source(docs, d)})
            levels = {m.get("level") for m in members[1:]}
            w.write(
                {
                    "cluster": i,
                    "kept": _id(docs, kept),
                    "reason": keep_reason(criteria, kept, int(run[1])),
                    "size": len(run),
                    "level": levels.pop() if len(levels) == 1 else "mixed",
                    "members": members,
                    "verified_pairs": edges.get(int(star[kept]), []),
                    "linked_pairs": links.get(int(star[kept]), []),
                    "component": int(docs["comp_ordinal"][comp[kept]]),
                    "component_size": int(comp_size[comp[kept]]),
                }
            )
        return w.count


def _group_ordinals(reps: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Global number of each group (by first member: the rep's index minus the documents before it that are not
    the first of their group), as the unpartitioned stage numbered them."""
    not_first = np.sort(exact["doc"][exact["doc"] != exact["rep"]])
    return reps - np.searchsorted(not_first, reps)


def build_clusters(task: ClusterTask) -> Clusters:
    exact = np.sort(_load(task.exact_files, EXACT_DTYPE), order="doc")
    ver = _load(task.verified_files, VERIFIED_DTYPE)  # files in range order, each sorted: sorted
    doc = np.union1d(exact["doc"], np.concatenate([ver["a"], ver["b"]]))
    docs, docs["paths"] = Corpus(task.out_dir, list(task.chunks)).rows(doc)
    docs["indexed"] = doc < task.base_docs
    rep = doc.copy()
    rep[np.searchsorted(doc, exact["doc"])] = exact["rep"]
    reps, group = np.unique(rep, return_inverse=True)
    group = group.ravel().astype(np.int64)
    n_docs, n_groups = len(doc), len(reps)
    verified = (
        np.stack([np.searchsorted(doc, ver["a"]), np.searchsorted(doc, ver["b"])], axis=1)
        if len(ver)
        else np.empty((0, 2), dtype=np.int64)
    )
    verified_sims = ver["sim"].astype(np.float64)
    g_edges = (
        np.stack([group[verified[:, 0]], group[verified[:, 1]]], axis=1)
        if len(verified)
        else np.empty((0, 2), dtype=np.int64)
    )
    uf = mh.UnionFind(n_groups)
    uf.union_pairs(g_edges.tolist())
    comp_of_group = uf.roots()
    comp = comp_of_group[group]
    comp_size = np.bincount(comp, minlength=n_groups)
    rank = _preference(docs, task.keep)
    center, center_sim, best = _assign(group, n_groups, rank, g_edges, verified_sims)
    star = center[group]  # cluster = center group
    kept_doc = best[star]
    group_best = best[group]
    exact_member = group_best != np.arange(n_docs)
    if task.keep == "first_seen":  # an exact copy names the first record with its key, kept or not
        kept_doc = np.where(exact_member, group_best, kept_doc)
    removed = np.flatnonzero(kept_doc != np.arange(n_docs))
    exact_level = exact_member if task.keep == "first_seen" else group == star
    level = np.where(exact_level[removed], 0, 1).astype(np.uint8)
    similarity = np.where(level == 0, 1.0, center_sim[group[removed]])
    star_size = np.bincount(star, minlength=n_groups)
    cluster_roots = np.flatnonzero(star_size >= 2)
    kept_per_comp = np.bincount(comp_of_group[np.unique(star)], minlength=n_groups)
    docs["doc"], docs["comp"], docs["comp_size"], docs["rank"] = doc, comp, comp_size, rank
    docs["comp_ordinal"] = _group_ordinals(reps, exact)
    return Clusters(
        doc,
        docs,
        group,
        star,
        kept_doc,
        removed,
        level,
        similarity,
        verified,
        verified_sims,
        cluster_roots,
        star_size[cluster_roots],
        int((comp_size >= 2).sum()),
        int((kept_per_comp >= 2).sum()),
        group_best,
        task.keep,
    )


def write_decisions(out_dir: Path, chunks: list[Chunk], c: Clusters) -> None:
    """decisions/<stem>.npz per chunk with removals: ordinal, id, kept id, level, similarity (by ordinal)."""
    removed = c.removed
    chunk = c.docs["chunk"][removed]
    dec_dir = folder(out_dir, DECISION_DIR)
    for ci in np.unique(chunk).tolist():
        r = removed[chunk == ci]
        np.savez(
            dec_dir / f"{chunks[ci].stem}.npz",
            ordinal=c.docs["ordinal"][r],
            id=c.docs["ids"][r],
            kept_id=c.docs["ids"][c.kept_doc[r]],
            level=c.level[chunk == ci],
            similarity=c.similarity[chunk == ci].astype(np.float32),
        )


def write_clusters(out_dir: Path, c: Clusters) -> int:
    return _write_clusters(
        out_dir,
        c.docs,
        c.star,
        c.docs["comp"],
        c.docs["comp_size"],
        c.removed,
        c.level,
        c.similarity,
        c.verified,
        c.verified_sims,
        c.cluster_roots,
        c.docs["rank"],
        c.kept_doc,
        c.keep,
    )
