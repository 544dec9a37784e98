"""dedup bands, LSH buckets, verification by exact Jaccard and union-find: recall-first band choice, oversized
buckets, planted false candidates, chains below the threshold."""

from __future__ import annotations

import random

import numpy as np
import pytest
from support import dedup_record, kept_ids, random_poem, substitute, write_records

from tokenmill.common.io import REMOVED_FILE, iter_jsonl, record_id
from tokenmill.stages.dedup import (
    CLUSTERS_FILE,
    DedupSettings,
    build_dedup_report,
    write_deduped,
)
from tokenmill.stages.dedup import minhash as mh


def test_band_choice_favours_recall():
    from datasketch import MinHashLSH

    assert DedupSettings().band_shape() == mh.choose_bands(0.8, 128, 0.999) == (21, 6)
    assert mh.catch_probability(0.8, 21, 6) > 0.998
    assert mh.choose_bands(0.8, 128, 0.97) == (16, 8)
    b, r = mh.choose_bands(0.85, 128, 0.999)
    assert (b, r) == (18, 7) and mh.catch_probability(0.85, b, r) > 0.998
    ds = MinHashLSH(threshold=0.85, num_perm=128)
    assert mh.catch_probability(0.85, ds.b, ds.r) < 0.6  # datasketch's default misses many pairs at 0.85
    assert abs(mh.catch_probability(0.8, 16, 8) - (1 - (1 - 0.8**8) ** 16)) < 1e-12
    assert DedupSettings(bands=20, rows=6).band_shape() == (20, 6)
    with pytest.raises(ValueError):
        DedupSettings(bands=20, rows=7)


def test_bucket_pairs_and_oversized_buckets():
    h = np.array([5, 1, 5, 2, 5, 1, 9], dtype=np.uint64)
    members = np.arange(10, 17)
    pairs, st = mh.bucket_pairs(h, members, max_bucket=10)
    assert sorted(map(tuple, mh.unique_pairs(pairs).tolist())) == [(10, 12), (10, 14), (11, 15), (12, 14)]
    big = np.zeros(50, dtype=np.uint64)
    # an oversized bucket: each member with its next 4 in signature order (4m - 10 pairs, not m^2 / 2)
    order = (np.arange(50, dtype=np.uint64) % 5).reshape(50, 1) << np.uint64(48)
    pairs, st = mh.bucket_pairs(big, np.arange(50), max_bucket=10, neighbours=4, order=order)
    emitted = mh.pairs_per_bucket(np.array([50]), 10, 4)[0]
    assert emitted == 4 * 50 - 10 and st["oversized_buckets"] == 1 and st["pairs_not_emitted"] == 50 * 49 // 2 - emitted
    pairs = set(map(tuple, mh.unique_pairs(pairs).tolist()))
    assert len(pairs) == emitted and max(np.bincount(np.array(list(pairs)).ravel())) <= 2 * 4
    # members agreeing on the order rows sit together: 1, 6, 11, ... are neighbours, 1 and 2 are not
    assert {(1, 6), (1, 11), (1, 16), (1, 21), (1, 45)} <= pairs and (1, 2) not in pairs
    # hubs: the members sharing the most order values with the others. Member 7 alone has the first row's
    # common value and the last row's common value; 0-6 lack the first, the rest the last
    order = np.zeros((50, 1), dtype=np.uint64)
    order[:7, 0] |= np.uint64(1) << np.uint64(48)  # first row: 7 members differ
    order[8:, 0] |= np.arange(1, 43, dtype=np.uint64)  # fourth row: 42 members with values of their own
    assert mh.hub_positions(order[np.lexsort((np.arange(50), order[:, 0]))], 1).tolist() == [0]
    pairs, st = mh.bucket_pairs(big, np.arange(50), max_bucket=10, neighbours=1, order=order, hubs=1)
    pairs = set(map(tuple, mh.unique_pairs(pairs).tolist()))
    assert {(min(7, j), max(7, j)) for j in range(50) if j != 7} <= pairs  # every member with the hub
    assert len(pairs) == len(mh.unique_pairs(np.array(list(pairs)))) <= 49 + 49
    assert st["pairs_not_emitted"] == 50 * 49 // 2 - len(pairs)
    assert len(pairs) <= mh.pairs_per_bucket(np.array([50]), 10, 1, 1)[0]


def test_verification_rejects_planted_false_candidate(tmp_path):
    rng = random.Random(5)
    shared, x, y = random_poem(rng, 20), random_poem(rng, 20), random_poem(rng, 20)
    # Jaccard about 0.3: 32 bands of 1 row make them LSH candidates almost surely, verification must reject
    recs = [dedup_record("v.json", 0, shared + x), dedup_record("v.json", 1, shared + y)]
    write_records(tmp_path / "in", recs)
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(bands=32, rows=1), workers=1)
    assert stats.candidate_pairs == 1 and stats.rejected_candidates == 1 and stats.verified_pairs == 0
    assert stats.docs_out == 2 and stats.records_removed == 0


def test_exact_jaccard_on_packed_shingle_sets():
    rng = random.Random(2)
    alphabet = "abc春江\U00020000\U0010fffd"
    for _ in range(500):
        n = rng.choice([1, 2, 3, 4, 5])
        a, b = ("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(2))
        ref = mh.jaccard(set(mh.shingles(a, n)), set(mh.shingles(b, n)))
        assert abs(mh.jaccard(mh.shingle_set(a, n), mh.shingle_set(b, n)) - ref) < 1e-12


def test_star_clusters_keep_both_ends_of_a_chain_below_the_threshold(tmp_path):
    rng = random.Random(11)
    a = random_poem(rng, 40)
    b = substitute(a, 10)  # J(a, b) = 0.90 (2-grams)
    c = substitute(substitute(b, 25), 32)  # J(b, c) = 0.81, J(a, c) = 0.73 < 0.8
    write_records(tmp_path / "in", [dedup_record("c.json", i, t) for i, t in enumerate((a, b, c))])
    settings = DedupSettings(bands=32, rows=4, clusters="star")
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", settings, workers=1)
    write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    ids = [record_id("c.json", index=i) for i in range(3)]
    assert stats.verified_pairs == 2 and stats.components == 1 and stats.components_with_several_kept == 1
    assert (stats.second_look_pairs, stats.second_look_joins) == (1, 0)  # c against a: below the threshold
    # union-find alone would remove c as a duplicate of a at 0.73; c is kept, b is removed as a's duplicate
    assert kept_ids(tmp_path / "out") == {ids[0], ids[2]}
    (r,) = iter_jsonl(tmp_path / "out" / REMOVED_FILE)
    assert r["id"] == ids[1] and r["duplicate_of"] == ids[0] and r["similarity"] >= 0.8
    (cl,) = iter_jsonl(tmp_path / "rep" / CLUSTERS_FILE)
    assert cl["kept"] == ids[0] and cl["component_size"] == 3 and len(cl["verified_pairs"]) == 1
    assert [p[:2] for p in cl["linked_pairs"]] == [[ids[1], ids[2]]]  # the cut link of the chain


def test_components_remove_a_chain_naming_the_kept_record_with_its_measured_similarity(tmp_path):
    rng = random.Random(11)
    a = random_poem(rng, 40)
    b = substitute(a, 10)
    c = substitute(substitute(b, 25), 32)  # as in the chain test: J(a, b) 0.90, J(b, c) 0.81, J(a, c) 0.73
    write_records(tmp_path / "in", [dedup_record("c.json", i, t) for i, t in enumerate((a, b, c))])
    settings = DedupSettings(bands=32, rows=4, clusters="components")
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", settings, workers=1)
    write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    ids = [record_id("c.json", index=i) for i in range(3)]
    assert kept_ids(tmp_path / "out") == {ids[0]} and stats.components_with_several_kept == 0
    assert (stats.near_duplicates_removed, stats.chained_removals, stats.second_look_pairs) == (2, 1, 0)
    removed = {r["id"]: r for r in iter_jsonl(tmp_path / "out" / REMOVED_FILE)}
    assert {i: r["duplicate_of"] for i, r in removed.items()} == {ids[1]: ids[0], ids[2]: ids[0]}
    assert removed[ids[1]]["similarity"] >= 0.8  # its verified pair
    chained = mh.jaccard(mh.shingle_set(a, 2), mh.shingle_set(c, 2))
    assert removed[ids[2]]["similarity"] == pytest.approx(chained, abs=1e-4) and chained < 0.8
    (cl,) = iter_jsonl(tmp_path / "rep" / CLUSTERS_FILE)
    assert cl["kept"] == ids[0] and cl["size"] == 3 and cl["linked_pairs"] == []
    assert DedupSettings(keep="first_seen").cluster_mode() == "star"


def test_no_two_kept_records_are_near_duplicates_in_an_oversized_bucket(tmp_path):
    """A page and many copies of it, each with its own changes (0.87-0.91 to the page, 0.76-0.84 between copies):
    buckets far above max_bucket pair each member with one neighbour only (no hubs), so the first walk keeps copies
    never compared with the record kept; the second look compares them. No kept pair reaches the threshold, and
    every removal does. With hubs the page is a hub of every bucket: each copy is compared with it."""
    rng = random.Random(5)
    base = random_poem(rng, 90)
    texts = [base]
    for _ in range(150):
        text = base
        for pos in rng.sample(range(90), rng.choice((2, 3))):
            text = substitute(text, pos, rng.choice("甲乙丙丁戊己庚辛"))
        texts.append(text)
    write_records(tmp_path / "in", [dedup_record("p.json", i, t) for i, t in enumerate(texts)])
    hubs = build_dedup_report(tmp_path / "in", tmp_path / "hubs", DedupSettings(max_bucket=4, clusters="star"))
    assert hubs.docs_out == 1 and hubs.second_look_pairs == 0 and hubs.pairs_not_emitted > 0
    settings = DedupSettings(max_bucket=4, bucket_neighbours=1, bucket_hubs=0, clusters="star")
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", settings, workers=1)
    write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    assert stats.second_look_pairs >= stats.second_look_joins > 0
    by_id = {record_id("p.json", index=i): mh.shingle_set(t, 2) for i, t in enumerate(texts)}  # < 100 chars: 2-grams
    kept = sorted(kept_ids(tmp_path / "out"))
    removed = list(iter_jsonl(tmp_path / "out" / REMOVED_FILE))
    assert len(kept) + len(removed) == len(texts) and len(removed) > 100
    assert all(mh.jaccard(by_id[a], by_id[b]) < 0.8 for i, a in enumerate(kept) for b in kept[i + 1 :])
    assert all(mh.jaccard(by_id[r["id"]], by_id[r["duplicate_of"]]) >= 0.8 for r in removed)


def test_union_find():
    uf = mh.UnionFind(8)
    uf.union_pairs([(5, 6), (6, 7), (1, 2), (7, 3)])
    roots = uf.roots()
    assert roots.tolist() == [0, 1, 1, 3, 4, 3, 3, 3]  # root = smallest member
    assert uf.find(7) == 3 and not uf.union(5, 3) and uf.union(0, 4) and uf.find(4) == 0


def test_verified_pairs_are_the_same_whatever_the_key_batches(tmp_path, monkeypatch):
    """Keys are read in batches bounded by their shingle units: one pair per batch decides as one batch for all."""
    from tokenmill.stages.dedup import verify

    assert verify.key_batches(np.array([3, 3, 9, 1, 1, 1]), 6) == [0, 2, 3, 6]
    assert verify.key_batches(np.array([3, 3, 9]), 100) == [0, 3] and verify.key_batches(np.array([]), 5) == [0]
    rng = random.Random(3)
    texts = [random_poem(rng, 30) for _ in range(30)]
    texts += [substitute(t, 3) for t in texts[:20]] + texts[20:25]
    write_records(tmp_path / "in", [dedup_record("k.json", i, t) for i, t in enumerate(texts)])
    reports = []
    for budget in (1, verify.KEY_BATCH_UNITS):
        monkeypatch.setattr(verify, "KEY_BATCH_UNITS", budget)
        build_dedup_report(tmp_path / "in", tmp_path / f"rep{budget}", DedupSettings(), workers=1)
        reports.append((tmp_path / f"rep{budget}" / CLUSTERS_FILE).read_bytes())
    assert reports[0] == reports[1] and reports[0].count(b'"verified_pairs"') >= 20
