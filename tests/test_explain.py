"""`tokenmill explain`: every record's fate through a two-batch graph run (a raw drop, a clean drop, exact and near
duplicates within a batch and of the earlier batch, a kept record, an unknown id), and what deduped_jsonl shows."""

import json
from pathlib import Path

import pytest
from support import two_batch_graph

from assets.metadata import removed_samples_table
from cli import main
from tokenmill.common.io import record_id
from tokenmill.explain import explain, render, word_diff

FIRST, SECOND = "g1-b000001", "g1-b000002"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """a.jsonl: 40 records, an exact copy of its record 1 (line 41), a near copy of record 2 (42), a line that is
    not JSON (43), a too-short text (44); then b.jsonl: 40 records, exact and near copies of a.jsonl's 3 and 4."""
    return two_batch_graph(tmp_path_factory.mktemp("explain"))


def cli(data: Path, key: str, capsys) -> tuple[int, str, str]:
    rc = main(["explain", key, "--data", str(data)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_record_raw_records_dropped_is_named_by_its_file_and_line_or_id(graph, capsys):
    data, _ = graph
    fate = explain(data, "a.jsonl:43")
    assert (fate["stage"], fate["reason"], fate["batch"]) == ("raw_records", "malformed_json", FIRST)
    assert fate["id"] == record_id("a.jsonl", line=43) and fate["text"] == '{"text": "cut'
    rc, out, _ = cli(data, record_id("a.jsonl", line=43), capsys)
    assert rc == 0 and "dropped by  raw_records batch g1-b000001" in out and "source      a.jsonl:43" in out


def test_a_record_the_clean_stage_dropped_shows_the_rule_its_measure_and_threshold(graph, capsys):
    data, _ = graph
    rc, out, _ = cli(data, record_id("a.jsonl", line=44), capsys)
    assert rc == 0
    assert "dropped by  cleaned_jsonl batch g1-b000001" in out and "reason      too_short" in out
    assert "detail      5 chars < min_chars 10" in out and out.rstrip().endswith("short")


def test_an_exact_duplicate_names_the_kept_record_with_both_sources_and_texts(graph):
    data, first = graph
    fate = explain(data, "a.jsonl:41")
    assert (fate["stage"], fate["level"], fate["similarity"], fate["diff"]) == ("deduped_jsonl", "exact", 1.0, "")
    kept = fate["duplicate_of"]
    assert (kept["id"], kept["source"], kept["role"]) == (
        record_id("a.jsonl", line=1),
        {"path": "a.jsonl", "line": 1},
        "kept",
    )
    assert fate["text"] == kept["text"] == first[0]
    assert fate["cluster"]["keep_reason"] and fate["cluster"]["file"] == f"dedup_report/{FIRST}/clusters.jsonl"


def test_a_near_duplicate_shows_a_word_diff_the_similarity_and_the_threshold(graph, capsys):
    data, first = graph
    rc, out, _ = cli(data, "a.jsonl:42", capsys)
    fate = explain(data, "a.jsonl:42")
    assert fate["level"] == "near" and fate["similarity"] < 1.0 and fate["threshold"] == 0.8
    assert fate["duplicate_of"]["text"] == first[1] and fate["text"] == first[1][:-3] + "zz"
    assert fate["diff"].endswith("{+" + fate["text"].split()[-1] + "+}")
    assert rc == 0 and "kept -> this record" in out and "source a.jsonl:2" in out and f"threshold {0.8}" in out
    assert out.count(first[1][:60]) == 2  # both texts in full


def test_a_chained_near_duplicate_says_it_is_below_the_threshold_through_its_cluster(graph):
    data, _ = graph
    fate = explain(data, "a.jsonl:42")
    assert "through others of its cluster" not in render(fate)
    assert "threshold 0.8: joined to the kept record through others of its cluster" in render(
        {**fate, "similarity": 0.7}
    )


def test_a_duplicate_of_an_earlier_batch_shows_the_indexed_records_text_and_source(graph):
    data, first = graph
    exact, near = explain(data, "b.jsonl:41"), explain(data, "b.jsonl:42")
    for fate, original, line in ((exact, first[2], 3), (near, first[3], 4)):
        kept = fate["duplicate_of"]
        assert (fate["batch"], kept["batch"], kept["role"]) == (SECOND, FIRST, "indexed")
        assert kept["source"] == {"path": "a.jsonl", "line": line} and kept["text"] == original
        assert fate["cluster"]["keep_reason"] == "kept by an earlier batch"


def test_a_kept_record_says_where_it_is(graph, capsys):
    data, first = graph
    fate = explain(data, "a.jsonl:5")
    assert fate["fate"] == "kept" and fate["text"] == first[4]
    rc, out, _ = cli(data, "a.jsonl:5", capsys)
    assert rc == 0 and "kept        tokenized_bins" in out and f"deduped_jsonl batch {FIRST}" in out


def test_an_unknown_id_is_one_line_and_exit_2(graph, capsys):
    data, _ = graph
    rc, out, err = cli(data, "0123456789abcdef", capsys)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and "no record 0123456789abcdef" in err


def test_removed_records_keep_their_text_and_the_samples_show_the_indexed_record(graph):
    data, first = graph
    for batch in (FIRST, SECOND):
        removed = [json.loads(line) for line in (data / "deduped_jsonl" / batch / "removed.jsonl").open()]
        assert removed and all(e["text"] and e["text_chars"] == len(e["text"]) for e in removed)
    report = json.loads((data / "dedup_report" / SECOND / "report.json").read_text())
    rows = removed_samples_table(report["samples"]).records()
    indexed = [r for r in rows if r["role"] == "indexed"]
    assert indexed and all(r["text"] and r["record"].startswith("a.jsonl:") and r["keep reason"] for r in indexed)
    near = next(r for r in rows if r["level"] == "near")
    assert near["id"] and near["record"] == "b.jsonl:42" and "{+" in near["diff"]


def test_word_diff_marks_only_the_change_with_context_and_characters_for_unspaced_text():
    before = " ".join(f"w{i}" for i in range(30))
    assert word_diff(before, before.replace("w15", "x")) == "… w11 w12 w13 w14 [-w15-] {+x+} w16 w17 w18 w19 …"
    assert word_diff("床前明月光疑是地上霜", "床前明月光疑是地下霜") == "…光疑是地[-上-]{+下+}霜"
    assert word_diff(before, before) == ""
