"""dedup_report / deduped_jsonl as a stage: keep rules, conservation and the report, determinism for any worker
count, the two assets end to end, partitioned steps, oversized buckets, settings and corrupt input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from support import (
    BATCH,
    dedup_record,
    kept_ids,
    materialize_batch,
    planted_dedup_corpus,
    random_poem,
    substitute,
    write_records,
)

from tokenmill.common.io import REMOVED_FILE, iter_jsonl, record_shards
from tokenmill.common.results import read_result
from tokenmill.errors import ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill.settings import load_settings
from tokenmill.stages.dedup import (
    CLUSTERS_FILE,
    DECISION_DIR,
    REPORT_FILE,
    DedupApplyResult,
    DedupSettings,
    Partitions,
    build_dedup_report,
    write_deduped,
)
from tokenmill.stages.dedup import keys as K
from tokenmill.stages.dedup.buckets import _band_slice, write_lsh
from tokenmill.stages.dedup.layout import NpyRows


@pytest.mark.parametrize("rule", ["richest_meta", "first", "longest"])
def test_keep_rule(tmp_path, rule):
    rng = random.Random(9)
    t = random_poem(rng, 40)
    recs = [
        dedup_record("k/10.json", 0, t, {"title": "x"}),  # earliest, 1 meta field
        dedup_record("k/2.json", 0, t + "。", {"title": "x", "author": "y", "n": ""}),  # 2 non-empty meta fields
        dedup_record("k/2.json", 1, t + random_poem(rng, 2), {}),  # near dup, longest text
        dedup_record("k/2.json", 2, t, {"title": "x", "author": "z"}),
    ]  # ties the richest, later
    write_records(tmp_path / "in", recs)
    build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(keep=rule), workers=1)
    write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    # natural path order: k/2.json comes before k/10.json
    expected = {"richest_meta": recs[1]["id"], "first": recs[0]["id"], "longest": recs[2]["id"]}[rule]
    assert kept_ids(tmp_path / "out") == {expected}
    removed = list(iter_jsonl(tmp_path / "out" / REMOVED_FILE))
    assert {r["duplicate_of"] for r in removed} == {expected} and len(removed) == 3


@pytest.mark.parametrize("rule", ["richest_meta", "longest"])
def test_keep_rule_breaks_ties_by_quality(tmp_path, rule):
    """Equal meta and length: the capitalised copy beats an all-lowercase one listed first, a clean text one with
    replacement characters, and the reason is in clusters.jsonl and the report's samples."""
    text = "The Quiet Harbour\nWe walked along the old pier while the gulls circled over the grey water, " * 2
    essay = (
        "Rivers carry silt to the delta, where it settles into banks that shift with every flood season. Farmers "
        "follow the banks, planting rice on the new ground and moving their houses when the water comes back."
    )
    recs = [
        dedup_record("q/a.json", 0, text.lower(), {"title": "x"}),
        dedup_record("q/a.json", 1, text, {"title": "x"}),
        dedup_record("q/b.json", 0, essay.replace("settles", "settl\ufffd\ufffd"), {"title": "y"}),
        dedup_record("q/b.json", 1, essay, {"title": "y"}),
    ]
    write_records(tmp_path / "in", recs)
    build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(keep=rule), workers=1)
    clusters = {c["kept"]: c for c in iter_jsonl(tmp_path / "rep" / CLUSTERS_FILE)}
    assert set(clusters) == {recs[1]["id"], recs[3]["id"]}
    assert clusters[recs[1]["id"]]["reason"] == "proper casing"
    assert clusters[recs[3]["id"]]["reason"] == "fewer replacement/garbage characters"
    report = json.loads((tmp_path / "rep" / REPORT_FILE).read_text())
    assert {x["kept"]: x["reason"] for x in report["samples"]} == {k: c["reason"] for k, c in clusters.items()}
    assert "proper casing" in report["parameters"]["keep_order"]


def test_counts_add_up_and_report(tmp_path):
    recs, truth = planted_dedup_corpus()
    write_records(tmp_path / "in", recs, per_shard=90)
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(chunk_bytes=4096), workers=1)
    out = write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    removed = list(iter_jsonl(tmp_path / "out" / REMOVED_FILE))
    kept = kept_ids(tmp_path / "out")
    assert out.docs_in == len(recs) == len(kept) + len(removed) == out.docs_out + len(removed)
    assert [p.name for p in record_shards(tmp_path / "out")] == [p.name for p in record_shards(tmp_path / "in")]
    by_level = {lv: {r["id"] for r in removed if r["level"] == lv} for lv in ("exact", "near")}
    # richest meta: the punctuated copies in b.json (2 fields) survive, their a.json originals go
    assert len(by_level["exact"]) == 30 and by_level["near"] == truth["near"]
    assert stats.dropped["exact_duplicate"] == 30 and stats.dropped["near_duplicate"] == 20
    for r in removed:
        assert set(r) >= {"id", "duplicate_of", "level", "similarity", "source", "reason"}
        assert (r["similarity"] == 1.0) == (r["level"] == "exact") and r["similarity"] >= 0.8
    report = json.loads((tmp_path / "rep" / REPORT_FILE).read_text())
    c = report["counts"]
    assert c["records_in"] == 250 and c["clusters"] == 50 and c["largest_cluster"] == 2
    assert c["cross_file_duplicates"] == 50 and c["candidate_pairs"] >= c["verified_pairs"] >= 20
    assert report["parameters"]["bands"] == 21 and report["parameters"]["catch_probability"]["0.8"] == 0.9983
    src = {p["path"]: p for p in report["per_source"]}
    assert src["a.json"]["records_in"] == 200 and src["a.json"]["exact_removed"] == 30
    assert sum(p["kept"] for p in report["per_source"]) == len(kept)
    assert report["cluster_sizes"][0] == {"size": "2", "clusters": 50, "records": 100}
    assert report["samples"] and all(m["text"] for s in report["samples"] for m in s["members"])
    clusters = list(iter_jsonl(tmp_path / "rep" / CLUSTERS_FILE))
    assert len(clusters) == 50 and all(c["members"][0]["id"] == c["kept"] for c in clusters)
    # what only the steps read is gone (signatures/: 2.2 bytes per input byte on the demo; the index keeps its own)
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == [
        "_stats.json",
        "_timings.json",
        CLUSTERS_FILE,
        DECISION_DIR,
        REPORT_FILE,
    ]
    assert "signatures" not in report["files"]
    decided = [np.load(f)["id"] for f in sorted((tmp_path / "rep" / DECISION_DIR).glob("*.npz"))]
    assert sum(len(d) for d in decided) == len(removed)


def test_deterministic_for_any_worker_count_and_batch_size(tmp_path, monkeypatch):
    import tokenmill.stages.dedup.signatures as dedup

    recs, _ = planted_dedup_corpus(seed=1)
    write_records(tmp_path / "in", recs, per_shard=60)
    outs = []
    for w, batch in ((1, dedup.SHINGLE_BATCH), (2, dedup.SHINGLE_BATCH), (1, 100)):
        monkeypatch.setattr(dedup, "SHINGLE_BATCH", batch)  # 100: a few documents per hashing batch
        rep, out = tmp_path / f"rep{w}-{batch}", tmp_path / f"out{w}-{batch}"
        build_dedup_report(tmp_path / "in", rep, DedupSettings(chunk_bytes=1500), workers=w)
        write_deduped(tmp_path / "in", rep, out, workers=w)
        report = (rep / REPORT_FILE).read_bytes()  # timings live in _timings.json: the report is byte-identical
        files = {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))}
        decisions = {p.name: p.read_bytes() for p in sorted((rep / DECISION_DIR).iterdir())}
        outs.append((report, (rep / CLUSTERS_FILE).read_bytes(), files, decisions))
    assert outs[0] == outs[1] == outs[2]


def test_stale_report_is_refused(tmp_path):
    recs, _ = planted_dedup_corpus()
    write_records(tmp_path / "in", recs)
    build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
    with open(tmp_path / "in" / "part-00000.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(dedup_record("z.json", 0, "新的一首诗")) + "\n")
    with pytest.raises(StaleUpstreamError, match="rematerialize dedup_report"):
        write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)


def test_empty_input(tmp_path):
    (tmp_path / "in").mkdir()
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
    out = write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    assert stats.docs_in == 0 and out.docs_out == 0 and (tmp_path / "out" / REMOVED_FILE).exists()


def test_materialize_dedup_assets(tmp_path):
    from assets.dedup import dedup_batch_assets, deduped_jsonl

    recs, truth = planted_dedup_corpus()
    write_records(tmp_path / "cleaned_jsonl" / BATCH, recs, per_shard=100)
    result = materialize_batch(
        [dedup_batch_assets, deduped_jsonl],
        tmp_path,
        tmp_path / "cleaned_jsonl",
        run_config={"ops": {"dedup_report": {"config": {"sample_clusters": 4}}}},
    )
    assert result.success
    md = result.asset_materializations_for_node("dedup_report")[0].metadata
    assert md["docs_in"].value == 250 and md["dropped_near_duplicate"].value == 20
    assert md["bands_x_rows"].value == "21 x 6"
    assert "removed" in md["sample_clusters"].value and "0.9983" in md["parameters"].value
    assert len(md["per_source"].value.records) == 2
    assert (tmp_path / "dedup_index" / BATCH / "segment.json").exists()
    md2 = result.asset_materializations_for_node("deduped_jsonl")[0].metadata
    assert md2["docs_in"].value == md2["docs_out"].value + 50
    stats = read_result(tmp_path / "deduped_jsonl" / BATCH, DedupApplyResult)
    assert stats.docs_in == stats.docs_out + stats.dropped["exact_duplicate"] + stats.dropped["near_duplicate"]
    assert not any(
        p.name.endswith(".jsonl")
        and p.name not in ("part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl", REMOVED_FILE)
        for p in (tmp_path / "deduped_jsonl" / BATCH).iterdir()
    )
    assert (tmp_path / "deduped_jsonl" / REMOVED_FILE).read_bytes() == (
        tmp_path / "deduped_jsonl" / BATCH / REMOVED_FILE
    ).read_bytes()  # every batch's removed records, gathered


def test_demo_corpus_planted_duplicates_are_found(tmp_path, demo_source, demo_manifest):
    raw = pytest.importorskip("tokenmill.stages.raw")
    if not demo_source.exists():
        pytest.skip("demo corpus not generated")
    raw.ingest(demo_source, tmp_path / "raw", workers=1)
    build_dedup_report(tmp_path / "raw", tmp_path / "rep", DedupSettings(), workers=1)
    out = write_deduped(tmp_path / "raw", tmp_path / "rep", tmp_path / "out", workers=1)
    kept_of = {r["id"]: r["duplicate_of"] for r in iter_jsonl(tmp_path / "out" / REMOVED_FILE)}
    same = lambda a, b: kept_of.get(a, a) == kept_of.get(b, b)  # noqa: E731 - one survivor for both
    assert all(same(a, b) for a, b in demo_manifest["exact_duplicates"])
    assert all(same(p["a"], p["b"]) for p in demo_manifest["near_duplicates"])
    assert out.docs_in == demo_manifest["records"]


def _decisions(rep: Path, out: Path) -> tuple:
    report = json.loads((rep / REPORT_FILE).read_text())
    counts = {k: v for k, v in report["counts"].items()}
    files = {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))}
    return counts, report["samples"], report["per_source"], (rep / CLUSTERS_FILE).read_bytes(), files


def test_partitioned_steps_decide_as_one_partition(tmp_path):
    recs, _ = planted_dedup_corpus(seed=4)
    rng = random.Random(4)
    template = random_poem(rng, 40)  # a family of near copies: clusters joined through several pairs and groups
    recs += [dedup_record("c.json", i, substitute(template, 3 + i % 30, "云" if i % 2 else "雨")) for i in range(12)]
    recs += [dedup_record("d.json", i, template) for i in range(3)]
    write_records(tmp_path / "in", recs, per_shard=70)
    runs = {}
    for name, parts in (
        ("one", Partitions(exact_docs=10**9, bucket_items=10**9, verify_pairs=10**9, cluster_docs=10**9)),
        ("many", Partitions(exact_docs=7, bucket_items=5, verify_pairs=3, cluster_docs=4)),
    ):
        rep, out = tmp_path / f"rep-{name}", tmp_path / f"out-{name}"
        build_dedup_report(tmp_path / "in", rep, DedupSettings(chunk_bytes=3000), workers=1, partitions=parts)
        write_deduped(tmp_path / "in", rep, out, workers=1)
        runs[name] = _decisions(rep, out)
        partitions = json.loads((rep / REPORT_FILE).read_text())["partitions"]
        if name == "many":  # every partitioned step really ran as several tasks
            steps = ("digest_ranges", "band_hash_ranges", "verify_ranges", "cluster_parts")
            assert min(partitions[k] for k in steps) > 1
        else:
            assert partitions["digest_ranges"] == partitions["band_hash_ranges"] == partitions["verify_ranges"] == 1
            assert partitions["cluster_parts"] == 1
    assert runs["one"] == runs["many"]
    counts = runs["one"][0]
    assert counts["near_duplicates_removed"] >= 20 + 12 and counts["components"] >= 50


def test_step_files_are_read_by_slice_as_numpy_would(tmp_path):
    """NpyRows (positioned reads, no mapping) gives the slices and binary searches of np.load and np.searchsorted."""
    rng = np.random.default_rng(0)
    hashes = np.sort(rng.integers(0, 1 << 63, (3, 500), dtype=np.uint64) * np.uint64(2), axis=1)
    words = rng.integers(0, 1 << 63, (3, 500, 2), dtype=np.uint64)
    rows = np.zeros(300, dtype=K.EXACT_DTYPE)
    rows["doc"], rows["rep"] = np.sort(rng.integers(0, 10_000, 300)), rng.integers(0, 10_000, 300)
    for name, arr in (("h", hashes), ("w", words), ("e", rows)):
        np.save(tmp_path / f"{name}.npy", arr)
    with NpyRows(tmp_path / "h.npy") as f:
        for band in range(3):
            for value in (0, int(hashes[band, 17]), int(hashes[band, 17]) + 1, (1 << 64) - 1, 1 << 64):
                want = len(hashes[band]) if value >= 1 << 64 else np.searchsorted(hashes[band], np.uint64(value))
                assert f.searchsorted((band,), value) == want
            assert np.array_equal(f.read((band,), 40, 90), hashes[band, 40:90])
    with NpyRows(tmp_path / "w.npy") as f:
        assert np.array_equal(f.read((2,), 0, 500), words[2]) and f.read((1,), 7, 7).shape == (0, 2)
    with NpyRows(tmp_path / "e.npy") as f:
        a = f.searchsorted((), int(rows["doc"][100]), "doc")
        assert a == np.searchsorted(rows["doc"], rows["doc"][100])
        assert np.array_equal(f.read((), a, 300), rows[a:])


def test_a_chunks_band_slice_through_its_fence_is_the_binary_searchs(tmp_path):
    """A bucket task's slice of a chunk's band, found through the fence file, is where a binary search of the band
    puts the range's bounds: runs of one hash across fence posts, bounds on a post, beyond every hash, empty bands."""
    rng = np.random.default_rng(3)
    for items in (0, 1, 63, 64, 65, 1000):
        hashes = np.sort(rng.integers(0, 40, (4, items), dtype=np.uint64) * np.uint64(1 << 58), axis=1)
        docs = np.arange(items, dtype=np.int64)
        sig = rng.integers(0, 1 << 32, (items, 32), dtype=np.uint32)
        write_lsh(tmp_path, f"c{items}", docs, rng.permutation(hashes, axis=1), sig, rows=4)
        base = tmp_path / f"c{items}"
        values = [0, 1, 1 << 58, (1 << 58) + 1, 39 << 58, 1 << 63, (1 << 64) - 1, 1 << 64]
        with NpyRows(f"{base}.hash.npy") as f:
            for band in range(4):
                for lo, hi in zip(values, values[1:]):
                    assert _band_slice(base, f, band, lo, hi) == (
                        f.searchsorted((band,), lo),
                        f.searchsorted((band,), hi),
                    )


def test_oversized_bucket_is_handled_and_counted(tmp_path):
    rng = random.Random(8)
    t = random_poem(rng, 60)
    # 40 one-substitution copies: they share most band buckets, far above max_bucket=5
    recs = [dedup_record("o.json", i, substitute(t, i % 60, "龍")) for i in range(40)]
    write_records(tmp_path / "in", recs)
    settings = DedupSettings(max_bucket=5)
    stats = build_dedup_report(
        tmp_path / "in", tmp_path / "rep", settings, workers=1, partitions=Partitions(bucket_items=7, verify_pairs=10)
    )
    report = json.loads((tmp_path / "rep" / REPORT_FILE).read_text())
    assert stats.oversized_buckets > 0 and report["counts"]["oversized_buckets"] == stats.oversized_buckets
    assert stats.pairs_not_emitted > 0
    # neighbours in signature order: at most 4m pairs per oversized bucket, not m^2 / 2; the family still
    # collapses to a few survivors, each removal verified against the record it names
    assert stats.candidate_pairs < 40 * 39 // 2
    assert stats.docs_out <= 4 and stats.dropped["near_duplicate"] == 40 - stats.docs_out


def _low_entropy(n: int, seed: int = 0) -> list[dict]:
    """~200-character documents of words made of 16 syllables (their MinHash minima collide, so LSH buckets grow
    with the corpus), one in 20 a near copy of an earlier one with a word replaced."""
    rng = random.Random(seed)
    syl = ["ka", "to", "ri", "ne", "su", "mo", "la", "pi", "do", "ve", "shi", "gu", "ba", "ze", "fo", "hu"]
    vocab = ["".join(rng.choice(syl) for _ in range(rng.randint(1, 4))) for _ in range(2000)]
    docs = []
    for i in range(n):
        if i > 10 and i % 20 == 0:
            words = list(docs[rng.randrange(i)])
            words[rng.randrange(len(words))] = rng.choice(vocab)
        else:
            words = [rng.choice(vocab) for _ in range(32)]
        docs.append(words)
    return [dedup_record("low.json", i, " ".join(w)) for i, w in enumerate(docs)]


def test_low_entropy_candidates_bounded_per_document(tmp_path):
    write_records(tmp_path / "in", _low_entropy(1000))
    # 32 bands of 2 rows: buckets of hundreds of documents already at this size (as 16 x 8 at millions); character
    # shingles: the syllables' minima collide (word shingles of these texts are not low-entropy)
    bounded = DedupSettings(bands=32, rows=2, max_bucket=8, bucket_neighbours=2, shingles="chars")
    unbounded = DedupSettings(bands=32, rows=2, max_bucket=4096, shingles="chars")  # above any bucket of 1000 docs
    runs = {}
    for name, settings in (("bounded", bounded), ("unbounded", unbounded)):
        runs[name] = build_dedup_report(tmp_path / "in", tmp_path / name, settings, workers=1)
        write_deduped(tmp_path / "in", tmp_path / name, tmp_path / f"out-{name}", workers=1)
    b, u = runs["bounded"], runs["unbounded"]
    # a bucket within the limit emits at most max_bucket - 1 pairs per member, an oversized one neighbours + hubs
    # (a hub's pairs are its bucket's), so the pairs grow linearly with the corpus; every pair of every bucket is
    # over 3x that bound
    per_member = max(bounded.max_bucket - 1, 2 * (bounded.bucket_neighbours + bounded.bucket_hubs))
    bound = 1000 * 32 * per_member // 2
    assert b.candidate_pairs <= bound and u.candidate_pairs > 3 * bound
    report = json.loads((tmp_path / "bounded" / REPORT_FILE).read_text())
    assert report["counts"]["oversized_buckets"] == b.oversized_buckets > 0 and b.pairs_not_emitted > 0
    assert u.oversized_buckets == 0
    # the signature pre-filter leaves almost none of these false candidates to the exact comparison
    assert report["counts"]["signature_rejected"] == b.signature_rejected
    assert b.signature_rejected > 0.99 * (b.candidate_pairs - b.verified_pairs)
    assert report["parameters"]["signature_filter"]["min_agreement"] == 73  # of 128 at threshold 0.8
    # the near copies are found as with every pair of every bucket
    assert b.dropped["near_duplicate"] == u.dropped["near_duplicate"] > 40
    removed = [(tmp_path / f"out-{name}" / REMOVED_FILE).read_bytes() for name in runs]
    assert removed[0] == removed[1]


@pytest.mark.parametrize(
    "values,field",
    [
        ({"keep": "newest"}, "dedup_report.keep"),
        ({"threshold": 1.5}, "dedup_report.threshold"),
        ({"shingle_hash": "md5"}, "dedup_report.shingle_hash"),
        ({"ngram_bounds": [1000, 100]}, "dedup_report.ngram_bounds"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(values, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings(DedupSettings, values)


def test_bands_times_rows_beyond_num_perm_is_refused():
    with pytest.raises(ConfigError) as e:
        load_settings(DedupSettings, {"bands": 20, "rows": 8, "num_perm": 128})
    assert all(word in str(e.value) for word in ("dedup_report", "bands", "rows", "num_perm", "160"))
    with pytest.raises(ConfigError, match="bands"):
        load_settings(DedupSettings, {"bands": 4})


def test_malformed_line_in_cleaned_jsonl_is_corruption(tmp_path):
    recs, _ = planted_dedup_corpus()
    write_records(tmp_path / "in", recs[:20])
    with open(tmp_path / "in" / "part-00000.jsonl", "a", encoding="utf-8") as f:
        f.write("\n{not json\n")
    with pytest.raises(CorruptOutputError, match=r"part-00000\.jsonl:22: not a JSON record"):
        build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
