"""cleaned_jsonl's repair steps (rules 1-5): mojibake, Unicode forms, control and zero-width characters,
whitespace, surrogates, the examples of what changed."""

import pytest
from support import POEM, PROSE, clean, mojibake

from tokenmill.common.io import (
    REJECTED_FILE,
    iter_jsonl,
)
from tokenmill.stages.clean import CleanSettings, clean_corpus
from tokenmill.stages.clean import repair as R


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
    assert stats.mojibake_repaired == 1


def test_ftfy_is_skipped_only_where_it_changes_nothing():
    """A text of clean lines with "©", "é" or "’" skips ftfy; a mojibake line, an entity or a terminal escape
    among them does not (ftfy fixes line by line: the clean lines around it change nothing)."""
    import ftfy

    clean_lines = ["© 2024 Example Press. All rights reserved.", "Zoë’s résumé — “quoted”.", "plain ASCII", ""]
    for extra in ["", mojibake("Zoë’s résumé"), "Ã mojibake at a line start", "fish &amp; chips", "\x1b[31mred"]:
        text = "\n".join(clean_lines + [extra] + clean_lines)
        fixed = ftfy.fix_text(text, R._ftfy_config())
        assert R.ftfy_leaves_unchanged(text) == (not extra), extra
        assert R.repair_mojibake(text) == (fixed, int(fixed != text)), extra


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
    assert recs[ids[0]]["text"] == PROSE and stats.control_chars_removed == 3
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
    assert stats.surrogates_removed == 4
    assert [r["reason"] for r in iter_jsonl(tmp_path / "out" / REJECTED_FILE)] == ["empty"]
    (tmp_path / "out" / "part-00000.jsonl").read_bytes().decode("utf-8")  # valid UTF-8 on disk


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


def test_special_fields_kept_and_repaired(tmp_path):
    garbled = mojibake("Zoë’s café")
    extra = {0: {"messages": [{"role": "user", "content": garbled}, {"role": "assistant", "content": "fine"}]}}
    ids, recs, _, _ = clean(tmp_path, [PROSE], extra=extra)
    assert recs[ids[0]]["messages"][0] == {"role": "user", "content": "Zoë’s café"}
