"""cleaned_jsonl: each rule on planted cases, bad input, conservation, determinism, the boilerplate detector
(frequent genuine lines survive), accuracy on the demo corpus, and the asset."""

import json
import random
from pathlib import Path

import pytest
from support import BATCH, materialize_batch

from tokenmill.common.io import (
    REJECTED_FILE,
    SHARDS_FILE,
    STATS_FILE,
    TIMINGS_FILE,
    dumps,
    iter_jsonl,
    read_json,
    read_stats,
    record_id,
    record_shards,
)
from tokenmill.common.samples import SAMPLE_CHARS, SAMPLES_PER_REASON
from tokenmill.errors import ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill.settings import validate_run_settings
from tokenmill.stages.clean import REASONS, CleanSettings, clean_corpus
from tokenmill.stages.clean import filters as F
from tokenmill.stages.clean import repair as R
from tokenmill.stages.clean.boilerplate import template_score
from tokenmill.stages.clean.metadata import extract_metadata

# ------------------------------------------------------------------------------------------ helpers


def make_raw(folder: Path, texts, metas=None, per_shard=None, extra=None) -> list[str]:
    """Writes texts as raw_records shards (part-XXXXX.jsonl); returns their ids in order."""
    folder.mkdir(parents=True, exist_ok=True)
    per_shard = per_shard or max(1, len(texts))
    ids, lines = [], {}
    for i, text in enumerate(texts):
        rid = record_id("fixture.jsonl", line=i + 1)
        rec = {
            "id": rid,
            "text": text,
            "meta": (metas[i] if metas else {}),
            "source": {"path": "fixture.jsonl", "line": i + 1},
        }
        if extra and i in extra:
            rec.update(extra[i])
        ids.append(rid)
        lines.setdefault(i // per_shard, []).append(dumps(rec))
    for k, ls in lines.items():
        (folder / f"part-{k:05d}.jsonl").write_text("\n".join(ls) + "\n", encoding="utf-8")
    return ids


def clean(tmp_path: Path, texts, metas=None, workers=1, name="out", per_shard=None, extra=None, **settings):
    raw = tmp_path / f"raw-{name}"
    ids = make_raw(raw, texts, metas, per_shard, extra)
    out = tmp_path / name
    stats = clean_corpus(raw, out, CleanSettings(**settings), workers=workers)
    recs = {r["id"]: r for shard in record_shards(out) for r in iter_jsonl(shard)}
    rej = {r["id"]: r for r in iter_jsonl(out / REJECTED_FILE)}
    assert stats["docs_in"] == len(texts) == len(recs) + len(rej)  # conservation, always
    assert read_stats(out) == json.loads(json.dumps(stats))
    return ids, recs, rej, stats


def mojibake(text: str) -> str:
    """UTF-8 bytes read as Windows-1252 (ftfy's sloppy codec maps the 5 undefined bytes too)."""
    import ftfy.bad_codecs  # noqa: F401  registers "sloppy-windows-1252"

    return text.encode("utf-8").decode("sloppy-windows-1252")


POEM = "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。"
JUEJU = "白日依山尽\n黄河入海流\n欲穷千里目\n更上一层楼"  # 20 characters, 4 lines of 5: valid
PROSE = (
    "The committee met on Tuesday to discuss the new budget for the library. Several members asked for more "
    "money for the children's section, and the chair promised a report by the end of the month."
)


# ------------------------------------------------------------------------------------------ rule 1-5: repair


def test_mojibake_is_repaired_and_cjk_punctuation_untouched(tmp_path):
    original = "Zoë’s résumé mentioned a year in Zürich — “an education”, she said."
    garbled = mojibake(original)
    assert garbled != original
    text, n = R.repair_mojibake(garbled)
    assert (text, n) == (original, 1)
    cjk = "“春眠不觉晓，处处闻啼鸟。”（孟浩然）！？：；ＡＢＣ"
    assert R.repair_mojibake(cjk) == (cjk, 0)
    ids, recs, _, stats = clean(tmp_path, [garbled + "\n" + PROSE, cjk + "\n" + POEM])
    assert recs[ids[0]]["text"] == original + "\n" + PROSE
    assert recs[ids[1]]["text"] == cjk + "\n" + POEM  # full-width stays full-width under NFC
    assert stats["mojibake_repaired"] == 1


def test_unicode_normalization_forms(tmp_path):
    decomposed = "Cafe\u0301 ｆｕｌｌｗｉｄｔｈ ﬁne"
    ids, recs, _, _ = clean(tmp_path, [decomposed + " " + PROSE], name="nfc")
    assert recs[ids[0]]["text"] == "Café ｆｕｌｌｗｉｄｔｈ ﬁne " + PROSE
    ids, recs, _, _ = clean(tmp_path, [decomposed + " " + PROSE], name="nfkc", normalization="NFKC")
    assert recs[ids[0]]["text"] == "Café fullwidth fine " + PROSE
    assert R.normalize_unicode(decomposed, "NFC") == "Café ｆｕｌｌｗｉｄｔｈ ﬁne"
    assert R.normalize_unicode(decomposed, "NFKC") == "Café fullwidth fine"
    assert R.normalize_unicode(decomposed, "none") == decomposed
    with pytest.raises(ValueError):
        CleanSettings(normalization="NFD")


def test_control_and_zero_width_characters_removed(tmp_path):
    ids, recs, _, stats = clean(tmp_path, ["\ufeffThe\u200b committee\x00 met" + PROSE[len("The committee met") :]])
    assert recs[ids[0]]["text"] == PROSE and stats["control_chars_removed"] == 3
    text = "\ufeffab\u200bc\x00d\x07e\u202ef\u2060g"
    assert R.strip_control_chars(text) == ("abcdefg", 6)
    emoji = "👩\u200d💻 and فارسی\u200cها"  # joiners carry meaning: kept
    assert R.strip_control_chars(emoji) == (emoji, 0)
    assert R.needs_repair(text)


def test_whitespace_and_line_endings_normalized():
    text = "\n\n  first line   \r\nsecond\u00a0line\t\r\n\r\n\r\n\r\nthird\u3000\rfourth\n\n\n"
    assert R.normalize_whitespace(text) == "  first line\nsecond line\n\nthird\nfourth"
    assert R.normalize_whitespace(" \n \t\n") == ""


def test_inner_space_runs_collapse_outside_code_like_text():
    assert R.normalize_whitespace("two  spaces,   three\n  and more") == "two  spaces,   three\n  and more"
    assert R.normalize_whitespace("two  spaces,   three\n and\t\tone") == "two spaces, three\n and\t\tone"
    assert R.normalize_whitespace("x  = 1\nif x:\n\treturn  x") == "x  = 1\nif x:\n\treturn  x"
    assert R.normalize_whitespace("keep  them", collapse_inner_spaces=False) == "keep  them"


def test_cleaning_collapses_inner_spaces_of_otherwise_clean_text(tmp_path):
    """A text needing no other repair still gets its inner runs collapsed (prepare's whitespace pass)."""
    texts = ["Plain prose with  a double space in it, long enough to be kept.", "def f(x):\n    return  x + 1"]
    settings = {"min_chars": 1, "boilerplate": False, "language_id": False}
    ids, recs, _, _ = clean(tmp_path, texts, **settings)
    assert [recs[i]["text"] for i in ids] == [texts[0].replace("  ", " "), texts[1]]
    ids, recs, _, _ = clean(tmp_path, texts, name="kept", collapse_inner_spaces=False, **settings)
    assert [recs[i]["text"] for i in ids] == texts


def test_invalid_surrogates_do_not_crash(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    # a JSON file as a reader could write it: lone surrogate escapes inside the text and the meta
    lines = [
        '{"id": "a", "text": "good \\ud800text here, long enough\\udfff", "meta": {"title": "t\\ud83d"}, '
        '"source": {"path": "x", "line": 1}}',
        '{"id": "b", "text": "\\ud800\\ud800", "meta": {}, "source": {"path": "x", "line": 2}}',
    ]
    (raw / "part-00000.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    stats = clean_corpus(raw, tmp_path / "out", CleanSettings(), workers=1)
    recs = list(iter_jsonl(tmp_path / "out" / "part-00000.jsonl"))
    assert [r["text"] for r in recs] == ["good text here, long enough"]
    assert recs[0]["meta"]["title"] == "t"
    assert stats["surrogates_removed"] == 4
    assert [r["reason"] for r in iter_jsonl(tmp_path / "out" / REJECTED_FILE)] == ["empty"]
    (tmp_path / "out" / "part-00000.jsonl").read_bytes().decode("utf-8")  # valid UTF-8 on disk


# ------------------------------------------------------------------------------------------ rule 6: metadata


def test_header_metadata_moved_into_meta(tmp_path):
    texts = [
        "Title: The Humble Field\nAuthor: Peter Whitlock\n\n" + PROSE,
        "标题：静夜思\n作者：李白\n朝代：唐\n" + POEM,
        "By Jane Austen\n" + PROSE,
        PROSE + "\nTitle: not a header down here",
        "Title: kept from the reader? no\n" + PROSE,
    ]
    metas = [{}, {}, {}, {}, {"title": "Reader Title"}]
    ids, recs, _, stats = clean(tmp_path, texts, metas, language_id=False)  # meta as the header rules leave it
    assert recs[ids[0]]["meta"] == {"title": "The Humble Field", "author": "Peter Whitlock"}
    assert recs[ids[0]]["text"] == PROSE
    assert recs[ids[1]]["meta"] == {"title": "静夜思", "author": "李白", "dynasty": "唐"}
    assert recs[ids[1]]["text"] == POEM
    assert recs[ids[2]]["meta"] == {"author": "Jane Austen"} and recs[ids[2]]["text"] == PROSE
    assert recs[ids[3]]["text"] == texts[3] and recs[ids[3]]["meta"] == {}
    assert recs[ids[4]]["meta"] == {"title": "Reader Title"} and recs[ids[4]]["text"] == PROSE  # reader wins
    assert stats["docs_meta_extracted"] == 4


def test_reader_title_repeated_in_text_is_dropped():
    text, meta, n = extract_metadata("静夜思\n李白\n" + POEM, {"title": "静夜思", "author": "李白"})
    assert (text, n) == (POEM, 2)
    text, meta, n = extract_metadata(POEM, {"title": "静夜思"})
    assert (text, n) == (POEM, 0)


def test_metadata_extracted_before_boilerplate(tmp_path):
    # "Author: X" header lines sit at the top of every document: the boilerplate detector would take the
    # frequent ones, so extraction must run first and keep them as meta
    texts = [f"Author: Example Writer\nTitle: Poem {i}\n" + PROSE.replace("Tuesday", f"day {i}") for i in range(40)]
    ids, recs, _, stats = clean(tmp_path, texts, bp_min_df=3)
    assert all(r["meta"]["author"] == "Example Writer" for r in recs.values())
    assert recs[ids[7]]["meta"]["title"] == "Poem 7"


# ------------------------------------------------------------------------------------------ rule 8: filters


def test_each_filter_rejects_with_its_reason(tmp_path):
    spam = "\n".join(["Buy cheap watches now!"] * 12)
    texts = [
        "",
        "   \n\t \u3000 ",
        "Hi there",
        "\ufffd\ufffd\ufffd ab\ufffd \u25a1\u25a1\u25a1\u25a1 ?? text \ue000\ue001",
        spam,
        "哈" * 200,
        "a" * 2000,
        JUEJU,
        POEM,
        PROSE,
    ]
    ids, recs, rej, stats = clean(tmp_path, texts, max_chars=1000)
    want = {
        0: "empty",
        1: "empty",
        2: "too_short",
        3: "placeholder_glyphs",
        4: "repetition",
        5: "repetition",
        6: "too_long",
    }
    assert {i: rej[ids[i]]["reason"] for i in want} == want
    assert set(recs) == {ids[7], ids[8], ids[9]}  # a 20-character jueju is valid
    for r in rej.values():  # every drop of these few is among its reason's first: each keeps its text
        assert set(r) == {"id", "source", "reason", "detail", "text", "text_chars"} and r["detail"]
    assert rej[ids[4]]["text"].startswith("Buy cheap watches now!\n") and rej[ids[6]]["text_chars"] == 2000
    assert len(rej[ids[6]]["text"]) == SAMPLE_CHARS + 1  # cut, with an ellipsis
    assert "'Buy cheap watches now!' x 12" in rej[ids[4]]["detail"]  # the rule's evidence
    assert "'哈哈' x 199" in rej[ids[5]]["detail"] and "'\ufffd'" in rej[ids[3]]["detail"]
    assert stats["rejected_by_reason"] == {
        "empty": 2,
        "too_short": 1,
        "placeholder_glyphs": 1,
        "repetition": 2,
        "too_long": 1,
    }
    assert all(f"dropped_{r}" in stats for r in REASONS)


def test_rejected_file_and_stats_keep_a_bounded_sample_per_reason_with_text(tmp_path):
    """The first SAMPLES_PER_REASON drops of each reason in the batch (shard order) keep their text in
    _rejected.jsonl and in the stats; the others are one short line each; the same for any worker count."""
    short = [f"tiny {i}" for i in range(25)]
    spam = ["\n".join([f"Spam line {i}"] * 8) for i in range(3)]
    texts = short[:12] + spam + short[12:] + [PROSE]
    ids, _, rej, stats = clean(tmp_path, texts, per_shard=7)
    _, _, _, stats2 = clean(tmp_path, texts, per_shard=7, workers=2, name="w2")
    assert (tmp_path / "out" / REJECTED_FILE).read_bytes() == (tmp_path / "w2" / REJECTED_FILE).read_bytes()
    assert stats2["rejected_samples"] == stats["rejected_samples"]
    order = [rid for rid in ids if rid in rej]
    with_text = [rid for rid in order if "text" in rej[rid]]
    too_short = [rid for rid in order if rej[rid]["reason"] == "too_short"]
    assert with_text == [rid for rid in order if rid in too_short[:SAMPLES_PER_REASON] or rid not in too_short]
    samples = stats["rejected_samples"]
    assert set(samples) == {"too_short", "repetition"} and len(samples["repetition"]) == 3
    assert samples["too_short"] == [rej[rid] for rid in too_short[:SAMPLES_PER_REASON]]
    assert samples["too_short"][0]["text"] == "tiny 0" and samples["too_short"][0]["text_chars"] == 6
    assert "'Spam line 1' x 8" in samples["repetition"][1]["detail"]


def test_repair_examples_show_what_changed():
    """A record whose text is clean but whose meta was repaired shows the meta before and after (the text alone
    would read the same twice); an invisible repair shows the characters it removed."""
    from tokenmill.stages.clean.report import Examples

    examples = Examples(5)
    old = {"id": "a", "text": PROSE, "meta": {"title": "Tea\u200b time", "author": "Ann"}}
    new = {**old, "meta": {"title": "Tea time", "author": "Ann"}}
    examples.add("repair", new, PROSE, PROSE, old=old)
    examples.add("repair", new, "Zero\u200bwidth " + PROSE, "Zerowidth " + PROSE, old=old)
    meta_only, text = examples.by_kind["repair"]
    assert meta_only["before"] == 'meta.title: "Tea<U+200B> time"' and meta_only["after"] == 'meta.title: "Tea time"'
    assert text["before"].startswith("Zero<U+200B>width") and text["after"].startswith("Zerowidth")


def test_filters_keep_genuine_poetry_with_refrains():
    shijing = (
        "采采芣苡，薄言采之。采采芣苡，薄言有之。\n采采芣苡，薄言掇之。采采芣苡，薄言捋之。\n"
        "采采芣苡，薄言袺之。采采芣苡，薄言襭之。"
    )
    refrain = "式微式微，胡不归？\n微君之故，胡为乎中露！\n式微式微，胡不归？\n微君之躬，胡为乎泥中！"
    limits = CleanSettings().ngram_limits()
    for text in (shijing, refrain, JUEJU, POEM, PROSE):
        assert F.check_repetition(text, 0.4, 0.4, limits) is None, text
    assert F.check_repetition("好好学习 " * 50, 0.4, 0.4, limits)[0] == "repetition"
    assert F.check_placeholder_glyphs("床前明月光，疑是地上□。\n举头望明月，低头思故乡。", 0.1) is None  # one lost char
    assert F.check_placeholder_glyphs("床前□□□，□□□□□。", 0.1)[0] == "placeholder_glyphs"
    assert F.check_placeholder_glyphs("What? Really? Yes.", 0.1) is None
    assert F.check_placeholder_glyphs("Th? qu?ck br?wn f?x j?mps", 0.1)[0] == "placeholder_glyphs"


# ------------------------------------------------------------------------------------------ rule 7: boilerplate


def planted_corpus(n=300, seed=7):
    """Documents of varied length with planted header/footer boilerplate, a frequent genuine line at random
    positions, frequent words, and speaker labels locked at the top (genuine structure)."""
    rng = random.Random(seed)
    words = (
        "river moon spring wind mountain Transformer attention cloud lantern bridge willow harbor "
        "春 月 风 花 雪 山 水 云"
    ).split()
    header = "Copyright © 2024 Example Press | All rights reserved"
    footer = "Read more at https://example.com/poems"
    cn_header = "【本文来自网络 | 转载请注明出处】"
    genuine = "And still the river runs to the sea."
    speakers = ["ROMEO:", "JULIET:", "FIRST CITIZEN:", "NURSE:"]
    docs, planted, genuine_docs = [], {}, []
    for i in range(n):
        body = [
            " ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + f" {i}." for _ in range(rng.randint(2, 12))
        ]
        if i % 5 == 0:
            body.insert(rng.randint(0, len(body)), genuine)
            genuine_docs.append(i)
        if i % 7 == 3:
            body.insert(0, rng.choice(speakers))
        lines = list(body)
        plant = []
        if i % 6 == 0:
            lines.insert(0, header)
            plant.append(header)
        if i % 6 == 1:
            lines.append(footer)
            plant.append(footer)
        if i % 6 == 2:
            lines.insert(0, cn_header)
            plant.append(cn_header)
        planted[i] = plant
        docs.append("\n".join(lines))
    return docs, planted, genuine_docs, genuine, speakers


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
    bp = stats["boilerplate"]
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
    assert stats["boilerplate"]["lines_stripped"] == 0
    assert sum(line in r["text"] for r in recs.values()) == 100


def test_boilerplate_can_be_disabled(tmp_path):
    docs, planted, *_ = planted_corpus(120)
    ids, recs, _, stats = clean(tmp_path, docs, boilerplate=False)
    assert [recs[i]["text"] for i in ids] == docs
    assert stats["boilerplate"]["lines_stripped"] == 0


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
    stripped = {t["line"] for t in stats["boilerplate"]["top_lines"]}
    assert not any(line.endswith(":") for line in stripped), stripped
    assert stats["boilerplate"]["lines_stripped"] <= 30  # at most the stray "3 KING HENRY VI" running heads
    text = "\n".join(r["text"] for shard in record_shards(tmp_path / "out") for r in iter_jsonl(shard))
    assert text.count("ROMEO:") >= 160 and text.count("GLOUCESTER:") >= 220


# ------------------------------------------------------------------------------------------ bad input, invariants


def test_bad_input_never_crashes(tmp_path):
    huge = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 190_000)[:10_500_000]
    mixed = "Ελληνικά русский текст العربية हिन्दी 日本語のテキスト 한국어 텍스트 emoji 👩\u200d💻 " * 3
    texts = [huge, mixed, " \n\t\r\n ", None, 12345, "ok " * 10]
    ids, recs, rej, stats = clean(tmp_path, texts)
    assert rej[ids[0]]["reason"] == "too_long"
    assert recs[ids[1]]["text"] == mixed.strip()
    assert rej[ids[2]]["reason"] == "empty" and rej[ids[3]]["reason"] == "empty"
    assert rej[ids[4]]["reason"] == "too_short"  # a number as text: "12345"


def test_huge_text_without_length_guard(tmp_path):
    words = [f"w{i}" for i in range(5000)]
    rng = random.Random(1)
    huge = "\n".join(" ".join(rng.choice(words) for _ in range(20)) for _ in range(90_000))  # ~10.4 MB
    assert len(huge) > 10_000_000
    ids, recs, rej, _ = clean(tmp_path, [huge, PROSE], max_chars=0)
    assert recs[ids[0]]["text"] == huge


def test_special_fields_kept_and_repaired(tmp_path):
    garbled = mojibake("Zoë’s café")
    extra = {0: {"messages": [{"role": "user", "content": garbled}, {"role": "assistant", "content": "fine"}]}}
    ids, recs, _, _ = clean(tmp_path, [PROSE], extra=extra)
    assert recs[ids[0]]["messages"][0] == {"role": "user", "content": "Zoë’s café"}


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
    volatile = ("seconds", "rule_seconds", "rule_time_share", "pass_seconds", "workers")
    assert {k: v for k, v in s1.items() if k not in volatile} == {k: v for k, v in s2.items() if k not in volatile}


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
    assert sum(stats["length_hist_before"]) == stats["docs_in"]
    assert sum(stats["length_hist_after"]) == stats["docs_out"]
    assert len(stats["length_buckets"]) == len(stats["length_hist_after"])
    assert stats["chars_out"] < stats["chars_in"]
    kinds = {e["kind"] for e in stats["examples"]}
    assert {"boilerplate", "metadata"} <= kinds
    assert all(len(e["before"]) <= 200 for e in stats["examples"])
    assert set(stats["rule_time_share"]) >= {"repair_mojibake", "strip_boilerplate", "filter_repetition"}
    assert abs(sum(stats["rule_time_share"].values()) - 1) < 0.01


# ------------------------------------------------------------------------------------------ demo corpus accuracy


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
    assert stats["docs_in"] == demo_manifest["records"] == len(out) + len(rej)

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


# ------------------------------------------------------------------------------------------ the asset


def test_cleaned_jsonl_asset(demo_source, tmp_path):
    from assets.clean import cleaned_jsonl
    from assets.raw import raw_records

    result = materialize_batch([raw_records, cleaned_jsonl], tmp_path / "data", demo_source)
    assert result.success
    meta = result.asset_materializations_for_node("cleaned_jsonl")[0].metadata
    stats = read_json(tmp_path / "data" / "cleaned_jsonl" / BATCH / STATS_FILE)
    assert meta["docs_in"].value == stats["docs_in"]
    assert meta["docs_out"].value == stats["docs_out"] == stats["docs_in"] - stats["rejected"]
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
    assert s1["dropped_by_language"] == s2["dropped_by_language"] == want
    assert list(s1["dropped_by_language"]) == ["de", "fr", "und", "zh"]  # most drops first, then by code
    assert sum(n for reasons in want.values() for n in reasons.values()) == s1["rejected"] == len(rej)
