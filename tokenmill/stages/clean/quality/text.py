"""A text cut once for every rule: lines, paragraphs, words (and their ids for n-grams), the language.

Words follow the English tokenizers datatrove's rules count with (spaCy's rules; NLTK's Treebank before
datatrove 0.10), written as one compiled regex: punctuation marks are words of their own ("," "(" "$" "%" "'s"
"n't" "..." a sentence's final "." and the hyphen of "well-known"), while "3.5", "1,000", "U.S" and "10:30" stay
whole. Texts written without spaces (Chinese, Japanese,
Thai) are counted in characters.
"""

from __future__ import annotations

import re
from functools import cached_property

import numpy as np

from tokenmill.stages.clean.quality.settings import LANGUAGES, OTHER_LANGUAGE, UNKNOWN_LANGUAGE, LanguageRules

_SPLIT = r";@#$%&?!*\[\](){}<>«“‘„»”\"`—"  # always a token of their own
_CLOSE = r"[\]\)}>\"'”’»]*"  # closing marks a sentence's final period may sit before
_END = rf"(?=[\s{_SPLIT}.,:’]|$)"  # where a contraction ("n't", "'s") ends
_INFIX = r"(?<=[^\W_])(?:[-–~](?=[^\W_])|/(?=[^\W\d_]))"  # well-known, up/down: three tokens
_WORD_CHAR = (
    rf"(?:[^\s{_SPLIT}:,.'’/–~-]"  # plain characters
    r"|(?<![^\W_])[-–~/]|[-–~/](?![^\W_])|/(?=\d)"  # -5, 1/2, a trailing hyphen (not an infix)
    r"|[:,](?=\d)"  # 10:30, 1,000
    rf"|(?<!\.)\.(?![.]|{_CLOSE}(?:\s|$))"  # 3.5, example.com (not an ellipsis, not a final period)
    r"|(?<=\.[^\W\d_])\."  # U.S., a.m. keep their last period
    rf"|['’](?!(?i:s|m|d|ll|re|ve)?{_END}))"  # O'Neil, rock'n'roll (not 's, not a closing quote)
)
_SPLIT_WORD = r"(?<!\w)(?i:can(?=not\b)|gon(?=na\b)|got(?=ta\b)|wan(?=na\s)|lem(?=me\b)|gim(?=me\b))"  # can|not
TOKEN_RULES = (
    r"\.{2,}|--"
    rf"|[{_SPLIT}]"
    r"|[:,](?!\d)"
    rf"|{_INFIX}"
    rf"|(?i:n['’]t|['’](?:s|m|d|ll|re|ve)){_END}"
    rf"|['’]{_END}"
    r"|['’](?=\w)(?!(?i:re|ve|ll|m|t|s|d|n)\b)"  # an opening quote
    rf"|{_SPLIT_WORD}"
    r"|(?<!\S)[^\W\d_]\.(?=\s+\S)"  # an initial keeps its period ("F. Scott")
    r"|(?<!\S)-?[.,]?\d[\d,.-]*\.(?=\s+[a-z;:,.!?])"  # so does a number before a lower-case word
    rf"|\.(?={_CLOSE}(?:\s|$))"  # a sentence's final period
    rf"|(?:(?!(?i:n['’]t){_END}){_WORD_CHAR})+"
)
# a shortcut tried first, with the same tokens as TOKEN_RULES alone (faster): a run of letters the rules
# would not cut, ending where a word ends
_LETTER_RUN = rf"(?!{_SPLIT_WORD})[^\W\d_]+(?=[\s{_SPLIT}]|[:,](?!\d)|$)"
TOKEN_RE = re.compile(f"{_LETTER_RUN}|{TOKEN_RULES}")
# TOKEN_RE with each run of whitespace matched too, as an empty word: a search steps over the run at once instead of
# failing every rule at each of its characters (faster). No word starts with whitespace, so the words agree.
_WORD_OR_SPACE_RE = re.compile(rf"\s+|({TOKEN_RE.pattern})")
LETTER_OR_DIGIT_RE = re.compile(r"[^\W_]")
LETTER_RE = re.compile(r"[^\W\d_]")
PARAGRAPH_BREAK_RE = re.compile(r"\n{2,}")
LINE_BREAKS_RE = re.compile(r"\n+")
# scripts written without spaces, by code point: Han (with CJK punctuation and full-width forms), kana, Thai, Hangul
HAN_RE = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")
KANA_RE = re.compile(r"[\u3040-\u30ff]")
THAI_RE = re.compile(r"[\u0e00-\u0e7f]")
HANGUL_RE = re.compile(r"[\uac00-\ud7af\u1100-\u11ff]")
SCRIPT_SAMPLE_CHARS = 2000  # a text's script is judged on its start
SCRIPT_SHARE = 0.3  # share of a script's characters from which a text is in it
ISO_639_3_TO_1 = {
    "eng": "en", "deu": "de", "ger": "de", "fra": "fr", "fre": "fr", "spa": "es", "ita": "it", "por": "pt",
    "nld": "nl", "dut": "nl", "rus": "ru", "pol": "pl", "zho": "zh", "chi": "zh", "cmn": "zh", "yue": "zh",
    "jpn": "ja", "tha": "th", "kor": "ko",
}  # fmt: skip


def tokenize(text: str) -> list[str]:
    """The words of `text`: TOKEN_RE.findall(text), faster."""
    return list(filter(None, _WORD_OR_SPACE_RE.findall(text)))


def widened_ids(gram_ids: np.ndarray, next_words: np.ndarray, n_words: int) -> np.ndarray:
    """Dense ids (0, 1, ...; equal n-grams, equal ids) of the n-grams one word wider than `gram_ids`' (dense too):
    each n-gram's id paired with the word after it, ranked as np.unique's inverse ranks them, without its wrappers.
    Once no two n-grams are equal, no two wider ones are, and their positions serve as ids, with no sort."""
    if int(gram_ids.max(initial=0)) + 1 >= len(gram_ids):
        return np.arange(max(0, len(gram_ids) - 1))
    pairs = gram_ids[:-1] * (n_words + 1) + next_words
    order = pairs.argsort()
    ranked = pairs[order]
    ids = np.empty(len(pairs), np.int64)
    ids[order] = np.cumsum(np.concatenate(([0], ranked[1:] != ranked[:-1])))
    return ids


def language_code(meta: dict) -> str | None:
    """meta.language as a two-letter code where the table knows it ("eng", "en-US", "zh_Hans" -> en, zh)."""
    value = meta.get("language")
    if not isinstance(value, str) or not value.strip():
        return None
    code = re.split(r"[-_]", value.strip().lower(), maxsplit=1)[0]
    return ISO_639_3_TO_1.get(code, code)


def detect_script_language(text: str) -> str:
    """A language from the code points alone, for a record without meta.language: zh or ja (kana), th, ko, else
    UNKNOWN_LANGUAGE (a space-separated script, language unknown)."""
    if text.isascii():
        return UNKNOWN_LANGUAGE
    sample = text[:SCRIPT_SAMPLE_CHARS]
    letters = max(1, len(sample) - sample.count(" ") - sample.count("\n"))
    kana = len(KANA_RE.findall(sample))
    if (len(HAN_RE.findall(sample)) + kana) / letters >= SCRIPT_SHARE:
        return "ja" if kana / letters >= 0.05 else "zh"
    if len(THAI_RE.findall(sample)) / letters >= SCRIPT_SHARE:
        return "th"
    if len(HANGUL_RE.findall(sample)) / letters >= SCRIPT_SHARE:
        return "ko"
    return UNKNOWN_LANGUAGE


def rules_for(language: str) -> LanguageRules:
    return LANGUAGES.get(language, OTHER_LANGUAGE)


class Doc:
    """One text and the pieces the rules measure, each cut at most once, when a rule first asks for it."""

    def __init__(self, text: str, language: str):
        self.text = text
        self.language = language
        self.rules = rules_for(language)
        self._ngram_ids: dict[int, np.ndarray] = {}

    @cached_property
    def lines(self) -> list[str]:
        """Lines as `str.splitlines` cuts them (Gopher's bullet and ellipsis shares)."""
        return self.text.splitlines()

    @cached_property
    def nonblank_lines(self) -> list[str]:
        """Lines split at "\\n" that hold more than whitespace (FineWeb's lines)."""
        return [line for line in self.text.split("\n") if line.strip()]

    @cached_property
    def words(self) -> list[str]:
        if self.rules.tokens == "chars":
            return list("".join(self.text.split()))
        return tokenize(self.text)

    @cached_property
    def distinct_words(self) -> list[str]:
        """Each word once, in the order first seen (word id i is distinct_words[i])."""
        return list(dict.fromkeys(self.words))

    @cached_property
    def word_ids(self) -> np.ndarray:
        """Each word as a small int (equal words, equal ids), the n-gram rules' input."""
        index = {w: i for i, w in enumerate(self.distinct_words)}
        return np.fromiter(map(index.__getitem__, self.words), np.int64, len(self.words))

    @cached_property
    def distinct_lengths(self) -> np.ndarray:
        """Characters of each distinct word (by word id)."""
        return np.fromiter(map(len, self.distinct_words), np.int64, len(self.distinct_words))

    def ngram_ids(self, n: int) -> np.ndarray:
        """Each word n-gram as a small int (equal n-grams, equal ints), grown one word at a time from the widest
        n-grams cut so far: the rules ask for n = 2, 3, ... 10 in turn, and each width is cut once."""
        known = self._ngram_ids
        if not known:
            known[1] = self.word_ids
        width = max(w for w in known if w <= n)
        words, gram_ids = self.word_ids, known[width]
        while width < n:
            gram_ids, width = widened_ids(gram_ids, words[width:], len(words)), width + 1
            known[width] = gram_ids
        return gram_ids

    def words_with(self, pattern: re.Pattern) -> tuple[int, int]:
        """How many words hold a match of `pattern` (a letter matches it), and their characters: each distinct word
        searched once, most of them (all letters) by str.isalpha alone."""
        distinct, search = self.distinct_words, pattern.search
        hit = np.fromiter(map(str.isalpha, distinct), bool, len(distinct))
        for i in np.flatnonzero(~hit).tolist():
            hit[i] = search(distinct[i]) is not None
        per_word = np.bincount(self.word_ids, minlength=len(distinct))[hit]
        return int(per_word.sum()), int(per_word @ self.distinct_lengths[hit])

    @cached_property
    def content_words(self) -> tuple[int, int]:
        """How many words hold a letter or a digit (Gopher's 'non-symbol' words), and their characters."""
        return self.words_with(LETTER_OR_DIGIT_RE)
