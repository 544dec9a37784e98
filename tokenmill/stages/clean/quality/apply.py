"""The web rules as cleaned_jsonl runs them: the profile a batch gets, and the rule chain on a record.

One call per staged batch in pass 1 (`check_batch`) and one per record whose boilerplate pass 2 stripped
(`recheck_record`): the web rules see the text after boilerplate stripping, as the garbage filters do.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenmill.stages.clean.quality import rules as R
from tokenmill.stages.clean.quality.settings import QualitySettings
from tokenmill.stages.clean.quality.text import Doc, detect_script_language, language_code

# (name, check), in the order they run; C4 sits between the document rules and FineWeb's, which see its text
REPETITION_RULES = (
    ("gopher_dup_paragraphs", R.gopher_paragraph_repetition),
    ("gopher_dup_lines", R.gopher_line_repetition),
    ("gopher_top_ngram", R.gopher_top_ngrams),
    ("gopher_dup_ngram", R.gopher_dup_ngrams),
)
GOPHER_QUALITY_RULES = (
    ("gopher_word_count", R.gopher_word_count),
    ("gopher_mean_word_length", R.gopher_mean_word_length),
    ("gopher_symbol_ratio", R.gopher_symbol_ratio),
    ("gopher_bullet_lines", R.gopher_bullet_lines),
    ("gopher_ellipsis_lines", R.gopher_ellipsis_lines),
    ("gopher_alpha_words", R.gopher_alpha_words),
    ("gopher_stop_words", R.gopher_stop_words),
)
FINEWEB_RULES = (
    ("fineweb_punct_lines", R.fineweb_punct_lines),
    ("fineweb_short_lines", R.fineweb_short_lines),
    ("fineweb_dup_line_chars", R.fineweb_dup_line_chars),
    ("fineweb_list_like", R.fineweb_list_like),
)
QUALITY_REASONS = (
    "gopher_dup_paragraphs",
    "gopher_dup_paragraph_chars",
    "gopher_dup_lines",
    "gopher_dup_line_chars",
    "gopher_top_ngram",
    "gopher_dup_ngram",
    *(name for name, _ in GOPHER_QUALITY_RULES),
    "c4_lorem_ipsum",
    "c4_curly_bracket",
    "c4_no_terminal_punct",
    "c4_too_few_sentences",
    "c4_no_lines_left",
    *(name for name, _ in FINEWEB_RULES),
)
WEB_SHARE = 0.5  # auto: a batch is web when at least this share of its records is
WEB_SOURCE_RE = re.compile(rb'"path":\s*"[^"]*\.(?:warc|arc|html?|xhtml)(?:\.gz)?"', re.IGNORECASE)
URL_KEY_RE = re.compile(rb'"url":\s*"')
READ_BYTES = 4 << 20


def record_language(text: str, meta: dict) -> str:
    """meta.language (set by language identification), else a guess from the script."""
    return language_code(meta) or detect_script_language(text)


def _run(rules, doc: Doc, s: QualitySettings) -> R.Reject | None:
    off = doc.rules.off
    for name, check in rules:
        if name not in off:
            bad = check(doc, s)
            if bad is not None:
                return bad
    return None


def web_verdict(
    text: str, meta: dict, s: QualitySettings, language: str | None = None
) -> tuple[str, tuple | None, dict]:
    """The web rules on one text in `language` (default: `record_language`): (the text as C4 leaves it, the
    first failing rule's reject tuple or None, the lines C4 removed by why)."""
    language = language or record_language(text, meta)
    doc = Doc(text, language)
    bad = _run(REPETITION_RULES, doc, s) or _run(GOPHER_QUALITY_RULES, doc, s)
    if bad is not None:
        return text, bad.as_reject(language), {}
    c4 = R.c4_filter(doc, s)
    if c4.reject is not None:
        return text, c4.reject.as_reject(language), c4.removed
    if not c4.text:
        no_lines = R.Reject(rule="c4_no_lines_left", value=0, threshold=0, detail="no line left after C4's line rules")
        return text, no_lines.as_reject(language), {}
    if c4.text != text:
        doc = Doc(c4.text, language)
    bad = _run(FINEWEB_RULES, doc, s)
    return doc.text, None if bad is None else bad.as_reject(language), c4.removed


def check_batch(batch: list[tuple[bytes, dict]], entries: list, s: QualitySettings, counts: Counter) -> None:
    """Pass 1: the web rules on a staged batch's records not yet rejected (`entries`, prepare.Prepared, by
    position of `batch`), in place: a rejected record gets its reject, a record C4 shortened its new text."""
    for (_, rec), e in zip(batch, entries):
        if e.reject is not None or not e.text:
            continue
        record = e.new if e.new is not None else rec
        meta = m if isinstance(m := record.get("meta"), dict) else {}
        identified = e.language[0] if e.language is not None else None  # language identification's verdict
        text, reject, removed = web_verdict(e.text, meta, s, identified)
        counts.update({f"c4_lines_removed_{why}": n for why, n in removed.items()})
        if reject is not None:
            e.reject = reject
        elif text != e.text:
            if e.new is None:
                e.new = {"id": rec.get("id"), "text": text, "meta": rec.get("meta"), "source": rec.get("source")}
                e.new.update((k, v) for k, v in rec.items() if k not in e.new)
                e.before, e.kind = e.text, "web_lines"
            e.new["text"] = e.text = text


def recheck_record(rec: dict, text: str, s: QualitySettings) -> tuple[str, tuple | None]:
    """Pass 2: the web rules again on a record whose boilerplate lines were stripped."""
    meta = m if isinstance(m := rec.get("meta"), dict) else {}
    text, reject, _ = web_verdict(text, meta, s)
    return text, reject


@dataclass(frozen=True, kw_only=True)
class ProfileChoice:
    setting: str
    profile: str
    """'web' or 'curated': what the batch gets."""
    web_records: int
    records: int
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def choose_profile(shards: list[Path], setting: str) -> ProfileChoice:
    """The batch's profile. 'auto' counts, on the raw lines (no parsing), the records coming from a WARC/HTML
    file or carrying a "url" key; a JSON string cannot hold an unescaped '"url": "', so a text never counts."""
    if setting != "auto":
        return ProfileChoice(setting=setting, profile=setting, web_records=0, records=0, why=f"set to '{setting}'")
    web = total = 0
    for shard in shards:
        with open(shard, "rb") as f:
            while lines := f.readlines(READ_BYTES):
                for line in lines:
                    if line.strip():
                        total += 1
                        web += bool(URL_KEY_RE.search(line) or WEB_SOURCE_RE.search(line))
    profile = "web" if total and web >= WEB_SHARE * total else "curated"
    share = web / total if total else 0.0
    why = (
        f"{web} of {total} records ({share:.0%}) come from WARC/HTML files or carry a URL: "
        f"{'at least' if profile == 'web' else 'under'} {WEB_SHARE:.0%}, so the {profile} profile"
    )
    return ProfileChoice(setting=setting, profile=profile, web_records=web, records=total, why=why)


def c4_lines_removed(counts: Counter) -> dict[str, int]:
    """The lines the C4 rules removed, by why."""
    prefix = "c4_lines_removed_"
    return {k[len(prefix) :]: n for k, n in sorted(counts.items()) if k.startswith(prefix)}
