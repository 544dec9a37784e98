"""The web quality rules: each just inside and just outside its threshold, the profiles, curated corpora
unchanged under 'auto', the settings' bounds."""

import json
import random
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from tokenmill.stages.clean import CleanSettings, clean_corpus
from tokenmill.stages.clean.quality import QualitySettings, choose_profile, web_verdict
from tokenmill.stages.clean.quality import rules as R
from tokenmill.stages.clean.quality.text import TOKEN_RE, TOKEN_RULES, Doc, detect_script_language, tokenize

S = QualitySettings()
PROSE = "The quick brown fox jumps over the lazy dog and that is all with him."  # 15 words, 2 stop words+


def check(rule, text: str, language: str = "en", **settings):
    return rule(Doc(text, language), QualitySettings(**settings))


def words(n: int, word: str = "word") -> str:
    return " ".join([word] * n)


def test_tokens_split_punctuation_and_contractions():
    assert TOKEN_RE.findall("I don't know, it's 3.5% of $1,000 (approx.)... U.S. e-mail") == [
        "I", "do", "n't", "know", ",", "it", "'s", "3.5", "%", "of", "$", "1,000", "(", "approx.", ")", "...",
        "U.S.", "e", "-", "mail",
    ]  # fmt: skip


def test_gopher_word_count_bounds():
    assert check(R.gopher_word_count, words(50)) is None
    bad = check(R.gopher_word_count, words(49))
    assert (bad.rule, bad.value, bad.threshold) == ("gopher_word_count", 49, 50)
    assert check(R.gopher_word_count, words(11), gopher_min_words=0, gopher_max_words=11) is None
    assert check(R.gopher_word_count, words(12), gopher_min_words=0, gopher_max_words=11).value == 12


def test_gopher_mean_word_length():
    assert check(R.gopher_mean_word_length, "abc abc") is None
    assert check(R.gopher_mean_word_length, "abc ab").rule == "gopher_mean_word_length"  # 2.5 < 3
    assert check(R.gopher_mean_word_length, "abcdefghij") is None
    assert check(R.gopher_mean_word_length, "abcdefghijk").value == 11


def test_gopher_symbol_ratio():
    assert check(R.gopher_symbol_ratio, words(9) + " #") is None  # 1 '#' / 11 tokens ('#' is one)
    assert check(R.gopher_symbol_ratio, words(8) + " # #").rule == "gopher_symbol_ratio"  # 2 / 10 > 0.1
    assert check(R.gopher_symbol_ratio, words(8) + " ... ...").rule == "gopher_symbol_ratio"


def test_gopher_bullet_and_ellipsis_lines():
    lines = ["- item"] * 9 + ["text"]
    assert check(R.gopher_bullet_lines, "\n".join(lines)) is None  # 0.9 is not above 0.9
    assert check(R.gopher_bullet_lines, "\n".join(["- item"] * 10)).value == 1.0
    assert check(R.gopher_ellipsis_lines, "\n".join(["more..."] * 3 + ["text."] * 7)) is None
    bad = check(R.gopher_ellipsis_lines, "\n".join(["more…"] * 4 + ["text."] * 6))
    assert (bad.rule, bad.value, bad.threshold) == ("gopher_ellipsis_lines", 0.4, 0.3)


def test_gopher_alpha_words():
    assert check(R.gopher_alpha_words, words(8) + " 1 2") is None  # 8 / 10 = 0.8
    assert check(R.gopher_alpha_words, words(7) + " 1 2 3").value == pytest.approx(0.7)


def test_gopher_stop_words_per_language_and_case():
    assert check(R.gopher_stop_words, "The cat and a dog") is None  # 'the' counted lower-cased
    assert check(R.gopher_stop_words, "A cat and a dog").value == 1
    assert check(R.gopher_stop_words, "Der Hund und die Katze", "de") is None
    assert check(R.gopher_stop_words, "Der Hund", "de").rule == "gopher_stop_words"
    assert check(R.gopher_stop_words, "犬と猫", "ko") is None  # no list for Korean: off


def test_gopher_line_and_paragraph_repetition():
    unique = [f"line number {i} here" for i in range(7)]
    text = "\n".join(unique + unique[:3])
    assert check(R.gopher_line_repetition, text, gopher_max_dup_line_char_frac=1) is None  # 3 / 10 = 0.3
    bad = check(R.gopher_line_repetition, "\n".join(unique[:6] + unique[:4]), gopher_max_dup_line_char_frac=1)
    assert (bad.rule, bad.value) == ("gopher_dup_lines", 0.4)
    paragraphs = "\n\n".join([f"paragraph {i} with some words" for i in range(3)] + ["paragraph 0 with some words"])
    bad = check(R.gopher_paragraph_repetition, paragraphs, gopher_max_dup_para_frac=0.2)
    assert bad.rule == "gopher_dup_paragraphs" and "paragraph 0" in bad.detail


def _hard_texts(n: int) -> list[str]:
    """Texts built from the tokenizer rules' hard cases (contractions, can|not, initials, numbers, quotes, hyphens,
    every kind of space)."""
    pieces = list("aAnNtT.,:;-–~/'’\"()[]«»“”$%&#*_é中1 \n\t\u00a0") + [
        "can", "not", "Cannot", "gonna", "wan", "na", "gim", "me", "n't", "'s", "U.S.", "...", "3.5", "e-mail",
    ]  # fmt: skip
    rng = random.Random(7)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def test_the_letter_run_shortcut_cuts_as_the_rules_alone():
    """TOKEN_RE tries a shortcut before the rules; on the hard cases the tokens must be the rules' own."""
    rules = re.compile(TOKEN_RULES)
    for text in _hard_texts(20_000):
        assert TOKEN_RE.findall(text) == rules.findall(text), text


def test_tokenize_is_token_re_with_a_word_in_every_piece():
    """tokenize steps over whitespace runs and must cut as TOKEN_RE; fineweb_list_like counts on every
    whitespace-separated piece holding a word."""
    for text in _hard_texts(20_000):
        words = tokenize(text)
        assert words == TOKEN_RE.findall(text), text
        assert len(words) >= len(text.split()), text


def _scanned_repeats(words: list[str], n: int, budget: float) -> tuple[int, int | None]:
    """datatrove's find_all_duplicate, plainly: left to right, jump n words past a repeated n-gram; the
    characters counted when they first pass `budget` (or in all), and the first repeat's position."""
    seen, chars, i, first = set(), 0, 0, None
    while i <= len(words) - n:
        gram = "".join(words[i : i + n])
        if gram in seen:
            chars, first, i = chars + len(gram), i if first is None else first, i + n
            if chars > budget:
                break
        else:
            seen.add(gram)
            i += 1
    return chars, first


def test_dup_ngrams_measure_what_a_plain_scan_measures():
    rng = random.Random(3)
    limit = 0.15
    for _ in range(300):
        vocab = [f"w{i}" for i in range(rng.randint(3, 40))]
        text = " ".join(rng.choice(vocab) for _ in range(rng.randint(10, 300)))
        bad = check(R.gopher_dup_ngrams, text, **{f"gopher_max_dup_{n}gram_char_frac": limit for n in range(5, 11)})
        doc = Doc(text, "en")
        for n in range(5, 11):
            chars, first = _scanned_repeats(doc.words, n, limit * len(text))
            if chars > limit * len(text):
                assert bad is not None and bad.value == pytest.approx(chars / len(text)), text
                assert f"{n}-grams" in bad.detail and " ".join(doc.words[first : first + n]) in bad.detail
                break
        else:
            assert bad is None, text


def test_ngram_ids_are_equal_exactly_for_equal_ngrams():
    """Each width's ids are dense (0 .. distinct - 1), equal for equal n-grams and only for them, also past the
    width from which no n-gram repeats (ids there are positions)."""
    rng = random.Random(3)
    for _ in range(300):
        text = " ".join(rng.choice("a b c d e".split()) for _ in range(rng.randint(1, 40)))
        doc = Doc(text, "en")
        for n in range(1, 12):
            grams = [tuple(doc.words[i : i + n]) for i in range(len(doc.words) - n + 1)]
            ids = doc.ngram_ids(n).tolist()
            index = {g: i for i, g in enumerate(dict.fromkeys(grams))}
            assert len(ids) == len(grams) and sorted(set(ids)) == list(range(len(index)))
            assert len({(g, i) for g, i in zip(grams, ids)}) == len(index), (text, n)


def test_gopher_top_and_dup_ngrams():
    text = " ".join(f"w{i}" for i in range(100))
    assert check(R.gopher_top_ngrams, text) is None and check(R.gopher_dup_ngrams, text) is None
    spam = " ".join(["buy cheap pills now"] * 30)
    assert check(R.gopher_top_ngrams, spam).rule == "gopher_top_ngram"
    assert check(R.gopher_dup_ngrams, spam).rule == "gopher_dup_ngram"


def test_c4_lines_and_documents():
    keep = ". ".join(["This is a sentence"] * 5) + "."
    js = "Please enable JavaScript to view this page."
    result = R.c4_filter(Doc(f"{keep}\nShort line\n{js}\nRead our privacy policy here.", "en"), S)
    assert result.reject is None and result.text == keep
    assert result.removed == {"too_few_words": 1, "javascript": 1, "policy": 1}
    four = ". ".join(["This is a sentence"] * 4) + "."
    assert R.c4_filter(Doc(four, "en"), S).reject.rule == "c4_too_few_sentences"
    assert R.c4_filter(Doc(keep + "\nLorem ipsum dolor sit amet.", "en"), S).reject.rule == "c4_lorem_ipsum"
    assert R.c4_filter(Doc(keep + "\nvar x = {a: 1};", "en"), S).reject.rule == "c4_curly_bracket"
    lines = R.c4_filter(Doc(keep + "\nno punctuation at the end", "en"), QualitySettings(c4_terminal_punct="lines"))
    assert lines.removed == {"no_terminal_punct": 1}
    doc = R.c4_filter(Doc(keep + "\nno punctuation at the end", "en"), QualitySettings(c4_terminal_punct="document"))
    assert doc.reject.rule == "c4_no_terminal_punct"


@pytest.mark.parametrize(
    ("line", "sentences"),
    [
        ("One. Two! Three? Four.", 4),
        ('He said "stop." Then he left.', 2),  # the closing quote stays with its sentence
        ("Dr. Griffin met Mr. X on Feb. 9 in St. Moritz.", 1),  # abbreviations
        ("J. R. R. Tolkien lived in the U.S. for a while.", 1),  # initials
        ("It was 1999. the end", 2),  # a number's period before a lower-case word
        ("Planes, trains, etc., and more", 2),  # spaCy cuts "etc." before a comma
        ("I doubt.Has it ended", 2),  # a period between lower and upper case
        ("you hate America!...you have no evidence!...hate!...", 1),  # '!' inside a word
        ("Wait... what happened", 1),  # an ellipsis ends no sentence
    ],
)
def test_c4_counts_sentences_as_spacy_sentencizer(line, sentences):
    assert R.count_sentences(line, 100) == sentences
    assert R.count_sentences(line, 2) == min(sentences, 2)  # stops once it has enough


def test_fineweb_rules():
    long_line = "This line is long enough to not count as a short line at all."
    assert check(R.fineweb_punct_lines, "\n".join([long_line] * 3 + ["no end"] * 22)) is None  # 0.12
    assert check(R.fineweb_punct_lines, "\n".join([long_line] * 2 + ["no end"] * 23)).value == 0.08
    assert check(R.fineweb_short_lines, "\n".join(["short"] * 2 + [long_line])) is None  # 0.667
    assert check(R.fineweb_short_lines, "\n".join(["short"] * 3 + [long_line])).value == 0.75
    unique = [f"{long_line} {i}" for i in range(200)]
    assert check(R.fineweb_dup_line_chars, "\n".join(unique + ["tiny"])) is None
    assert check(R.fineweb_dup_line_chars, "\n".join(unique + unique[:3])).rule == "fineweb_dup_line_chars"
    assert check(R.fineweb_list_like, "\n".join(["one two three"] * 10)) is None  # 9 / 30
    assert check(R.fineweb_list_like, "\n".join(["one two"] * 10)).value == 0.45


def test_script_fallback_and_character_tokens():
    assert detect_script_language("床前明月光，疑是地上霜。") == "zh"
    assert detect_script_language("これは日本語の文です。") == "ja"
    assert detect_script_language("Plain English.") == "und"
    assert Doc("明月 光", "zh").words == ["明", "月", "光"]
    assert Doc("明月 光", "zh").rules.off >= {"gopher_mean_word_length", "c4_min_words_per_line"}


TOPICS = "mayor budget river bridge school storm market election festival harbor museum railway".split()
VERBS = "approves delays floods reopens closes hits rallies postpones opens expands renovates extends".split()
# a page of truncated headlines (the Common Crawl sample has one): every line ends in an ellipsis
HEADLINES = "\n".join(
    f"The {t} {v} {n + 3} plans near {t2} after {n + 7} weeks and {v2} {n * 13 + 5} more..."
    for n, (t, v, t2, v2) in enumerate(zip(TOPICS, VERBS, reversed(TOPICS), reversed(VERBS)))
)


def test_web_verdict_evidence_names_rule_value_threshold_language():
    _, reject, _ = web_verdict(HEADLINES, {"language": "eng"}, S)
    reason, detail, evidence = reject
    assert reason == "gopher_ellipsis_lines" and evidence == {"value": 1.0, "threshold": 0.3, "language": "en"}


def _raw(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True)
    with open(folder / "part-00000.jsonl", "w", encoding="utf-8") as f:
        for i, rec in enumerate(records):
            f.write(json.dumps({"id": f"r{i}", "source": {"path": "x.jsonl", "line": i + 1}, **rec}) + "\n")
    return folder


def test_auto_profile_web_with_url_curated_without(tmp_path):
    web = _raw(tmp_path / "web", [{"text": HEADLINES, "meta": {"url": "http://news.example/1"}}])
    stats = clean_corpus(web, tmp_path / "web_out", CleanSettings(language_id=False), workers=1)
    assert stats.quality_profile["profile"] == "web" and stats.docs_out == 0
    assert stats.rejected_by_reason == {"gopher_ellipsis_lines": 1}
    assert stats.dropped_by_language == {"und": {"gopher_ellipsis_lines": 1}}
    entry = json.loads((tmp_path / "web_out" / "_rejected.jsonl").read_text())
    assert (entry["value"], entry["threshold"]) == (1.0, 0.3)
    curated = _raw(tmp_path / "cur", [{"text": HEADLINES, "meta": {}}])
    stats = clean_corpus(curated, tmp_path / "cur_out", CleanSettings(language_id=False), workers=1)
    assert stats.quality_profile["profile"] == "curated" and stats.docs_out == 1


def test_cleaned_metadata_shows_rule_value_threshold_and_drops_per_language(tmp_path):
    from assets.metadata import cleaned_jsonl_metadata

    pages = [{"text": HEADLINES, "meta": {"url": f"http://news.example/{i}"}} for i in range(2)]
    raw = _raw(tmp_path / "web", [*pages, {"text": "Hi", "meta": {"url": "http://news.example/x"}}])
    stats = clean_corpus(raw, tmp_path / "out", CleanSettings(language_id=False), workers=1)
    meta = cleaned_jsonl_metadata(stats, tmp_path / "out")
    rows = [r.data for r in meta["rejected_samples"].records]
    assert rows[0] == {
        "rule": "gopher_ellipsis_lines", "value": "1.0", "threshold": "0.3", "text": rows[0]["text"],
    }  # fmt: skip
    assert rows[0]["text"].startswith("The ") and " / The " in rows[0]["text"]  # the page's lines, readable
    assert rows[2] == {"rule": "too_short", "value": "2 chars < min_chars 10", "threshold": "", "text": "Hi"}
    assert stats.dropped_by_language == {"und": {"gopher_ellipsis_lines": 2, "too_short": 1}}
    assert meta["dropped_by_language"].value.splitlines()[2] == "| und | 3 | gopher_ellipsis_lines 2, too_short 1 |"


def test_choose_profile_counts_warc_sources_and_url_keys(tmp_path):
    shard = tmp_path / "part-00000.jsonl"
    lines = [
        {"text": 'say "url": "x"', "meta": {}, "source": {"path": "a.jsonl"}},  # a text never counts
        {"text": "t", "meta": {}, "source": {"path": "crawl/a.warc.gz"}},
        {"text": "t", "meta": {"url": "http://a"}, "source": {"path": "a.jsonl"}},
        {"text": "t", "meta": {}, "source": {"path": "a.jsonl"}},
    ]
    shard.write_text("".join(json.dumps(r) + "\n" for r in lines))
    choice = choose_profile([shard], "auto")
    assert (choice.web_records, choice.records, choice.profile) == (2, 4, "web")
    assert choose_profile([shard], "curated").profile == "curated"


def test_settings_bounds():
    with pytest.raises(ValidationError):
        CleanSettings(gopher_min_alpha_words_ratio=1.5)
    with pytest.raises(ValidationError):
        CleanSettings(quality="fineweb")
    with pytest.raises(ValidationError):
        CleanSettings(c4_terminal_punct="sometimes")
    assert CleanSettings(quality="web", gopher_min_words=10).gopher_min_words == 10


def test_dagster_config_accepts_the_quality_fields():
    from assets.clean import CleanConfig

    config = CleanConfig(quality="web", fineweb_short_line_chars=40)
    assert config.quality == "web" and CleanSettings(**config.model_dump()).fineweb_short_line_chars == 40


def _clean_outputs(source: Path, tmp: Path, quality: str) -> dict[str, bytes]:
    from tokenmill.stages.raw import ingest

    raw = tmp / "raw"
    if not raw.exists():
        ingest(source, raw, workers=1)
    out = tmp / quality
    clean_corpus(raw, out, CleanSettings(quality=quality), workers=1)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix == ".jsonl"}


@pytest.mark.parametrize("corpus", ["demo", "tinyshakespeare", "chinese-poetry"])
def test_curated_corpora_unchanged_under_auto(corpus, tmp_path, demo_source, request):
    if corpus == "demo":
        source = demo_source
    else:
        shared = request.getfixturevalue("shared_dir")
        source = shared / "corpora" / corpus
        if corpus == "chinese-poetry":  # two files of each kind keep the test short
            source = tmp_path / "poetry"
            source.mkdir()
            for path in [*sorted((shared / "corpora" / corpus / "全唐诗").glob("*.json"))[:2]]:
                (source / path.name).write_bytes(path.read_bytes())
    auto = _clean_outputs(source, tmp_path, "auto")
    assert auto == _clean_outputs(source, tmp_path, "curated")
    assert auto, "no output"
