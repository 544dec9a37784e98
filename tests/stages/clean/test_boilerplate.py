"""cleaned_jsonl's boilerplate step and its line statistics: planted headers and footers go, frequent genuine
lines and structure stay."""

import random

import pytest
from support import clean, planted_corpus

from tokenmill.common.io import (
    iter_jsonl,
    record_shards,
)
from tokenmill.common.results import result_files
from tokenmill.stages.clean import CleanSettings, clean_corpus, corpus
from tokenmill.stages.clean.boilerplate import merge_task, template_score


def test_boilerplate_stripped_genuine_frequent_lines_kept(tmp_path):
    docs, planted, genuine_docs, genuine, speakers = planted_corpus()
    ids, recs, rej, stats = clean(tmp_path, docs, per_shard=70, workers=1)
    assert not rej
    removed_total = 0
    for i, doc in enumerate(docs):
        out_lines = recs[ids[i]]["text"].split("\n")
        removed = [ln for ln in doc.split("\n") if ln not in out_lines]
        assert removed == planted[i], (i, removed)
        removed_total += len(removed)
    assert all(genuine in recs[ids[i]]["text"] for i in genuine_docs)
    for sp in speakers:  # labels at the top of many documents are structure, not boilerplate
        assert any(recs[ids[i]]["text"].startswith(sp) for i in range(len(docs)))
    bp = stats.boilerplate
    assert bp["lines_stripped"] == removed_total == sum(map(len, planted.values()))
    assert bp["docs_touched"] == sum(1 for p in planted.values() if p)
    top = {t["line"]: t for t in bp["top_lines"]}
    assert set(top) == {
        "Copyright © 2024 Example Press | All rights reserved",
        "Read more at https://example.com/poems",
        "【本文来自网络 | 转载请注明出处】",
    }
    t = top["Read more at https://example.com/poems"]
    assert t["score"] >= 0.65 and t["position"] == 1.0 and "url" in t["traits"]


def test_merge_split_into_hash_ranges_finds_the_same_lines(tmp_path, monkeypatch):
    """The corpus-wide merge of line statistics runs as one task per hash range: any number of ranges gives the
    output of one merge over every shard, byte for byte."""
    docs, planted, *_ = planted_corpus()
    _, _, _, whole = clean(tmp_path, docs, per_shard=70, workers=1, name="whole")
    ranges = []
    monkeypatch.setattr(corpus, "MERGE_ROWS", 40)  # a few hundred distinct lines: a dozen ranges
    monkeypatch.setattr(corpus, "merge_task", lambda task: ranges.append(task.lo) or merge_task(task))
    _, _, _, split = clean(tmp_path, docs, per_shard=70, workers=1, name="split")
    assert len(ranges) > 10 and ranges == sorted(ranges)
    assert result_files(split)[0] == result_files(whole)[0] and whole.boilerplate["lines_stripped"] > 0
    for f in sorted((tmp_path / "whole").iterdir()):
        if f.name != "_timings.json":
            assert (tmp_path / "split" / f.name).read_bytes() == f.read_bytes(), f.name
    assert not list((tmp_path / "split").glob(".lines-*"))  # the line-statistics files are gone


def test_frequency_alone_never_strips(tmp_path):
    # a template-looking line in every other document, but at varied positions: genuine content
    rng = random.Random(3)
    line = "Section | Notes © see above"
    docs = []
    for i in range(200):
        body = [f"Sentence number {j} of document {i} talks about rivers and moons." for j in range(8)]
        if i % 2:
            body.insert(rng.randint(1, 7), line)
        docs.append("\n".join(body))
    ids, recs, _, stats = clean(tmp_path, docs)
    assert stats.boilerplate["lines_stripped"] == 0
    assert sum(line in r["text"] for r in recs.values()) == 100


def test_boilerplate_can_be_disabled(tmp_path):
    docs, planted, *_ = planted_corpus(120)
    ids, recs, _, stats = clean(tmp_path, docs, boilerplate=False)
    assert [recs[i]["text"] for i in ids] == docs
    assert stats.boilerplate["lines_stripped"] == 0


def test_line_statistics_of_a_batch():
    from tokenmill.stages.clean.line_stats import LineStats, batch_line_hashes, doc_line_hashes, key_hash, line_key

    texts = ["x\ny\nz", "x\nw\n\n  \n\u3000\nX\nv", "solo", "Page 3\npage 4 \n\tΣ"]
    hashes, counts = batch_line_hashes(texts)
    assert hashes.tolist() == [h for t in texts for h in doc_line_hashes(t)]
    assert counts.tolist() == [3, 4, 1, 3]
    stats = LineStats(0.05)
    stats.add_documents(texts[:3])
    table = stats.table()
    row = {int(h): i for i, h in enumerate(table.hash)}

    def figures(line):
        i = row[key_hash(line_key(line))]
        return [float(getattr(table, k)[i]) for k in ("df", "head", "tail", "informative", "chance")]

    # "x" heads the first document; in the second it is repeated (first and last lines 0 and 2 of 4: no edge)
    assert figures("x") == [2, 1, 0, 2, 1 / 3 + 1 / 4]
    assert figures("z") == [1, 0, 1, 1, 1 / 3]
    assert figures("v") == [1, 0, 1, 1, 1 / 4]
    assert figures("solo") == [1, 0, 0, 0, 0]  # a one-line document says nothing about position
    assert table.docs == 3 and len(table) == 6


def test_template_traits():
    assert template_score("copyright © 0 example press | all rights reserved")[0] == 1.0
    assert template_score("【本文来自网络 | 转载请注明出处】")[0] == 1.0
    assert template_score("and still the river runs to the sea.")[0] == 0.0
    assert template_score("romeo:")[0] < 0  # a speaker label: structure


def test_tinyshakespeare_speaker_names_survive(tmp_path, shared_dir):
    source = shared_dir / "corpora" / "tinyshakespeare" / "input.txt"
    if not source.exists():
        pytest.skip("tinyshakespeare not present")
    from tokenmill.stages.raw import RawSettings, ingest

    ingest(source, tmp_path / "raw", RawSettings(txt_mode="blocks"), workers=1)
    stats = clean_corpus(tmp_path / "raw", tmp_path / "out", CleanSettings(), workers=1)
    stripped = {t["line"] for t in stats.boilerplate["top_lines"]}
    assert not any(line.endswith(":") for line in stripped), stripped
    assert stats.boilerplate["lines_stripped"] <= 30  # at most the stray "3 KING HENRY VI" running heads
    text = "\n".join(r["text"] for shard in record_shards(tmp_path / "out") for r in iter_jsonl(shard))
    assert text.count("ROMEO:") >= 160 and text.count("GLOUCESTER:") >= 220
