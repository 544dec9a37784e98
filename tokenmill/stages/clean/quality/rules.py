"""The web rules, each a small pure function of a `Doc` and the settings: None (keep) or a `Reject` naming the
rule, the measured value and the threshold it crossed.

Definitions follow datatrove's filters (the FineWeb pipeline's reference implementation) so that the same
thresholds keep and drop the same documents; where they deliberately differ the function says so. Families run
in FineWeb's order: Gopher repetition, Gopher quality, C4 (which also removes lines), FineWeb.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace

import numpy as np

from tokenmill.stages.clean.quality.settings import QualitySettings
from tokenmill.stages.clean.quality.text import LETTER_RE, LINE_BREAKS_RE, PARAGRAPH_BREAK_RE, Doc, tokenize

EVIDENCE_CHARS = 60  # characters of a repeated line or n-gram quoted in a rejection's detail


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    rule: str
    value: float
    threshold: float
    detail: str

    def as_reject(self, language: str) -> tuple:
        """The (reason, detail, evidence) tuple a filter returns (see staging.rejected_line)."""
        return (
            self.rule,
            self.detail,
            {"value": round(self.value, 4), "threshold": self.threshold, "language": language},
        )


def _quote(text: str) -> str:
    return repr(text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + "…")


def _shown(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def _above(rule: str, value: float, limit: float, what: str) -> Reject | None:
    return (
        Reject(rule=rule, value=value, threshold=limit, detail=f"{what} {_shown(value)} > max {limit}")
        if value > limit
        else None
    )


def _quoting(reject: Reject | None, item: str) -> Reject | None:
    """`reject` with the repeated item it counted quoted in its detail."""
    return None if reject is None else replace(reject, detail=f"{reject.detail}: {item}")


def _below(rule: str, value: float, limit: float, what: str) -> Reject | None:
    return (
        Reject(rule=rule, value=value, threshold=limit, detail=f"{what} {_shown(value)} < min {limit}")
        if value < limit
        else None
    )


# ---- Gopher repetition (Rae et al. 2021, table A1) ----------------------------------------------------------------


def repeated(items: list[str]) -> tuple[int, int, str]:
    """How many items repeat an earlier one, their characters, and the first repeated item ("" when none does)."""
    seen: set[str] = set()
    count = chars = 0
    first: str | None = None
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
            first = item if first is None else first
        else:
            seen.add(item)
    return count, chars, "" if first is None else first


def gopher_paragraph_repetition(doc: Doc, s: QualitySettings) -> Reject | None:
    """Paragraphs (split at blank lines) repeating an earlier one: their share, then their characters' share."""
    paragraphs = PARAGRAPH_BREAK_RE.split(doc.text.strip())
    if len(paragraphs) < 2:
        return None
    count, chars, first = repeated(paragraphs)
    if not count:
        return None
    bad = _above(
        "gopher_dup_paragraphs", count / len(paragraphs), s.gopher_max_dup_para_frac, "repeated paragraphs share"
    ) or _above(
        "gopher_dup_paragraph_chars",
        chars / len(doc.text),
        s.gopher_max_dup_para_char_frac,
        "characters in repeated paragraphs",
    )
    return _quoting(bad, _quote(first))


def gopher_line_repetition(doc: Doc, s: QualitySettings) -> Reject | None:
    """Lines repeating an earlier one: their share, then their characters' share of the text."""
    lines = LINE_BREAKS_RE.split(doc.text)
    count, chars, first = repeated(lines)
    if not count:
        return None
    bad = _above("gopher_dup_lines", count / len(lines), s.gopher_max_dup_line_frac, "repeated lines share") or _above(
        "gopher_dup_line_chars", chars / len(doc.text), s.gopher_max_dup_line_char_frac, "characters in repeated lines"
    )
    return _quoting(bad, _quote(first))


def gopher_top_ngrams(doc: Doc, s: QualitySettings) -> Reject | None:
    """The most frequent word n-gram (n = 2..4): its occurrences x its length (words joined by spaces) over the
    text's characters. Ties go to the n-gram seen first."""
    words, total = doc.words, len(doc.text)
    for n, limit in s.top_ngram_limits().items():
        if len(words) < n:
            break
        gram_ids = doc.ngram_ids(n)
        per_gram = np.bincount(gram_ids)[gram_ids]  # occurrences of the n-gram at each position
        k = int(per_gram.max())
        start = int(np.argmax(per_gram == k))  # the first seen of the most frequent
        text = " ".join(words[start : start + n])
        bad = _above("gopher_top_ngram", k * len(text) / total, limit, f"top {n}-gram character share")
        if bad:
            return _quoting(bad, f"{_quote(text)} x {k}")
    return None


def gopher_dup_ngrams(doc: Doc, s: QualitySettings) -> Reject | None:
    """Characters (words joined without spaces) in word n-grams (n = 5..10) repeating an earlier one, scanning
    left to right and jumping past each repeat, over the text's characters. Any repeated n-gram holds a
    repeated 5-gram, so a text without one is done after one set of 5-grams."""
    if len(doc.words) < 10:
        return None
    total, ends = len(doc.text), None
    for n, limit in s.dup_ngram_limits().items():
        gram_ids = doc.ngram_ids(n)
        counts = np.bincount(gram_ids)
        if len(counts) == len(gram_ids):
            return None  # no n-gram repeats, so no longer one does either
        if ends is None:  # characters of words [i, j): ends[j] - ends[i]
            ends = np.concatenate(([0], np.cumsum(doc.distinct_lengths[doc.word_ids])))
        starts = _repeat_starts(gram_ids, counts, n)
        if not len(starts):
            continue
        chars = np.cumsum(ends[starts + n] - ends[starts])
        over = np.flatnonzero(chars > limit * total)
        if len(over):
            first = int(starts[0])
            value = int(chars[over[0]]) / total  # as the scan stops: when the repeats pass the limit
            bad = _above("gopher_dup_ngram", value, limit, f"characters in repeated {n}-grams")
            return _quoting(bad, _quote(" ".join(doc.words[first : first + n])))
    return None


def _repeat_starts(gram_ids: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    """Where the left-to-right scan meets an n-gram seen before, jumping n words past each. Only n-grams that
    occur twice or more can repeat; the scan's steps over the others change nothing, so only those are visited."""
    positions = np.flatnonzero(counts[gram_ids] > 1)
    seen = bytearray(len(counts))
    starts, resume = [], 0
    for i, gram in zip(positions.tolist(), gram_ids[positions].tolist()):
        if i < resume:
            continue  # inside the repeat just counted
        if seen[gram]:
            starts.append(i)
            resume = i + n
        else:
            seen[gram] = 1
    return np.array(starts, dtype=np.int64)


# ---- Gopher quality -----------------------------------------------------------------------------------------------


def gopher_word_count(doc: Doc, s: QualitySettings) -> Reject | None:
    n = doc.content_words[0]
    return _below("gopher_word_count", n, s.gopher_min_words, "words") or _above(
        "gopher_word_count", n, s.gopher_max_words, "words"
    )


def gopher_mean_word_length(doc: Doc, s: QualitySettings) -> Reject | None:
    n, chars = doc.content_words
    if not n:
        return None
    mean = chars / n
    return _below("gopher_mean_word_length", mean, s.gopher_min_mean_word_length, "mean word length") or _above(
        "gopher_mean_word_length", mean, s.gopher_max_mean_word_length, "mean word length"
    )


def gopher_symbol_ratio(doc: Doc, s: QualitySettings) -> Reject | None:
    """'#' per word, then '...' or '…' per word (every token counts as a word here, as in datatrove)."""
    if not s.gopher_max_symbol_word_ratio:
        return None
    n, text = max(1, len(doc.words)), doc.text
    return _above("gopher_symbol_ratio", text.count("#") / n, s.gopher_max_symbol_word_ratio, "'#' per word") or _above(
        "gopher_symbol_ratio",
        (text.count("...") + text.count("…")) / n,
        s.gopher_max_symbol_word_ratio,
        "ellipses per word",
    )


def gopher_bullet_lines(doc: Doc, s: QualitySettings) -> Reject | None:
    lines = doc.lines
    bullets = sum(1 for line in lines if line.lstrip().startswith(("•", "-")))
    return _above(
        "gopher_bullet_lines", bullets / max(1, len(lines)), s.gopher_max_bullet_lines_ratio, "bullet lines share"
    )


def gopher_ellipsis_lines(doc: Doc, s: QualitySettings) -> Reject | None:
    lines = doc.lines
    ending = sum(1 for line in lines if line.rstrip().endswith(("...", "…")))
    return _above(
        "gopher_ellipsis_lines",
        ending / max(1, len(lines)),
        s.gopher_max_ellipsis_lines_ratio,
        "lines ending in an ellipsis share",
    )


def gopher_alpha_words(doc: Doc, s: QualitySettings) -> Reject | None:
    if not doc.words:
        return None
    share = doc.words_with(LETTER_RE)[0] / len(doc.words)
    return _below("gopher_alpha_words", share, s.gopher_min_alpha_words_ratio, "share of words with a letter")


def gopher_stop_words(doc: Doc, s: QualitySettings) -> Reject | None:
    """Distinct stop words of the text's language, matched lower-cased (datatrove matches case-sensitively, so a
    'The' does not count there: a deliberate difference)."""
    stop = doc.rules.stop_words
    if not s.gopher_min_stop_words or not stop:
        return None
    found = len(stop.intersection(map(str.lower, doc.distinct_words)))
    return _below("gopher_stop_words", found, s.gopher_min_stop_words, f"stop words ({doc.language})")


# ---- FineWeb ------------------------------------------------------------------------------------------------------

# sentence terminals of the main scripts (Unicode's Sentence_Terminal property, which datatrove uses in full)
TERMINAL_PUNCTUATION = tuple(".!?。！？．｡؟۔।॥։።፧፨᠃᠉‼⁇⁈⁉‽⸮︒︕︖﹒﹖﹗။၊។៕܀܁܂߹꓿꘎꘏꛳꛷")


def fineweb_punct_lines(doc: Doc, s: QualitySettings) -> Reject | None:
    lines = doc.nonblank_lines
    if not lines:
        return None
    share = sum(1 for line in lines if line.endswith(TERMINAL_PUNCTUATION)) / len(lines)
    return _below("fineweb_punct_lines", share, s.fineweb_min_punct_lines_ratio, "share of lines ending in punctuation")


def fineweb_short_lines(doc: Doc, s: QualitySettings) -> Reject | None:
    lines, short = doc.nonblank_lines, s.fineweb_short_line_chars
    if not lines:
        return None
    share = sum(1 for line in lines if len(line) <= short) / len(lines)
    return _above("fineweb_short_lines", share, s.fineweb_max_short_lines_ratio, f"share of lines of <= {short} chars")


def fineweb_dup_line_chars(doc: Doc, s: QualitySettings) -> Reject | None:
    _, chars, first = repeated(doc.nonblank_lines)
    if not chars:
        return None
    share = chars / max(1, len(doc.text) - doc.text.count("\n"))
    bad = _above("fineweb_dup_line_chars", share, s.fineweb_max_dup_line_char_ratio, "characters in repeated lines")
    return _quoting(bad, _quote(first))


def fineweb_list_like(doc: Doc, s: QualitySettings) -> Reject | None:
    newlines, limit = doc.text.count("\n"), s.fineweb_max_newline_word_ratio
    # every whitespace-separated piece holds a word or more: a text within the limit per piece is within it per
    # word, and is not tokenized (C4's text, which the FineWeb rules see, would be tokenized for this rule alone)
    if newlines / max(1, len(doc.text.split())) <= limit:
        return None
    return _above("fineweb_list_like", newlines / max(1, len(doc.words)), limit, "line breaks per word")


# ---- C4 (Raffel et al. 2020): line removal, then document rules ----------------------------------------------------

CITATION_RE = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
C4_END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY_RE = re.compile(r"terms of use|privacy policy|cookie policy|uses cookies|use of cookies|use cookies")
SENTENCE_END = frozenset(TERMINAL_PUNCTUATION)
# words whose period is no sentence end (spaCy's English tokenizer keeps these whole, case-sensitively)
ABBREVIATIONS = frozenset(
    "Adm. Ak. Ala. Apr. Ariz. Ark. Aug. Bros. Calif. Co. Colo. Conn. Corp. Dec. Del. Dr. Feb. Fla. Ga. Gen. Gov. Ia."
    " Id. Ill. Inc. Ind. Jan. Jr. Jul. Jun. Kan. Kans. Ky. La. Ltd. Mar. Mass. Md. Messrs. Mich. Minn. Miss. Mo. Mont."
    " Mr. Mrs. Ms. Mt. Neb. Nebr. Nev. Nov. Oct. Okla. Ore. Pa. Prof. Rep. Rev. Sen. Sep. Sept. St. Tenn. Va. Wash."
    " Wis. co. vs. e.g. i.e. E.g. I.e. a.m. p.m. Ph.D.".split()
)
DOTTED_RE = re.compile(r"(?:[^\W\d_]\.)+")  # an initial or "U.S.": one word, period included
UNSPACED_PERIOD_RE = re.compile(r"(?<=[a-z])\.(?=[A-Z])")  # "doubt.Has": spaCy cuts the period out
INNER_MARK_RE = re.compile(r"(?<=\w)[!?]+(?=(?:\.{2,})?\w)")  # "wow!...you", "Hi!There": spaCy keeps it in the word


def count_sentences(line: str, enough: int) -> int:
    """Sentences in a line as spaCy's sentencizer (datatrove's C4 count) cuts them, on tokenmill's words: one
    more after each terminal mark ('.', '!', '?', '。', ...) that a word or symbol follows (closing quotes and
    brackets stay with the sentence they close). A word's final period ("1999." before a lower-case word,
    "etc.,") counts unless the word is an abbreviation or an initial; a period between a lower-case and an
    upper-case letter counts, a '!' or '?' inside a word does not. Stops counting at `enough`."""
    count, ended, previous = 1, False, ""
    if enough <= 1:
        return count
    if "." in line:
        line = UNSPACED_PERIOD_RE.sub(". ", line)
    if "!" in line or "?" in line:
        line = INNER_MARK_RE.sub("", line)
    for token in tokenize(line):
        if token == "." and previous + "." in ABBREVIATIONS:
            continue  # "Dr" "." is spaCy's one word "Dr."
        previous, period = token, False
        if token[-1] == "." and len(token) > 1 and token[-2] != ".":
            if token not in ABBREVIATIONS and not DOTTED_RE.fullmatch(token):
                token, period = token[:-1], True  # spaCy splits the period off
        if token in SENTENCE_END:
            ended = True
        elif ended and not all(unicodedata.category(c)[0] == "P" for c in token):
            count, ended = count + 1, False
            if count >= enough:
                return count
        if period:
            ended = True
    return count


@dataclass(kw_only=True)
class C4Result:
    text: str
    reject: Reject | None
    removed: dict
    """Lines removed, by why: too_long_word, no_terminal_punct, too_few_words, javascript, policy."""


def c4_filter(doc: Doc, s: QualitySettings) -> C4Result:
    """C4's line rules (lines removed: a word over c4_max_word_length, no terminal punctuation when
    c4_terminal_punct is 'lines', fewer than c4_min_words_per_line words, javascript, policies; citation marks
    cut), its document rules (lorem ipsum, '{', fewer than c4_min_sentences sentences in the lines kept) and the
    text as C4 leaves it: the kept lines, stripped, one per line. As in datatrove, lorem ipsum and '{' count only
    in lines that survive the earlier line rules."""
    off = doc.rules.off
    min_words = 0 if "c4_min_words_per_line" in off else s.c4_min_words_per_line
    counting = s.c4_min_sentences and "c4_too_few_sentences" not in off
    removed: dict[str, int] = {}
    kept, sentences = [], 0
    for raw in doc.text.splitlines():
        line = raw.strip()
        words = line.split()
        why = None
        if s.c4_max_word_length and max(map(len, words), default=0) > s.c4_max_word_length:
            why = "too_long_word"
        else:
            if s.c4_remove_citations and "[" in line:
                line = CITATION_RE.sub("", line)
            if s.c4_terminal_punct != "off" and (not line.endswith(C4_END_PUNCTUATION) or line.endswith("...")):
                if s.c4_terminal_punct == "document":
                    detail = f"line without terminal punctuation: {_quote(line)}"
                    return C4Result(
                        text=doc.text,
                        reject=Reject(rule="c4_no_terminal_punct", value=1, threshold=0, detail=detail),
                        removed=removed,
                    )
                why = "no_terminal_punct"
            elif len(words) < min_words:
                why = "too_few_words"
            else:
                lower = line.lower()
                if s.c4_drop_lorem_ipsum and "lorem ipsum" in lower:
                    return C4Result(
                        text=doc.text,
                        reject=Reject(
                            rule="c4_lorem_ipsum", value=1, threshold=0, detail=f"'lorem ipsum' in {_quote(line)}"
                        ),
                        removed=removed,
                    )
                if s.c4_drop_javascript_lines and "javascript" in lower:
                    why = "javascript"
                elif s.c4_drop_curly_bracket and "{" in line:
                    return C4Result(
                        text=doc.text,
                        reject=Reject(rule="c4_curly_bracket", value=1, threshold=0, detail=f"'{{' in {_quote(line)}"),
                        removed=removed,
                    )
                elif s.c4_drop_policy_lines and POLICY_RE.search(lower):
                    why = "policy"
        if why:
            removed[why] = removed.get(why, 0) + 1
            continue
        if counting and sentences < s.c4_min_sentences:
            sentences += count_sentences(line, s.c4_min_sentences - sentences)
        kept.append(line)
    reject = None
    if counting and sentences < s.c4_min_sentences:
        reject = Reject(
            rule="c4_too_few_sentences",
            value=sentences,
            threshold=s.c4_min_sentences,
            detail=f"sentences {sentences} < min {s.c4_min_sentences}",
        )
    return C4Result(text="\n".join(kept).strip(), reject=reject, removed=removed)
