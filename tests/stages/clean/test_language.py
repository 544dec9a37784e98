"""Language identification in cleaned_jsonl (meta.language, meta.language_score), the `language` rule, dedup's
shingle unit following meta.language, the per-language figures, and the curated corpora unchanged by all of it."""

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError
from support import BATCH, clean, published_files

from tests.conftest import REPO
from tokenmill.common import text_keys
from tokenmill.common.io import dumps
from tokenmill.errors import ConfigError
from tokenmill.settings import validate_run_settings
from tokenmill.stages.clean import CleanSettings
from tokenmill.stages.clean.language import (
    LANGUAGE_CHARS,
    identify_languages,
    language_labels,
    with_language,
    with_language_line,
)

# real sentences of lingua-py's test set (Leipzig corpora, Apache-2.0): benchmarks/data/langid-sentences
SENTENCES = REPO / "benchmarks" / "data" / "langid-sentences"
FIXTURE_LANGUAGES = ("zh", "ja", "ar", "ru", "en", "de", "hi")
META_FIELDS = ("language", "language_score")


def sentences(code: str, n: int = 20) -> list[str]:
    return (SENTENCES / f"{code}.txt").read_text(encoding="utf-8").splitlines()[:n]


def document(code: str, chars: int = 400) -> str:
    """Sentences of one language joined until `chars` characters (a web page's paragraph, not a tweet)."""
    out = []
    for s in sentences(code, 100):
        out.append(s)
        if sum(map(len, out)) >= chars:
            break
    return " ".join(out)


def test_identifies_real_sentences_of_each_language():
    for code in FIXTURE_LANGUAGES:
        found = identify_languages(sentences(code))
        assert sum(c == code for c, _ in found) >= 18, (code, found)
        assert all(0.0 <= s <= 1.0 and round(s, 2) == s for _, s in found)
    assert identify_languages([document(code) for code in FIXTURE_LANGUAGES]) == [
        (code, pytest.approx(1.0, abs=0.1)) for code in FIXTURE_LANGUAGES
    ]


def test_identification_reads_a_bounded_prefix_and_is_repeatable():
    german, english = document("de", LANGUAGE_CHARS), document("en", 5 * LANGUAGE_CHARS)
    (first,) = identify_languages([german[:LANGUAGE_CHARS] + english])
    assert first == identify_languages([german[:LANGUAGE_CHARS]])[0] and first[0] == "de"
    texts = sentences("ja", 5) + ["", "12345 !!!", "\x00\x01 control\ud800"]
    assert identify_languages(texts) == identify_languages(texts)


def test_language_fields_spliced_into_the_line_as_encoding_would_write_them():
    source = {"path": 'a "b".json', "index": 3}
    records = [
        {"id": "1", "text": 'x "source": y', "meta": {"title": "静夜思", "n": {"source": 1}}, "source": source},
        {"id": "2", "text": "t", "meta": {}, "source": source},
        {"id": "3", "text": "t", "meta": {"language": "xx"}, "source": source},  # replaced in place
        {"id": "4", "text": "t", "meta": {}, "source": source, "messages": []},  # a field after source
        {"id": "5", "text": "t", "meta": None, "source": source},
        {"text": "t", "id": "6", "meta": {}, "source": source},  # another order
    ]
    for rec in records:
        line = dumps(rec).encode()
        for score in (0.97, 1.0, 0.0):
            assert with_language_line(line, rec, "zh", score) == dumps(with_language(rec, "zh", score)).encode()


def test_every_kept_record_gets_its_language(tmp_path):
    texts = [document(code) for code in FIXTURE_LANGUAGES]
    ids, recs, rej, stats = clean(tmp_path, texts, [{"title": "t"}] * len(texts))
    assert not rej
    for rid, code in zip(ids, FIXTURE_LANGUAGES):
        meta = recs[rid]["meta"]
        assert list(meta) == ["title", *META_FIELDS] and meta["language"] == code, meta
        assert 0.5 < meta["language_score"] <= 1.0
    assert stats.dropped["language"] == 0
    assert stats.languages == {
        code: {"records": 1, "chars": len(recs[rid]["text"])} for rid, code in zip(ids, FIXTURE_LANGUAGES)
    }
    assert stats.rule_seconds["identify_language"] >= 0


def test_languages_and_min_language_score_reject_with_evidence(tmp_path):
    en, de, zh = document("en"), document("de"), document("zh")
    mixed = sentences("en", 1)[0] + " " + sentences("de", 1)[0]  # two languages: a lower score
    (_, mixed_score), (_, en_score) = identify_languages([mixed, en])
    assert mixed_score < en_score
    threshold = round((mixed_score + en_score) / 2, 2)
    ids, recs, rej, stats = clean(tmp_path, [en, de, zh, mixed], languages=["en", "de"], min_language_score=threshold)
    assert set(recs) == {ids[0], ids[1]}
    zh_entry, mixed_entry = rej[ids[2]], rej[ids[3]]
    assert zh_entry["reason"] == mixed_entry["reason"] == "language"
    assert zh_entry["language"] == "zh" and 0 < zh_entry["language_score"] <= 1
    assert "language zh" in zh_entry["detail"] and "not in languages ['de', 'en']" in zh_entry["detail"]
    assert mixed_entry["language_score"] == mixed_score < threshold
    assert f"< min_language_score {threshold}" in mixed_entry["detail"]
    assert stats.dropped["language"] == 2 and stats.rejected_by_reason["language"] == 2
    assert set(stats.languages) == {"en", "de"}


def test_language_identification_off_leaves_meta_alone(tmp_path):
    ids, recs, _, stats = clean(tmp_path, [document("en")], [{"author": "a"}], language_id=False)
    assert recs[ids[0]]["meta"] == {"author": "a"} and stats.languages is None


def test_language_settings_are_validated():
    with pytest.raises(ValidationError, match=r"unknown language codes \['english', 'xx'\]: use ISO 639-1"):
        CleanSettings(languages=["en", "xx", "english"])
    with pytest.raises(ValidationError, match="need language_id on"):
        CleanSettings(language_id=False, languages=["en"])
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        CleanSettings(min_language_score=1.5)
    with pytest.raises(ConfigError, match=r"cleaned_jsonl\.languages: unknown language codes \['eng'\]"):
        validate_run_settings({"ops": {"cleaned_jsonl": {"config": {"languages": ["eng"]}}}})
    assert {"en", "zh", "ja", "ar", "ru", "de", "hi", "yue", "haw"} <= language_labels()
    assert CleanSettings(languages=["en", "yue"]).languages == ["en", "yue"]


def test_shingle_unit_follows_meta_language():
    poem, prose, korean = (
        "床前明月光 疑是地上霜",
        "the quick brown fox jumps over the lazy dog",
        "나는 학교에 간다 오늘",
    )
    keys = [text_keys.dedup_key(t, spaced=True) for t in (poem, prose, korean, poem, prose, poem, prose, poem, "")]
    languages = [None, None, "ko", "ko", "ja", "zh-Hans", "zxx", 7, "en"]
    # without meta.language the script decides; with it the language does (Korean: words, even for Han text)
    assert text_keys.by_words(keys).tolist() == [False, True, True, False, True, False, True, False, False]
    assert text_keys.by_words(keys, languages).tolist() == [False, True, True, True, False, False, True, False, False]


# ---------------------------------------------------------------------------------------------------------------
# Curated corpora: unchanged by language identification, but for the new meta fields and metadata entries
# ---------------------------------------------------------------------------------------------------------------

POETRY_FILES = ("全唐诗/poet.tang.0.json", "全唐诗/poet.tang.1000.json", "宋词/ci.song.0.json", "诗经/shijing.json")
# run statistics: they differ between any two runs (seconds) and gained per-language entries (languages,
# dropped_language, identify_language seconds; the funnel's table and chart; tokenized_bins' per-batch totals)
RUN_STATISTICS = ("_stats.json", "funnel.json", "funnel.svg", "tokenized_bins/_batches/")
# what may differ in the other JSON files: the record files' sizes, offsets and CRCs (their meta grew), and the
# dedup report's quality estimate (its sample is drawn from the records as written, meta included)
SIZE_KEYS = frozenset({"bytes", "start", "end", "corpus_bytes", "crc32", "quality"})


def _graph(source: Path, data: Path, language_id: bool) -> None:
    import dagster as dg

    from definitions import build_defs
    from resources import CorpusSource, DataRoot
    from tokenmill.batches import register_new_files
    from tokenmill.stages.raw.discover import source_state

    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
    data.mkdir(parents=True)
    register_new_files(data.resolve(), source.resolve(), source_state(source.resolve(), exclude=data.resolve()))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source_batch", [BATCH])
        config = {"ops": {"cleaned_jsonl": {"config": {"language_id": language_id}}}}
        job = defs.resolve_job_def("tokenmill_all")
        assert job.execute_in_process(run_config=config, instance=instance, partition_key=BATCH).success


def _without_language(line: bytes) -> dict:
    rec = json.loads(line)
    if isinstance(rec.get("meta"), dict):
        for k in META_FIELDS:
            rec["meta"].pop(k, None)
    return rec


def _without_sizes(value):
    if isinstance(value, dict):
        return {k: _without_sizes(v) for k, v in value.items() if k not in SIZE_KEYS}
    if isinstance(value, list):
        return [_without_sizes(v) for v in value]
    return value


@pytest.fixture(scope="module")
def curated(shared_dir, demo_source, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("curated")
    poetry = root / "chinese-poetry"
    for name in POETRY_FILES:
        (poetry / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared_dir / "corpora" / "chinese-poetry" / name, poetry / name)
    shakespeare = root / "tinyshakespeare"
    shakespeare.mkdir()
    shutil.copy(shared_dir / "corpora" / "tinyshakespeare" / "input.txt", shakespeare / "input.txt")
    return {"chinese-poetry": poetry, "tinyshakespeare": shakespeare, "demo": demo_source}


@pytest.mark.parametrize("corpus", ["chinese-poetry", "tinyshakespeare", "demo"])
def test_curated_corpus_comes_out_unchanged_but_its_meta_language(corpus, curated, tmp_path):
    _graph(curated[corpus], tmp_path / "off", language_id=False)
    _graph(curated[corpus], tmp_path / "on", language_id=True)
    off, on = published_files(tmp_path / "off"), published_files(tmp_path / "on")
    assert off.keys() == on.keys()
    tagged = 0
    for name, before in off.items():
        after = on[name]
        if name.endswith(".jsonl"):  # records (and rejected or removed entries): equal but for meta.language*
            assert [_without_language(x) for x in before.splitlines()] == [
                _without_language(x) for x in after.splitlines()
            ], name
            tagged += after.count(b'"language_score": ')
        elif name.endswith(".json") and not any(part in name for part in RUN_STATISTICS):
            assert _without_sizes(json.loads(before)) == _without_sizes(json.loads(after)), name
        elif not any(part in name for part in RUN_STATISTICS):  # token shards, tokenizer, dedup index, exports
            assert before == after, name
    assert tagged  # the identification ran
    languages = json.loads(on["funnel_telemetry/funnel.json"])["languages"]
    dominant = {"chinese-poetry": "zh", "tinyshakespeare": "en", "demo": None}[corpus]
    assert dominant is None or languages[0]["language"] == dominant
    assert (
        sum(r["records_tokenized"] for r in languages)
        == json.loads(on["funnel_telemetry/funnel.json"])["stages"][-1]["docs_out"]
    )
    assert sum(r["tokens"] for r in languages) == json.loads(on["funnel_telemetry/funnel.json"])["tokens"]["total"]
    cleaned = json.loads(on[f"cleaned_jsonl/{BATCH}/_stats.json"])["languages"]
    assert {k: v["records"] for k, v in cleaned.items()} == {r["language"]: r["records_cleaned"] for r in languages}
    assert json.loads(off["funnel_telemetry/funnel.json"])["languages"] == []


def test_full_curated_corpora_keep_their_shingle_unit(shared_dir, demo_source, tmp_path):
    """Over every record of chinese-poetry, tinyshakespeare and the demo corpus: the shingle unit dedup takes from
    meta.language is the one the script gave before (characters for the poems, words for English)."""
    from tokenmill.common.io import iter_jsonl, record_shards
    from tokenmill.stages.clean import clean_corpus
    from tokenmill.stages.raw import ingest

    for source in (shared_dir / "corpora" / "chinese-poetry", shared_dir / "corpora" / "tinyshakespeare", demo_source):
        raw, out = tmp_path / source.name / "raw", tmp_path / source.name / "clean"
        ingest(source, raw)
        clean_corpus(raw, out)
        recs = [r for shard in record_shards(out) for r in iter_jsonl(shard)]
        keys = text_keys.dedup_keys([r["text"] for r in recs], spaced=True)
        by_language = text_keys.by_words(keys, [r["meta"]["language"] for r in recs])
        changed = [
            (r["meta"]["language"], r["text"][:40])
            for r, a, b in zip(recs, text_keys.by_words(keys), by_language)
            if a != b
        ]
        assert not changed, (source.name, len(changed), changed[:5])
