"""Step 6, over pairs: exact groups joined by verified pairs -> clusters and keep decisions, for one part.

Only the documents that are in some exact group of two or more or in some verified pair take part (their fields
are read by index from the per-chunk document tables), never the whole corpus, and a task holds only some whole
components of them (a part, cut by cluster_parts.py). Union-find over the groups gives the components.
- clusters="components" (the default, _whole_components): each component keeps its most preferred record and every
  other group of it joins that one, chains included (A ~ B ~ C with A and C below the threshold removes B and C),
  its similarity to the record it names measured exactly.
- clusters="star": in keep-rule order, a group joins the most preferred kept record it has a verified pair with,
  else it is kept itself (so every removed record is within the threshold of the record it names; chains are cut,
  not merged). Then a second look (_look_again): where a component keeps several records, they are compared exactly
  with each other and join at the threshold. LSH buckets above max_bucket pair each member with a few neighbours
  only, so without it a page copied a thousand times kept hundreds of its copies.
Writes the part's decisions per chunk and its lines of clusters.jsonl.

keep="first_seen" is the star walk in input order (whatever `clusters` says), with one difference from "first": a
record with the key of an earlier record is an exact duplicate of that record (the first with the key) even when
that one was itself removed as a near duplicate; "first" names the kept record of the cluster for every member. So
first_seen removes a record iff an earlier record has its key, or it verifies against an earlier kept record (its
candidates come from the LSH buckets), which is what dedup_batch computes batch after batch (stage.py).

With an index (dedup_batch), the documents below `base_docs` are the earlier batches' records: they come first in
every keep rule's order, so they are never removed and a record of the batch duplicating one of them names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import JsonlWriter
from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.layout import (
    LEVEL_NAMES,
    LOC_KIND,
    Chunk,
    Corpus,
    DocumentTable,
)
from tokenmill.stages.dedup.settings import DedupSettings
from tokenmill.stages.dedup.verify import ExactJaccard

# centers of its component a group of the second look is compared with at most (the most preferred first)
SECOND_LOOK_CENTERS = 32


@dataclass(frozen=True, kw_only=True)
class ClusterTask:
    """The documents of some whole components (a part, see cluster_parts.py): everything a cluster or keep
    decision among them depends on."""

    out_dir: Path
    chunks: tuple[Chunk, ...]
    part: int
    doc: np.ndarray  # global indices, ascending
    rep: np.ndarray  # each document's exact group, named by its first member (global index)
    group_number: np.ndarray  # each document's group's number over the whole input (by first member)
    pairs: np.ndarray  # (pairs, 2) the verified pairs, as indices into `doc`, in the verified files' order
    sims: np.ndarray  # each pair's similarity
    settings: DedupSettings  # keep (the rule), sample_clusters (their candidates are chosen per part), threshold


@dataclass(frozen=True, kw_only=True)
class Clusters:
    """The clustering of the involved documents, indexed locally (0..n-1 in input order); `doc` maps a local index
    to the global one. `group` is the exact group (numbered by first member), `star` the cluster's center group."""

    doc: np.ndarray
    docs: DocumentTable
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
    second_look_pairs: int  # exact comparisons of the second look (_look_again)
    second_look_joins: int  # of them at the threshold: records removed that the first walk kept or named elsewhere
    chained_removals: int  # near removals below the threshold to the record they name (clusters="components")
    group_best: np.ndarray  # the most preferred record of each document's exact group (local index)
    keep: str  # the keep rule
    rank: np.ndarray  # each document's rank under the keep rule (0 = most preferred)
    component: np.ndarray  # each document's component (union-find root: a group)
    component_size: np.ndarray  # per group that is a component's root: the component's documents
    group_ordinal: np.ndarray  # per group: its global number (the component's number, for a root)
    reps: np.ndarray  # per group: its first member's global index (reps[star]: a cluster's name across parts)


# quality ties of richest_meta and longest, fewer first (signatures.text_quality), with the reason each gives
QUALITY = (
    ("garbage", "fewer replacement/garbage characters"),
    ("bad_case", "proper casing"),
    ("repeats", "fewer repeated words"),
)
SOURCE_ORDER = (("path", "earlier in source"), ("loc", "earlier in source"), ("id_rank", "smaller id"))


def keep_criteria(docs: DocumentTable, rule: str) -> list[tuple[np.ndarray, str]]:
    """The keep rule's order as (key, reason) pairs, most significant first, smaller preferred: indexed records
    (earlier batches) first, then the rule's own criterion, quality ties (richest_meta, longest), source order."""
    indexed = [(~docs.indexed, "kept by an earlier batch")]
    if rule in ("first", "first_seen"):
        return [*indexed, (np.arange(len(docs.meta_count)), "earlier in input")]
    main = (-docs.meta_count, "richer metadata") if rule == "richest_meta" else (-docs.text_len, "longer text")
    quality = [(getattr(docs, k), reason) for k, reason in QUALITY]
    id_rank = np.argsort(np.argsort(docs.ids, kind="stable"), kind="stable")
    source = [(id_rank if k == "id_rank" else getattr(docs, k), reason) for k, reason in SOURCE_ORDER]
    return [*indexed, main, *quality, *source]


def _preference(docs: DocumentTable, rule: str) -> np.ndarray:
    """Rank of every document under the keep rule (0 = most preferred); ties are impossible (ids are unique, and
    the input position breaks any remaining tie)."""
    keys = [k for k, _ in keep_criteria(docs, rule)]
    idx = np.arange(len(docs.meta_count))
    rank = np.empty(len(idx), dtype=np.int64)
    rank[np.lexsort((idx, *keys[::-1]))] = idx
    return rank


def keep_reason(criteria: list[tuple[np.ndarray, str]], kept: int, runner_up: int) -> str:
    """Why the keep rule put `kept` before `runner_up`: the first criterion they differ on."""
    return next((reason for key, reason in criteria if key[kept] != key[runner_up]), "earlier in input")


def best_of_groups(group: np.ndarray, n_groups: int, rank: np.ndarray) -> np.ndarray:
    """The most preferred (lowest `rank`) member of each group: of each exact group's documents, or of each
    component's groups."""
    best = np.full(n_groups, -1, dtype=np.int64)
    by_rank = np.argsort(rank, kind="stable")
    g_sorted = group[by_rank]
    _, first_pos = np.unique(g_sorted, return_index=True)
    best[g_sorted[first_pos]] = by_rank[first_pos]
    return best


@dataclass(frozen=True, kw_only=True)
class _Part:
    """What the walks over a part's exact groups read (_assign, _look_again, _whole_components)."""

    task: ClusterTask
    corpus: Corpus  # the part's documents' fields and keys (ExactJaccard)
    indexed: np.ndarray  # per document: an earlier batch's record (dedup_batch), which stays kept
    rank: np.ndarray  # per document: its rank under the keep rule (0 = most preferred)
    group: np.ndarray  # per document: its exact group (0..groups-1, by first member)
    component_of_group: np.ndarray  # per group: its component (union-find root: a group)
    verified: Verified  # the part's verified pairs (the second look returns them with those it adds)


def _assign(part: _Part):
    """Greedy star clustering over the verified group pairs, in keep-rule order.

    Every exact group is represented by its most preferred record. Groups are visited from the most
    preferred: a group with a verified edge to an already chosen center joins the most preferred such center
    (its records are removed as near duplicates of the center's record, with that edge's measured
    similarity); otherwise it becomes a center (its best record is kept, the rest of the group are exact
    duplicates of it). So every removed record is within the threshold of the record it names, and no two
    kept records share a verified edge; in a chain A~B~C where A and C are below the threshold, A and C
    both survive. Returns (center group per group, similarity to the center per group, best doc per group).
    """
    n_groups, rank = len(part.component_of_group), part.rank
    edges, edge_sims = part.verified.group_pairs, part.verified.sims
    best = best_of_groups(part.group, n_groups, rank)
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


def _source(docs: DocumentTable, d: int) -> dict:
    src: dict[str, str | int] = {"path": docs.paths[int(docs.path[d])]}
    kind = LOC_KIND[int(docs.loc_kind[d])]
    if kind:
        src[kind] = int(docs.loc[d])
    return src


def _id(docs: DocumentTable, d: int) -> str:
    return docs.ids[d].decode("utf-8")


def kept_role(docs: DocumentTable, d: int) -> str:
    """A cluster's surviving record: "kept", or "indexed" when an earlier batch kept it (dedup_batch)."""
    return "indexed" if docs.indexed[d] else "kept"


def removal_levels(c: Clusters) -> dict[int, tuple[int, float]]:
    """{removed document: (level, similarity)}."""
    return dict(zip(c.removed.tolist(), zip(c.level.tolist(), c.similarity.tolist())))


def write_cluster_lines(path: Path, c: Clusters) -> np.ndarray:
    """The part's lines of clusters.jsonl, each without its "cluster" number (cluster_parts.merge_clusters numbers
    them): one kept record and the records removed as its duplicates, ordered by the kept record's input position;
    `component` links clusters that union-find joined. A removed member names what it duplicates (`duplicate_of`)
    where that is not the cluster's kept record (first_seen: an exact copy of a near duplicate). Returns each
    line's kept record (global index)."""
    verified_pairs, linked_pairs = _pairs_by_cluster(c)
    criteria = keep_criteria(c.docs, c.keep)
    levels = removal_levels(c)
    kept_docs = []
    with JsonlWriter(path) as w:
        for members in _cluster_members(c):
            kept, star = int(members[0]), int(c.star[members[0]])
            rows = [_kept_member(c.docs, kept)] + [_removed_member(c, d, kept, levels[d]) for d in members[1:].tolist()]
            member_levels = {m.get("level") for m in rows[1:]}
            w.write(
                {
                    "kept": _id(c.docs, kept),
                    "reason": keep_reason(criteria, kept, int(members[1])),
                    "size": len(members),
                    "level": member_levels.pop() if len(member_levels) == 1 else "mixed",
                    "members": rows,
                    "verified_pairs": verified_pairs.get(star, []),
                    "linked_pairs": linked_pairs.get(star, []),
                    "component": int(c.group_ordinal[c.component[kept]]),
                    "component_size": int(c.component_size[c.component[kept]]),
                }
            )
            kept_docs.append(kept)
    return c.doc[np.asarray(kept_docs, dtype=np.int64)]


def _pairs_by_cluster(c: Clusters) -> tuple[dict[int, list], dict[int, list]]:
    """The verified pairs as [id, id, similarity], by star: those within a cluster, and those linking two
    clusters of one component (a chain cut), listed under both."""
    within: dict[int, list] = {}
    linking: dict[int, list] = {}
    for (a, b), s in zip(c.verified.tolist(), c.verified_sims.tolist()):
        pair = [_id(c.docs, a), _id(c.docs, b), round(float(s), 4)]
        if c.star[a] == c.star[b]:
            within.setdefault(int(c.star[a]), []).append(pair)
        else:
            linking.setdefault(int(c.star[a]), []).append(pair)
            linking.setdefault(int(c.star[b]), []).append(pair)
    return within, linking


def _cluster_members(c: Clusters) -> list[np.ndarray]:
    """The members of each cluster of two or more, the kept record first then in keep-rule order; the clusters
    ordered by their kept record's input position."""
    members = np.flatnonzero(np.isin(c.star, c.cluster_roots))
    members = members[np.lexsort((c.rank[members], c.star[members]))]
    clusters = np.split(members, np.flatnonzero(np.diff(c.star[members])) + 1) if len(members) else []
    clusters.sort(key=lambda m: int(m[0]))
    return clusters


def _kept_member(docs: DocumentTable, d: int) -> dict:
    return {"id": _id(docs, d), "role": kept_role(docs, d), "source": _source(docs, d)}


def _removed_member(c: Clusters, d: int, kept: int, removal: tuple[int, float]) -> dict:
    """A removed member's entry in clusters.jsonl: its level and similarity, and the record it duplicates where
    that is not the cluster's kept one."""
    level, similarity = removal
    member = {"id": _id(c.docs, d), "role": "removed", "level": LEVEL_NAMES[level], "similarity": round(similarity, 4)}
    if c.kept_doc[d] != kept:
        member["duplicate_of"] = _id(c.docs, int(c.kept_doc[d]))
    return {**member, "source": _source(c.docs, d)}


def build_clusters(task: ClusterTask) -> Clusters:
    """The clusters and keep decisions of the part's documents (see the module docstring). Every comparison the
    keep rule makes is between two documents of the part, and orders them as over the whole input."""
    corpus = Corpus(task.out_dir, list(task.chunks))
    docs = corpus.rows(task.doc)
    keep = task.settings.keep
    reps, group = np.unique(task.rep, return_inverse=True)
    group = group.ravel().astype(np.int64)
    n_groups = len(reps)
    verified = Verified(pairs=task.pairs, sims=task.sims.astype(np.float64), group_pairs=group[task.pairs])
    component_of_group = components_of(n_groups, verified.group_pairs)
    component = component_of_group[group]
    component_size = np.bincount(component, minlength=n_groups)
    rank = _preference(docs, keep)
    part = _Part(
        task=task,
        corpus=corpus,
        indexed=docs.indexed,
        rank=rank,
        group=group,
        component_of_group=component_of_group,
        verified=verified,
    )
    compared = 0
    if task.settings.cluster_mode() == "components":
        best = best_of_groups(group, n_groups, rank)
        center, center_sim = _whole_components(part, best)
    else:
        center, center_sim, best = _assign(part)
        if keep != "first_seen":  # first_seen: a record verifies against earlier kept records among its candidates
            center, center_sim, best, verified, compared = _look_again(part, (center, center_sim, best))
    star = center[group]  # cluster = center group
    kept_doc, removed, level, similarity = _removals(group, star, best, center_sim, keep)
    star_size = np.bincount(star, minlength=n_groups)
    cluster_roots = np.flatnonzero(star_size >= 2)
    kept_per_component = np.bincount(component_of_group[np.unique(star)], minlength=n_groups)
    group_ordinal = np.empty(n_groups, dtype=np.int64)
    group_ordinal[group] = task.group_number
    return Clusters(
        doc=task.doc,
        docs=docs,
        group=group,
        star=star,
        kept_doc=kept_doc,
        removed=removed,
        level=level,
        similarity=similarity,
        verified=verified.pairs,
        verified_sims=verified.sims,
        cluster_roots=cluster_roots,
        sizes=star_size[cluster_roots],
        components=int((component_size >= 2).sum()),
        components_with_several_kept=int((kept_per_component >= 2).sum()),
        second_look_pairs=compared,
        second_look_joins=len(verified.pairs) - len(task.pairs),
        chained_removals=int((similarity < task.settings.threshold - 1e-12).sum()),
        group_best=best[group],
        keep=keep,
        rank=rank,
        component=component,
        component_size=component_size,
        group_ordinal=group_ordinal,
        reps=reps,
    )


@dataclass(frozen=True, kw_only=True)
class Verified:
    pairs: np.ndarray  # (pairs, 2) documents of the part (local indices)
    sims: np.ndarray
    group_pairs: np.ndarray  # the pairs' exact groups

    def plus(self, pairs: np.ndarray, sims: np.ndarray, group_pairs: np.ndarray) -> Verified:
        return Verified(
            pairs=np.concatenate([self.pairs, pairs]),
            sims=np.concatenate([self.sims, sims]),
            group_pairs=np.concatenate([self.group_pairs, group_pairs]),
        )


def _look_again(part: _Part, walk: tuple[np.ndarray, np.ndarray, np.ndarray]):
    """The walk redone over the components where _assign kept several groups, now also comparing exactly: a group
    with no verified pair to a center is compared (best record to best record) with its component's centers in keep
    order, up to SECOND_LOOK_CENTERS of them, and joins the first at the threshold. So no two kept records of a
    component within those bounds are near duplicates, and a chain (A ~ B ~ C, A and C below the threshold) still
    keeps both ends. A group of an earlier batch (`part.indexed`) is never compared: it stays kept. `walk`:
    _assign's (center, similarity, best). Returns the walk's arrays, the verified pairs with those the comparisons
    added, and the number of comparisons."""
    task, indexed, component, verified = part.task, part.indexed, part.component_of_group, part.verified
    center, center_sim, best = walk  # redone in place: the first walk's arrays are not used again
    is_center = center == np.arange(len(center))
    multi = np.flatnonzero(np.bincount(component[is_center], minlength=len(center)) >= 2)
    if not len(multi):
        return center, center_sim, best, verified, 0
    groups = np.flatnonzero(np.isin(component, multi))
    groups = groups[np.argsort(part.rank[best[groups]], kind="stable")]
    inside = np.isin(component[verified.group_pairs[:, 0]], multi)  # the pairs of the components walked again
    known = {(a, b): s for (a, b), s in zip(verified.group_pairs[inside].tolist(), verified.sims[inside].tolist())}
    known.update({(b, a): s for (a, b), s in list(known.items())})
    jaccard = ExactJaccard(part.corpus, task.doc[best[groups]], task.settings)
    centers: dict[int, list[int]] = {}
    added: list[tuple[int, int, float]] = []
    total = 0
    for g in groups.tolist():
        joined, compared = None, 0
        for h in [] if indexed[best[g]] else centers.setdefault(int(component[g]), []):
            sim = known.get((g, h))
            if sim is None and compared < SECOND_LOOK_CENTERS:
                compared += 1
                sim = jaccard(int(task.doc[best[g]]), int(task.doc[best[h]]))
                if sim >= task.settings.threshold - 1e-12:
                    added.append((g, h, sim))
            if sim is not None and sim >= task.settings.threshold - 1e-12:
                joined = (h, sim)
                break
        total += compared
        if joined is None:
            center[g], center_sim[g] = g, 1.0
            centers.setdefault(int(component[g]), []).append(g)
        else:
            center[g], center_sim[g] = joined
    if added:
        pairs = np.asarray([(g, h) for g, h, _ in added], dtype=np.int64)
        verified = verified.plus(best[pairs], np.asarray([s for _, _, s in added]), pairs)
    return center, center_sim, best, verified, total


def _whole_components(part: _Part, best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """clusters="components": every group joins the most preferred group of its component, but a group of an
    earlier batch (`part.indexed`), which stays kept. The similarity to the record named is its verified pair's
    where the two have one, else measured exactly (below the threshold for a chain). `best`: each group's most
    preferred document; returns (center, similarity) per group."""
    task, component, verified = part.task, part.component_of_group, part.verified
    groups = np.arange(len(component))
    head = best_of_groups(component, len(component), part.rank[best])  # per component (root): its most preferred group
    center = np.where(part.indexed[best], groups, head[component])
    center_sim = np.ones(len(component), dtype=np.float64)
    measured = center == groups
    a, b = verified.group_pairs.T
    for x, y in ((a, b), (b, a)):
        direct = center[x] == y
        center_sim[x[direct]] = verified.sims[direct]
        measured[x[direct]] = True
    chained = np.flatnonzero(~measured)
    if len(chained):
        jaccard = ExactJaccard(part.corpus, task.doc[best[np.concatenate([chained, center[chained]])]], task.settings)
        for g in chained.tolist():
            center_sim[g] = jaccard(int(task.doc[best[g]]), int(task.doc[best[center[g]]]))
    return center, center_sim


def components_of(n_groups: int, group_pairs: np.ndarray) -> np.ndarray:
    """The union-find root of each group over the verified pairs between groups."""
    uf = mh.UnionFind(n_groups)
    uf.union_pairs(group_pairs.tolist())
    return uf.roots()


def _removals(group: np.ndarray, star: np.ndarray, best: np.ndarray, center_sim: np.ndarray, keep: str):
    """(kept_doc, removed, level, similarity): the record each document is kept as or duplicates, the removed
    documents, and each removal's level (0 exact, 1 near) and similarity to the record it names."""
    n_docs = len(group)
    kept_doc = best[star]
    group_best = best[group]
    exact_member = group_best != np.arange(n_docs)
    if keep == "first_seen":  # an exact copy names the first record with its key, kept or not
        kept_doc = np.where(exact_member, group_best, kept_doc)
    removed = np.flatnonzero(kept_doc != np.arange(n_docs))
    exact_level = exact_member if keep == "first_seen" else group == star
    level = np.where(exact_level[removed], 0, 1).astype(np.uint8)
    similarity = np.where(level == 0, 1.0, center_sim[group[removed]])
    return kept_doc, removed, level, similarity


def write_part_decisions(part_dir: Path, chunks: tuple[Chunk, ...], c: Clusters) -> None:
    """<part_dir>/<stem>.npz per chunk with removals: the decisions' arrays (ordinal, id, kept id, level,
    similarity) and `dropped`: the removed records an index segment leaves out (not the best of their exact group,
    so their key is indexed already), the others being indexed as near duplicates (cluster_parts.finish_chunk)."""
    chunk = c.docs.chunk[c.removed]
    dropped = c.group_best[c.removed] != c.removed
    part_dir.mkdir(parents=True, exist_ok=True)
    for ci in np.unique(chunk).tolist():
        here = chunk == ci
        r = c.removed[here]
        np.savez(
            part_dir / f"{chunks[ci].stem}.npz",
            ordinal=c.docs.ordinal[r],
            id=c.docs.ids[r],
            kept_id=c.docs.ids[c.kept_doc[r]],
            level=c.level[here],
            similarity=c.similarity[here].astype(np.float32),
            dropped=dropped[here],
        )
