"""A record filter of cleaned_jsonl is one declaration (a `RecordFilter` in `filters.RECORD_FILTERS`): a throwaway
filter added there alone runs in both passes and is timed and counted in the result, `_stats.json`, `_timings.json`
and the Dagster metadata; a reason no rule declares still counts in `dropped`, and the stage checks in = out +
dropped itself."""

import json
from collections import Counter

import pytest
from support import JUEJU, POEM, PROSE, clean, make_raw, planted_corpus

from tokenmill.common.io import STATS_FILE, TIMINGS_FILE
from tokenmill.stages.clean import CleanSettings, clean_corpus, corpus, language, report
from tokenmill.stages.clean import filters as F

MARK = "THROWAWAY-MARK"
FOOTER = "Copyright © 2024 Example Press | All rights reserved"  # planted_corpus's boilerplate footer


def ends_marked(text: str, min_chars: int):
    """The throwaway check: rejects a text whose last line is MARK (it reads a setting, as most filters do)."""
    if text.rstrip().endswith(MARK):
        return "throwaway", f"ends with the mark (min_chars {min_chars})"
    return None


@pytest.fixture
def throwaway(monkeypatch):
    """The throwaway filter declared the way a new filter is, after the others; nothing else is touched."""
    monkeypatch.setattr(
        F, "RECORD_FILTERS", (*F.RECORD_FILTERS, F.RecordFilter("throwaway", ends_marked, ("min_chars",)))
    )


def test_a_declared_filter_is_run_timed_and_counted(tmp_path, throwaway):
    from assets.metadata import cleaned_jsonl_metadata

    reasons, timers = corpus.declared_reasons(), report.rule_names()
    assert len(set(F.filter_timers())) == len(F.RECORD_FILTERS)  # one timer each
    assert reasons.index("throwaway") == reasons.index("repetition") + 1  # in declaration order
    assert timers.index("filter_throwaway") == timers.index("filter_repetition") + 1
    docs, *_ = planted_corpus(60, seed=3)
    docs += [
        f"{PROSE}\n{MARK}",  # pass 1 rejects it
        f"{PROSE}\n{MARK}\n{FOOTER}",  # pass 1 keeps it; pass 2 strips the footer, then rejects it
        f"{MARK}\n{PROSE}",  # kept: the mark is not its last line
        "",  # the filters before it still come first
    ]
    n = len(docs)
    ids, recs, rej, stats = clean(tmp_path, docs)
    assert rej[ids[n - 4]]["reason"] == rej[ids[n - 3]]["reason"] == "throwaway"
    assert rej[ids[n - 4]]["detail"] == "ends with the mark (min_chars 10)"
    assert "after stripping 1 boilerplate lines" in rej[ids[n - 3]]["detail"]
    assert ids[n - 2] in recs and rej[ids[n - 1]]["reason"] == "empty"
    assert stats.dropped["throwaway"] == 2 and list(stats.dropped) == list(reasons)
    assert stats.docs_in == stats.docs_out + sum(stats.dropped.values())
    written = json.loads((tmp_path / "out" / STATS_FILE).read_text(encoding="utf-8"))
    assert written["dropped_throwaway"] == 2
    timings = json.loads((tmp_path / "out" / TIMINGS_FILE).read_text(encoding="utf-8"))
    assert list(timings["rule_seconds"]) == sorted(timers) and timings["rule_seconds"]["filter_throwaway"] >= 0
    assert list(stats.rule_seconds) == list(timers)
    meta = cleaned_jsonl_metadata(stats, tmp_path / "out")
    assert meta["dropped_throwaway"].value == 2


def test_a_reason_declared_nowhere_still_counts(tmp_path, monkeypatch):
    from assets.metadata import cleaned_jsonl_metadata

    def odd_language_rule(self, code, score):  # a rule returning a reason no declaration names
        if code != "zh":
            return None
        return "declared_nowhere", "a reason of its own", {"language": code, "language_score": score}

    monkeypatch.setattr(language.LanguageRule, "check", odd_language_rule)
    assert "declared_nowhere" not in corpus.declared_reasons()
    ids, recs, rej, stats = clean(tmp_path, [PROSE, POEM, JUEJU, ""])
    assert set(recs) == {ids[0]} and rej[ids[1]]["reason"] == rej[ids[2]]["reason"] == "declared_nowhere"
    assert stats.dropped["declared_nowhere"] == 2 and stats.dropped["empty"] == 1
    assert list(stats.dropped) == [*corpus.declared_reasons(), "declared_nowhere"]  # after the declared ones
    assert stats.docs_in == 4 == stats.docs_out + sum(stats.dropped.values())
    written = json.loads((tmp_path / "out" / STATS_FILE).read_text(encoding="utf-8"))
    assert written["dropped_declared_nowhere"] == 2
    assert cleaned_jsonl_metadata(stats, tmp_path / "out")["dropped_declared_nowhere"].value == 2


def test_dropped_lists_the_declared_reasons_then_the_others_sorted():
    dropped = corpus.dropped_counts(Counter({"zz_new": 1, "empty": 2, "aa_new": 3}))
    assert list(dropped) == [*corpus.declared_reasons(), "aa_new", "zz_new"]
    assert dropped["empty"] == 2 and dropped["too_short"] == 0 and sum(dropped.values()) == 6


def test_the_stage_checks_in_equals_out_plus_dropped(tmp_path, monkeypatch):
    """Counts that lose a rejection stop the stage before it writes _stats.json."""
    monkeypatch.setattr(
        corpus, "dropped_counts", lambda reasons, also=(): {r: n for r, n in reasons.items() if r != "empty"}
    )
    make_raw(tmp_path / "raw", [PROSE, ""])
    with pytest.raises(RuntimeError, match=r"2 in != 1 out \+ 0 dropped"):
        clean_corpus(tmp_path / "raw", tmp_path / "out", CleanSettings())
    assert not (tmp_path / "out" / STATS_FILE).exists()


def test_a_filter_reading_an_unknown_setting_fails_where_it_is_declared():
    with pytest.raises(ValueError, match=r"no_such_limit"):
        F.RecordFilter("bad", ends_marked, ("no_such_limit",))
    bound = F.RecordFilter("rep", F.check_repetition, ("max_dup_line_frac", "max_dup_line_char_frac", "ngram_limits"))
    spam = "\n".join(["Buy cheap watches now!"] * 12)
    assert bound.bind(CleanSettings())(spam) == F.first_failure(spam, F.record_filters(CleanSettings()))
