"""Rule 0 and rule 8 of cleaning, the garbage filters: each returns None (keep) or (reason, detail).

Each filter is declared once, as a `RecordFilter` (its name, the reasons it rejects with, its check and the
settings the check reads): rule 8 runs the `RECORD_FILTERS` in their order, rule 0 is `TOO_LONG`, and the stage's
reasons (`corpus.REASONS`, the `dropped_<reason>` keys) and timing names (`report.RULES`) derive from them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

try:
    from _collections import _count_elements  # type: ignore[import-not-found]  # private, not in typeshed
except ImportError:  # another Python implementation: the pure-Python helper has the same signature
    from collections import _count_elements  # type: ignore[attr-defined]  # private, not in typeshed

from tokenmill.stages.clean.settings import CleanSettings

# every branch starts with a character, so the regex engine skips to the candidates at C speed
PLACEHOLDER_RE = re.compile(
    r"[\ufffd\u25a1\u25a0\u25a2\u25af\u25fb\u25fc\u2b1c\u2b1b\ue000-\uf8ff"
    r"\U000f0000-\U0010ffff]|\?\?+|\?(?<=\w\?)(?=\w)|囗囗+"
)
PRIVATE_OR_BOX_RE = re.compile(r"[\u25a2\u25af\u25fb\u25fc\u2b1c\u2b1b\ue000-\uf8ff\U000f0000-\U0010ffff]")
CJK_CHARS_PER_WORD = 1.6  # n-gram checks start at min_tokens words, i.e. about 80 CJK characters for 50 words
EVIDENCE_ITEMS = 3  # distinct placeholder matches named in a rejection's detail
EVIDENCE_CHARS = 60  # characters of a repeated line or n-gram named in a rejection's detail


def count_chars(text: str) -> int:
    """Characters that are not whitespace."""
    return len(text) - sum(map(text.count, (" ", "\n", "\t", "\u3000")))


def check_empty(text: str):
    if not text.strip():
        return "empty", "no text left after cleaning"
    return None


def check_too_short(text: str, min_chars: int):
    n = count_chars(text)
    if n < min_chars:
        return "too_short", f"{n} chars < min_chars {min_chars}"
    return None


def check_too_long(text: str, max_chars: int):
    if max_chars and len(text) > max_chars:
        return "too_long", f"{len(text)} chars > max_chars {max_chars}"
    return None


def placeholder_ratio(text: str) -> float:
    """Share of non-space characters that are placeholders or garbage: U+FFFD, □ ■ and kin, private-use
    characters, runs of '?' and a '?' stuck inside a word ("wh?t", "明?光": a character lost in transcoding)."""
    bad = 0
    for m in PLACEHOLDER_RE.finditer(text):
        bad += len(m.group())
    return bad / max(1, count_chars(text))


def _maybe_placeholders(text: str) -> bool:
    """Cheap test that there may be placeholder glyphs at all (`in` and max() run at C speed)."""
    return (
        "\ufffd" in text
        or "?" in text
        or "\u25a1" in text
        or "\u25a0" in text
        or "囗囗" in text
        or PRIVATE_OR_BOX_RE.search(text) is not None
    )


def check_placeholder_glyphs(text: str, max_ratio: float):
    if not text or not _maybe_placeholders(text) or PLACEHOLDER_RE.search(text) is None:
        return None
    r = placeholder_ratio(text)
    if r > max_ratio:
        found = list(dict.fromkeys(m.group() for m in PLACEHOLDER_RE.finditer(text)))[:EVIDENCE_ITEMS]
        return "placeholder_glyphs", f"placeholder ratio {r:.3f} > {max_ratio}: {', '.join(map(repr, found))}"
    return None


def tokens_of(text: str) -> list[str] | str:
    """Tokens for the repetition statistics: lower-cased whitespace-separated words, or, for text written mostly
    without spaces (CJK: over 2 UTF-8 bytes a character), its characters without whitespace, returned as one
    string. Punctuation stays in both (dropping it costs a regex pass over every text for little change)."""
    if not text.isascii() and len(text.encode("utf-8")) > 2 * len(text):
        return "".join(text.split())
    return text.lower().split()


def repetition_stats(text: str, ngram_ns=(2, 3, 4), thresholds=None, min_tokens: int = 0) -> dict:
    """Gopher-style repetition figures: duplicate-line fraction (by lines and by characters) and, for each n,
    the share of tokens covered by the most frequent n-gram (texts of `min_tokens` tokens or more).
    With `thresholds` (n -> limit) the n-gram counts are skipped where a cheap bound proves they stay under it."""
    raw_lines = text.split("\n")
    if len(set(raw_lines)) == len(raw_lines):  # no line repeats (the common case): skip the per-line work
        lines = raw_lines if all(raw_lines) else [ln for ln in raw_lines if ln.strip()]
        out = {"lines": len(lines), "dup_line_frac": 0.0, "dup_line_char_frac": 0.0}
        return _ngram_stats(text, out, ngram_ns, thresholds, min_tokens)
    lines = [s for s in (ln.strip() for ln in raw_lines) if s]
    seen, dup_lines, dup_chars = set(), 0, 0
    for s in lines:
        if s in seen:
            dup_lines += 1
            dup_chars += len(s)
        else:
            seen.add(s)
    total_line_chars = sum(map(len, lines)) or 1
    out = {
        "lines": len(lines),
        "dup_line_frac": dup_lines / max(1, len(lines)),
        "dup_line_char_frac": dup_chars / total_line_chars,
    }
    return _ngram_stats(text, out, ngram_ns, thresholds, min_tokens)


def top_token_count(toks: list[str] | str) -> int:
    """How often the commonest token of `tokens_of` output occurs. Characters are counted as code points by
    numpy (sorting ints: faster than hashing one-character strings, on the 80+ characters that get here)."""
    if isinstance(toks, str):
        chars = np.frombuffer(toks.encode("utf-32-le", "surrogatepass"), np.uint32)
        return int(np.unique(chars, return_counts=True)[1].max())
    counts: dict = {}
    _count_elements(counts, toks)  # Counter's C core without its Python wrapper: less per text
    return max(counts.values())


def _ngram_stats(text: str, out: dict, ngram_ns, thresholds, min_tokens: int) -> dict:
    """Adds top_<n>gram_frac: the share of tokens covered by the most frequent n-gram (k occurrences cover
    k * n tokens; capped at 1). Gopher measures characters; tokens make the bound below exact and cheap."""
    if len(text) < min_tokens or (text.isascii() and text.count(" ") + text.count("\n") + 1 < min_tokens):
        return out  # cannot hold min_tokens tokens: skip the tokenizer
    # too short for min_tokens words (each but the last takes a separator) and, line breaks left out, for the
    # CJK character minimum: whichever way tokens_of splits it, too few tokens
    if len(text) < 2 * min_tokens - 1 and len(text) - text.count("\n") < CJK_CHARS_PER_WORD * min_tokens:
        return out
    toks = tokens_of(text)
    if isinstance(toks, str) and len(toks) < CJK_CHARS_PER_WORD * min_tokens:
        return out
    total = len(toks)
    if total < max(min_tokens, 2):
        return out
    top1 = top_token_count(toks)
    for n in ngram_ns:
        if total < n + 1:
            continue
        # an n-gram occurs at most as often as the commonest token: k*n/N <= top1*n/N
        if thresholds is not None and top1 * n / total <= thresholds.get(n, 1.0):
            continue
        grams: Counter[str] | Counter[tuple[str, ...]]
        if isinstance(toks, str):
            grams = Counter(map(toks.__getitem__, map(slice, range(total - n + 1), range(n, total + 1))))
        else:
            grams = Counter(zip(*[toks[i:] for i in range(n)]))
        k = max(grams.values())
        if k > 1:
            out[f"top_{n}gram_frac"] = min(1.0, k * n / total)
    return out


def check_repetition(
    text: str,
    max_dup_line_frac: float,
    max_dup_line_char_frac: float,
    top_ngram_fracs: dict,
    min_lines: int = 4,
    min_tokens: int = 50,
):
    """Rejects spam-like repetition; duplicate-line limits apply from `min_lines` lines on (a 2-line text with
    a repeated line is a refrain, not spam), n-gram limits from `min_tokens` tokens on (Gopher's 50 words: in
    a short poem, repeated characters are style, not spam). The same figures as repetition_stats, with the
    common cases (no repeated line, too few tokens) decided before any per-line or per-token work."""
    raw_lines = text.split("\n")
    if len(raw_lines) >= min_lines and len(set(raw_lines)) < len(raw_lines):
        st = repetition_stats(text, (), None, 0)
        if st["lines"] >= min_lines:
            line, k = Counter(s for s in (ln.strip() for ln in raw_lines) if s).most_common(1)[0]
            repeated = f": {_quote(line)} x {k}"
            if st["dup_line_frac"] > max_dup_line_frac:
                return "repetition", (
                    f"duplicate-line fraction {st['dup_line_frac']:.2f} > {max_dup_line_frac}{repeated}"
                )
            if st["dup_line_char_frac"] > max_dup_line_char_frac:
                return "repetition", (
                    f"duplicate-line char fraction {st['dup_line_char_frac']:.2f} > {max_dup_line_char_frac}{repeated}"
                )
    if len(text) < min_tokens:
        return None
    st = _ngram_stats(text, {}, tuple(top_ngram_fracs), top_ngram_fracs, min_tokens)
    for n, limit in top_ngram_fracs.items():
        v = st.get(f"top_{n}gram_frac", 0.0)
        if v > limit:
            gram, k = top_ngram(tokens_of(text), n)
            return "repetition", f"top {n}-gram token fraction {v:.2f} > {limit}: {_quote(gram)} x {k}"
    return None


def top_ngram(toks: list[str] | str, n: int) -> tuple[str, int]:
    """The most frequent n-gram of `tokens_of` output (words joined by spaces) and how often it occurs."""
    grams = Counter(
        toks[i : i + n] if isinstance(toks, str) else " ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)
    )
    return grams.most_common(1)[0]


def _quote(text: str) -> str:
    """A repeated line or n-gram quoted in a rejection's detail, cut to EVIDENCE_CHARS."""
    return repr(text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + "…")


Check = Callable[..., tuple | None]


@dataclass(frozen=True)
class RecordFilter:
    """One garbage filter, declared once: `check(text, *settings)` returns None (keep) or (reason, detail), its
    arguments after the text being the `settings` named, in order (a CleanSettings field, or a method of it that
    takes no argument, called once per task). Its rejections count under `reasons` (default: its name; list every
    reason the check can return) and its seconds under `timer` (default: filter_<name>)."""

    name: str
    check: Check
    settings: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    timer: str = ""

    def __post_init__(self):
        if not self.reasons:
            object.__setattr__(self, "reasons", (self.name,))
        if not self.timer:
            object.__setattr__(self, "timer", f"filter_{self.name}")
        unknown = [n for n in self.settings if n not in CleanSettings.model_fields and not hasattr(CleanSettings, n)]
        if unknown:  # a typo fails where the filter is declared, not on the first record
            raise ValueError(f"filter {self.name!r} reads settings CleanSettings does not have: {unknown}")

    def bind(self, settings: CleanSettings) -> Callable[[str], tuple | None]:
        """The check with its settings' values: a function of the text alone."""
        values = []
        for name in self.settings:
            value = getattr(settings, name)
            values.append(value() if callable(value) and name not in CleanSettings.model_fields else value)
        check = self.check
        if not values:
            return check
        if len(values) == 1:  # the common case, without unpacking a tuple per call
            (value,) = values
            return lambda text: check(text, value)
        args = tuple(values)
        return lambda text: check(text, *args)


# rule 0, before any repair (prepare.repair_batch runs it over a batch at once)
TOO_LONG = RecordFilter("too_long", check_too_long, ("max_chars",), timer="too_long")
# rule 8, in the order they run: the first failing one names the reason
RECORD_FILTERS: tuple[RecordFilter, ...] = (
    RecordFilter("empty", check_empty),
    RecordFilter("too_short", check_too_short, ("min_chars",)),
    RecordFilter("placeholder_glyphs", check_placeholder_glyphs, ("max_placeholder_ratio",)),
    RecordFilter("repetition", check_repetition, ("max_dup_line_frac", "max_dup_line_char_frac", "ngram_limits")),
)


def filter_reasons() -> tuple[str, ...]:
    """The reasons of rule 0 and of the record filters, in their order (read when called: a test may replace
    RECORD_FILTERS)."""
    return tuple(dict.fromkeys(r for f in (TOO_LONG, *RECORD_FILTERS) for r in f.reasons))


def filter_timers() -> tuple[str, ...]:
    """The record filters' timing names, in their order."""
    return tuple(f.timer for f in RECORD_FILTERS)


def record_filters(settings: CleanSettings) -> tuple:
    """Rule 8, in order: (timer name, check of the text alone)."""
    return tuple((f.timer, f.bind(settings)) for f in RECORD_FILTERS)


def first_failure(text: str, filters) -> tuple | None:
    """(reason, detail) of the first filter `text` fails, or None."""
    for _, check in filters:
        bad = check(text)
        if bad:
            return bad
    return None
