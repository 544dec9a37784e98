"""Benchmark decontamination in cleaned_jsonl: word and character n-grams (an evaluation set in Chinese), drop vs
flag, the content-addressed index cache, Parquet and fallback fields, and a missing evaluation file refused first."""

import json

import numpy as np
import pytest
from support import BATCH, clean, materialize_batch

from tokenmill.errors import ConfigError
from tokenmill.stages.clean import CleanSettings, clean_corpus
from tokenmill.stages.clean.decontam import CACHE_DIR, ngram_hashes

QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
POEM = "春眠不觉晓处处闻啼鸟夜来风雨声花落知多少" * 2 + "白日依山尽黄河入海流欲穷千里目更上一层楼" * 2  # 80 characters
OTHER = "An unrelated record about the weather in the mountains, which was cold and windy all week long."


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def eval_file(tmp_path):
    return write_jsonl(tmp_path / "eval.jsonl", [{"text": "filler item without any overlap"}, {"text": QUESTION}])


def test_normalization_ignores_case_punctuation_and_spacing():
    a, _ = ngram_hashes([QUESTION], [None], 13, 50)
    b, _ = ngram_hashes([QUESTION.upper().replace(",", " ;  ").replace(" ", "\n ")], [None], 13, 50)
    assert len(a) == len(QUESTION.split()) - 12 and np.array_equal(a, b)


def test_language_or_script_chooses_words_or_characters():
    _, by_script = ngram_hashes([POEM, QUESTION], [None, None], 13, 50)
    assert np.bincount(by_script).tolist() == [len(POEM) - 49, len(QUESTION.split()) - 12]
    _, as_chinese = ngram_hashes([QUESTION], ["zh"], 13, 50)  # meta.language wins over the script
    assert len(as_chinese) == len("".join(QUESTION.lower().replace(",", "").replace(".", "").split())) - 49
    _, as_cantonese = ngram_hashes([QUESTION], ["yue"], 13, 50)  # dedup's list of unspaced languages, shared
    assert len(as_cantonese) == len(as_chinese)


def test_contaminated_records_are_dropped_with_file_and_item(tmp_path, eval_file):
    texts = [f"Homework: {QUESTION.upper()} How many clips?", OTHER, "clips to 48 of her friends in April"]
    ids, recs, rej, stats = clean(tmp_path, texts, decontaminate=[eval_file], language_id=False)
    assert set(recs) == {ids[1], ids[2]}  # the short fragment shares no 13-word n-gram
    entry = rej[ids[0]]
    assert entry["reason"] == "contamination" and entry["eval_file"] == eval_file and entry["eval_item"] == 1
    assert stats.dropped["contamination"] == 1
    (report,) = stats.decontamination["files"]
    assert report["items"] == 2 and report["items_too_short"] == 1 and report["hits"] == 1
    assert report["cache"] == "built"


def test_chinese_items_match_chinese_records_by_characters(tmp_path):
    items = write_jsonl(tmp_path / "cmmlu.jsonl", [{"question": "无关的问题" * 12}, {"question": "题目：" + POEM}])
    texts = [
        "前言。" + POEM[:30] + "，" + POEM[30:] + "。后记",
        POEM[:45],
        "".join(chr(0x4E00 + 7 * i) for i in range(60)),
    ]
    metas = [{"language": "zh"}, {}, {}]
    ids, recs, rej, stats = clean(tmp_path, texts, metas, decontaminate=[items], language_id=False)
    assert rej[ids[0]]["reason"] == "contamination" and rej[ids[0]]["eval_item"] == 1
    assert set(recs) == {ids[1], ids[2]}  # 45 characters: shorter than one 50-character n-gram


def test_flag_mode_keeps_the_record_with_meta(tmp_path, eval_file):
    texts = [QUESTION, OTHER]
    ids, recs, rej, stats = clean(
        tmp_path, texts, decontaminate=[eval_file], decontaminate_mode="flag", language_id=False
    )
    assert not rej and recs[ids[0]]["meta"]["contamination"] == {"eval_file": eval_file, "eval_item": 1}
    assert "contamination" not in recs[ids[1]]["meta"] and recs[ids[0]]["text"] == QUESTION
    assert stats.flagged_contamination == 1 and stats.dropped["contamination"] == 0


def test_index_is_cached_by_content(tmp_path, eval_file):
    raw_texts = [QUESTION, OTHER]
    *_, first = clean(tmp_path, raw_texts, name="a", decontaminate=[eval_file], language_id=False)
    cached = sorted((tmp_path / CACHE_DIR).glob("*.npy"))
    assert len(cached) == 1 and first.decontamination["files"][0]["cache"] == "built"
    built_at = cached[0].stat().st_mtime_ns
    *_, second = clean(tmp_path, raw_texts, name="b", decontaminate=[eval_file], language_id=False)
    assert second.decontamination["files"][0]["cache"] == "reused" and cached[0].stat().st_mtime_ns == built_at
    index = np.load(cached[0])  # plain arrays: sorted distinct hashes, then items
    assert index.dtype == np.uint64 and np.all(np.diff(index[0].astype(np.float64)) >= 0)
    write_jsonl(tmp_path / "eval.jsonl", [{"text": OTHER}])  # the file changed: a new index
    ids, recs, rej, third = clean(tmp_path, raw_texts, name="c", decontaminate=[eval_file], language_id=False)
    assert (
        third.decontamination["files"][0]["cache"] == "built" and len(list((tmp_path / CACHE_DIR).glob("*.npy"))) == 2
    )
    assert set(rej) == {ids[1]} and rej[ids[1]]["eval_item"] == 0


def test_parquet_evaluation_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.table({"question": ["a filler question", QUESTION], "answer": ["1", "72"]}), path)
    ids, recs, rej, stats = clean(tmp_path, [OTHER, QUESTION], decontaminate=[str(path)], language_id=False)
    assert set(rej) == {ids[1]} and rej[ids[1]]["eval_item"] == 1


def test_same_output_for_any_worker_count(tmp_path, eval_file):
    texts = [f"record {i}: " + (QUESTION if i % 7 == 0 else OTHER) + f" number {i}" for i in range(300)]
    runs = [clean(tmp_path, texts, name=f"w{w}", per_shard=50, workers=w, decontaminate=[eval_file]) for w in (1, 2)]
    files = [
        {
            p.name: p.read_bytes()
            for p in (tmp_path / f"w{w}").iterdir()
            if p.name not in ("_stats.json", "_timings.json")
        }
        for w in (1, 2)
    ]
    assert files[0] == files[1] and runs[0][3].dropped["contamination"] == 43


def test_missing_evaluation_file_is_named_before_any_work(tmp_path, eval_file):
    out = tmp_path / "out"
    (tmp_path / "raw").mkdir()
    with pytest.raises(ConfigError, match="evaluation file not found: .*nope.jsonl"):
        clean_corpus(tmp_path / "raw", out, CleanSettings(decontaminate=[eval_file, str(tmp_path / "nope.jsonl")]))
    assert not out.exists()


def test_bad_evaluation_rows_are_named(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, {"label": 3}])
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: no text field: looked for 'text'.*'label'"):
        clean(tmp_path, [OTHER], decontaminate=[bad], language_id=False)
    (tmp_path / "eval.csv").write_text("question\nwhat?\n")
    with pytest.raises(ConfigError, match=r"not an evaluation file format .*: .*eval.csv"):
        clean(tmp_path, [OTHER], name="csv", decontaminate=[str(tmp_path / "eval.csv")], language_id=False)


def test_launchpad_config_and_metadata_list_each_file(tmp_path, eval_file):
    from assets.clean import cleaned_jsonl
    from assets.raw import raw_records

    source = tmp_path / "source"
    source.mkdir()
    write_jsonl(source / "a.jsonl", [{"text": QUESTION}, {"text": OTHER}])
    config = {"ops": {"cleaned_jsonl": {"config": {"decontaminate": [eval_file], "language_id": False}}}}
    result = materialize_batch([raw_records, cleaned_jsonl], tmp_path / "data", source, config)
    meta = result.asset_materializations_for_node("cleaned_jsonl")[0].metadata
    (row,) = meta["decontamination"].value.records
    assert row.data["file"] == eval_file and row.data["hits"] == 1 and meta["dropped_contamination"].value == 1
    assert (tmp_path / "data" / "cleaned_jsonl" / CACHE_DIR).is_dir()
    assert (tmp_path / "data" / "cleaned_jsonl" / BATCH / "_rejected.jsonl").read_text().count("contamination") == 1
