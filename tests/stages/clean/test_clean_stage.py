"""cleaned_jsonl as a stage: bad input, conservation, determinism for any worker count, settings, stats, accuracy
on the demo corpus, the asset, drops per language."""

import pytest
from support import BATCH, POEM, PROSE, clean, make_raw, materialize_batch, planted_corpus

from tokenmill.common.io import (
    REJECTED_FILE,
    SHARDS_FILE,
    STATS_FILE,
    TIMINGS_FILE,
    iter_jsonl,
    record_shards,
)
from tokenmill.common.results import read_result, result_files
from tokenmill.errors import ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill.settings import validate_run_settings
from tokenmill.stages.clean import REASONS, CleanResult, CleanSettings, clean_corpus


def test_bad_input_never_crashes(tmp_path):
    huge = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 190_000)[:10_500_000]
    mixed = "Ελληνικά русский текст العربية हिन्दी 日本語のテキスト 한국어 텍스트 emoji 👩\u200d💻 " * 3
    texts = [huge, mixed, " \n\t\r\n ", None, 12345, "ok " * 10]
    ids, recs, rej, stats = clean(tmp_path, texts)
    assert rej[ids[0]]["reason"] == "too_long"
    assert recs[ids[1]]["text"] == mixed.strip()
    assert rej[ids[2]]["reason"] == "empty" and rej[ids[3]]["reason"] == "empty"
    assert rej[ids[4]]["reason"] == "too_short"  # a number as text: "12345"


def test_output_deterministic_for_any_worker_count(tmp_path, monkeypatch):
    import tokenmill.stages.clean.corpus as stage

    monkeypatch.setattr(stage, "POOL_MIN_BYTES", 0)  # small input: force both passes into worker processes
    docs, *_ = planted_corpus(200, seed=11)
    docs += ["", "\ufffd" * 30, "Ã©tÃ© " + PROSE]
    _, _, _, s1 = clean(tmp_path, docs, workers=1, name="w1", per_shard=40)
    _, _, _, s2 = clean(tmp_path, docs, workers=2, name="w2", per_shard=40)
    names = sorted(p.name for p in (tmp_path / "w1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "w2").iterdir())
    assert names == sorted(
        [f"part-{k:05d}.jsonl" for k in range(6)] + [REJECTED_FILE, SHARDS_FILE, STATS_FILE, TIMINGS_FILE]
    )
    for name in names:
        if name != TIMINGS_FILE:
            assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()
    assert result_files(s1)[0] == result_files(s2)[0]  # the stats: everything but how the run went


def test_unchanged_records_pass_through_byte_identical(tmp_path):
    # language identification adds meta fields to every record: off, nothing else touches these
    ids, recs, _, _ = clean(tmp_path, [POEM, PROSE], [{"title": "静夜思", "author": "李白"}, {}], language_id=False)
    shard = "part-00000.jsonl"
    assert (tmp_path / "raw-out" / shard).read_bytes() == (tmp_path / "out" / shard).read_bytes()


def test_missing_input_folder_is_a_clear_error(tmp_path):
    with pytest.raises(StaleUpstreamError, match="raw_records"):
        clean_corpus(tmp_path / "nope", tmp_path / "out", CleanSettings())


def test_settings_bounds_and_combinations():
    for bad in (
        {"normalization": "NFD"},
        {"bp_threshold": 1.5},
        {"max_dup_line_frac": -0.1},
        {"bp_min_df": 0},
        {"min_chars": 50, "max_chars": 10},
        {"no_such_setting": 1},
    ):
        with pytest.raises(ValueError):
            CleanSettings(**bad)
    assert CleanSettings(min_chars=50, max_chars=0).max_chars == 0  # 0: no length limit
    with pytest.raises(ConfigError, match=r"cleaned_jsonl: min_chars \(50\) must not exceed max_chars"):
        validate_run_settings({"ops": {"cleaned_jsonl": {"config": {"min_chars": 50, "max_chars": 10}}}})


def test_malformed_raw_line_is_corruption(tmp_path):
    make_raw(tmp_path / "raw", [PROSE, POEM])
    with open(tmp_path / "raw" / "part-00000.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": "cut\n')
    with pytest.raises(CorruptOutputError, match=r"part-00000.jsonl:3: not a JSON record"):
        clean_corpus(tmp_path / "raw", tmp_path / "out", workers=1)


def test_stats_report(tmp_path):
    docs, *_ = planted_corpus(120)
    ids, recs, rej, stats = clean(tmp_path, docs + ["Title: A\nAuthor: B\n" + PROSE, ""])
    assert sum(stats.length_hist_before) == stats.docs_in
    assert sum(stats.length_hist_after) == stats.docs_out
    assert len(stats.length_buckets) == len(stats.length_hist_after)
    assert stats.chars_out < stats.chars_in
    kinds = {e["kind"] for e in stats.examples}
    assert {"boilerplate", "metadata"} <= kinds
    assert all(len(e["before"]) <= 200 for e in stats.examples)
    assert set(stats.rule_time_share) >= {"repair_mojibake", "strip_boilerplate", "filter_repetition"}
    assert abs(sum(stats.rule_time_share.values()) - 1) < 0.01


def test_accuracy_on_demo_corpus(demo_source, demo_manifest, tmp_path):
    from tokenmill.stages.clean.line_stats import line_key
    from tokenmill.stages.raw import ingest

    if not demo_source.is_dir():
        pytest.skip("demo corpus absent")
    ingest(demo_source, tmp_path / "raw", workers=1)
    clean_corpus(tmp_path / "raw", tmp_path / "base", CleanSettings(boilerplate=False), workers=1)
    stats = clean_corpus(tmp_path / "raw", tmp_path / "out", CleanSettings(), workers=2)
    base = {r["id"]: r for p in record_shards(tmp_path / "base") for r in iter_jsonl(p)}
    out = {r["id"]: r for p in record_shards(tmp_path / "out") for r in iter_jsonl(p)}
    rej = {r["id"]: r for r in iter_jsonl(tmp_path / "out" / REJECTED_FILE)}
    assert stats.docs_in == demo_manifest["records"] == len(out) + len(rej)

    planted = {(d["id"], line) for d in demo_manifest["boilerplate_docs"] for line in d["lines"]}
    removed = set()
    for rid, rec in out.items():
        kept = {line_key(ln) for ln in rec["text"].split("\n")}
        removed |= {
            (rid, ln.strip()) for ln in base[rid]["text"].split("\n") if ln.strip() and line_key(ln) not in kept
        }
    precision = len(removed & planted) / max(1, len(removed))
    recall = len(removed & planted) / len(planted)
    assert precision >= 0.95 and recall >= 0.95, (precision, recall, sorted(removed ^ planted)[:5])

    for d in demo_manifest["genuine_frequent_docs"]:
        assert d["line"] in out[d["id"]]["text"], d
    texts = "\n".join(r["text"] for r in out.values())
    for word in demo_manifest["genuine_frequent_words"]:
        assert texts.count(word) >= 5, word
    for g in demo_manifest["garbled"]:
        assert rej.get(g["id"], {}).get("reason") == g["reason"], g
    assert set(rej) == {g["id"] for g in demo_manifest["garbled"]}  # nothing else rejected
    for m in demo_manifest["mojibake"]:
        assert out[m["id"]]["text"] == m["original"], m["id"]
    for h in demo_manifest.get("header_metadata", []):
        assert out[h["id"]]["meta"]["title"] == h["title"] and out[h["id"]]["meta"]["author"] == h["author"]


def test_cleaned_jsonl_asset(demo_source, tmp_path):
    from assets.clean import cleaned_jsonl
    from assets.raw import raw_records

    result = materialize_batch([raw_records, cleaned_jsonl], tmp_path / "data", demo_source)
    assert result.success
    meta = result.asset_materializations_for_node("cleaned_jsonl")[0].metadata
    stats = read_result(tmp_path / "data" / "cleaned_jsonl" / BATCH, CleanResult)
    assert meta["docs_in"].value == stats.docs_in
    assert meta["docs_out"].value == stats.docs_out == stats.docs_in - stats.rejected
    assert all(f"dropped_{r}" in meta for r in REASONS)
    assert meta["boilerplate_lines_stripped"].value > 0
    assert len(meta["boilerplate_top_lines"].value.records) >= 1
    for key in ("examples", "length_distribution", "seconds", "path"):
        assert key in meta
    # no stray .jsonl besides the shards and _rejected.jsonl (check_contracts globs **/*.jsonl)
    names = {p.name for p in (tmp_path / "data" / "cleaned_jsonl" / BATCH).iterdir()}
    assert (tmp_path / "data" / "cleaned_jsonl" / REJECTED_FILE).exists()  # every batch's, gathered
    assert all(n.startswith("part-") or n in (REJECTED_FILE, SHARDS_FILE, STATS_FILE, TIMINGS_FILE) for n in names)


def test_drops_counted_per_language_for_every_reason(tmp_path, monkeypatch):
    """`dropped_by_language` ({language: {reason: records}}) names a language for every drop: its meta.language,
    else the one identified on its text, else 'und'; the same figures for any worker count."""
    import tokenmill.stages.clean.corpus as stage

    monkeypatch.setattr(stage, "POOL_MIN_BYTES", 0)  # small input: force both passes into worker processes
    texts = [
        "Hi there",
        "",
        "\n".join(["Achetez des montres pas chères maintenant, la livraison est gratuite !"] * 12),
        "\n".join(["今天天气很好，我们一起去公园散步，然后去吃饭。"] * 12),
        "Hallo du",
        PROSE,
    ]
    metas = [{"language": "de"}, {}, {}, {}, {"language": "deu"}, {}]
    _, _, rej, s1 = clean(tmp_path, texts, metas, per_shard=2, name="w1")
    _, _, _, s2 = clean(tmp_path, texts, metas, per_shard=2, workers=2, name="w2")
    want = {"de": {"too_short": 2}, "fr": {"repetition": 1}, "zh": {"repetition": 1}, "und": {"empty": 1}}
    assert s1.dropped_by_language == s2.dropped_by_language == want
    assert list(s1.dropped_by_language) == ["de", "fr", "und", "zh"]  # most drops first, then by code
    assert sum(n for reasons in want.values() for n in reasons.values()) == s1.rejected == len(rej)


def test_distinct_values_spill_past_what_they_hold_and_still_find_a_repeat(tmp_path, monkeypatch):
    import numpy as np

    from tokenmill.common.io import DistinctValues

    monkeypatch.setattr(DistinctValues, "HELD", 1000)
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**64, 20_000, dtype=np.uint64)
    for repeat in (False, True):
        pieces = np.array_split(np.concatenate([values, values[12_345:12_346]]) if repeat else values, 17)
        seen = DistinctValues(tmp_path)
        for piece in pieces:
            seen.add(piece)
        assert seen.all_distinct() is not repeat
        assert list(tmp_path.iterdir()) == []  # the spilled files are removed
    few = DistinctValues(tmp_path / "never")
    few.add(values[:10])
    assert few.all_distinct() and not (tmp_path / "never").exists()  # under HELD nothing is written


def test_shard_figures_see_a_repeated_id_across_shards_when_ids_are_spilled(tmp_path, monkeypatch):
    from tokenmill.common.io import DistinctValues, read_json

    monkeypatch.setattr(DistinctValues, "HELD", 3)
    clean(tmp_path, [PROSE + f" {i}" for i in range(12)], name="unique", per_shard=4)
    assert read_json(tmp_path / "unique" / SHARDS_FILE)["unique_ids"] is True
    texts = [PROSE + f" {i}" for i in range(8)]
    ids = make_raw(tmp_path / "raw-twice", texts, per_shard=8)
    # a second shard whose records repeat the first's ids (as a source listed twice would)
    make_raw(tmp_path / "raw-again", texts, per_shard=8, extra={i: {"id": ids[i]} for i in range(8)})
    (tmp_path / "raw-again" / "part-00000.jsonl").rename(tmp_path / "raw-twice" / "part-00001.jsonl")
    clean_corpus(tmp_path / "raw-twice", tmp_path / "twice", CleanSettings(), workers=1)
    assert read_json(tmp_path / "twice" / SHARDS_FILE)["unique_ids"] is False
    assert not [p for p in (tmp_path / "twice").iterdir() if p.name.startswith(".distinct")]
