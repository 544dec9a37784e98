"""The web quality rules' settings, declared once, and their per-language table.

`QualitySettings` holds every threshold as a flat, prefixed field (gopher_*, c4_*, fineweb_*): Dagster's launchpad
schema refuses a nested plain pydantic model, and `CleanSettings` subclasses this class so the asset's config and
`clean_corpus` share the fields. Defaults are FineWeb's (datatrove's GopherRepetitionFilter, GopherQualityFilter,
C4QualityFilter(filter_no_terminal_punct=False) and FineWebQualityFilter defaults), which are Gopher's and C4's
published thresholds except where FineWeb changed them.

`LANGUAGES` says, per language, how a text is cut into words and which rules do not apply to it; the thresholds
themselves are the settings' for every language.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from tokenmill.stages.clean.quality.stop_words import ANY_LANGUAGE, STOP_WORDS


class QualitySettings(BaseModel):
    """Which profile a batch gets and the thresholds of the web rules (a threshold of 0 turns a `max_` rule off
    where noted)."""

    quality: Literal["auto", "web", "curated"] = Field(
        "auto",
        description="'web': the web quality and repetition rules run after today's cleaning; 'curated': today's "
        "cleaning only; 'auto': 'web' for a batch whose records mostly (half or more) come from WARC/HTML files or "
        "carry meta.url, else 'curated'",
    )
    gopher_min_words: int = Field(50, ge=0, description="Gopher: fewest words (symbol-only tokens not counted)")
    gopher_max_words: int = Field(100_000, ge=1, description="Gopher: most words")
    gopher_min_mean_word_length: float = Field(3.0, ge=0, le=100, description="Gopher: shortest mean word length")
    gopher_max_mean_word_length: float = Field(10.0, ge=0, le=100, description="Gopher: longest mean word length")
    gopher_max_symbol_word_ratio: float = Field(
        0.1, ge=0, le=10, description="Gopher: most '#' per word, and most '...'/'…' per word (0: off)"
    )
    gopher_max_bullet_lines_ratio: float = Field(
        0.9, ge=0, le=1, description="Gopher: largest share of lines starting with a bullet ('•' or '-')"
    )
    gopher_max_ellipsis_lines_ratio: float = Field(
        0.3, ge=0, le=1, description="Gopher: largest share of lines ending with an ellipsis ('...' or '…')"
    )
    gopher_min_alpha_words_ratio: float = Field(
        0.8, ge=0, le=1, description="Gopher: smallest share of words (punctuation tokens included) with a letter"
    )
    gopher_min_stop_words: int = Field(
        2, ge=0, le=100, description="Gopher: fewest distinct stop words of the text's language (0: off)"
    )
    gopher_max_dup_line_frac: float = Field(0.3, ge=0, le=1, description="Gopher: largest share of repeated lines")
    gopher_max_dup_para_frac: float = Field(0.3, ge=0, le=1, description="Gopher: largest share of repeated paragraphs")
    gopher_max_dup_line_char_frac: float = Field(
        0.2, ge=0, le=1, description="Gopher: largest share of the text's characters in repeated lines"
    )
    gopher_max_dup_para_char_frac: float = Field(
        0.2, ge=0, le=1, description="Gopher: largest share of the text's characters in repeated paragraphs"
    )
    gopher_max_top_2gram_char_frac: float = Field(
        0.2, ge=0, le=1, description="Gopher: largest share of characters in the most frequent word 2-gram"
    )
    gopher_max_top_3gram_char_frac: float = Field(0.18, ge=0, le=1, description="As the 2-gram limit, for 3-grams")
    gopher_max_top_4gram_char_frac: float = Field(0.16, ge=0, le=1, description="As the 2-gram limit, for 4-grams")
    gopher_max_dup_5gram_char_frac: float = Field(
        0.15, ge=0, le=1, description="Gopher: largest share of characters in repeated word 5-grams"
    )
    gopher_max_dup_6gram_char_frac: float = Field(0.14, ge=0, le=1, description="As the 5-gram limit, for 6-grams")
    gopher_max_dup_7gram_char_frac: float = Field(0.13, ge=0, le=1, description="As the 5-gram limit, for 7-grams")
    gopher_max_dup_8gram_char_frac: float = Field(0.12, ge=0, le=1, description="As the 5-gram limit, for 8-grams")
    gopher_max_dup_9gram_char_frac: float = Field(0.11, ge=0, le=1, description="As the 5-gram limit, for 9-grams")
    gopher_max_dup_10gram_char_frac: float = Field(0.10, ge=0, le=1, description="As the 5-gram limit, for 10-grams")
    c4_terminal_punct: Literal["off", "lines", "document"] = Field(
        "off",
        description="C4: lines not ending in terminal punctuation (. ? ! \" ') are removed ('lines', C4's rule), the "
        "document is dropped when it has one ('document'), or nothing happens ('off', FineWeb's choice)",
    )
    c4_min_words_per_line: int = Field(
        3, ge=0, le=100, description="C4: lines with fewer whitespace-separated words are removed (0: off)"
    )
    c4_max_word_length: int = Field(
        1000, ge=0, description="C4: lines holding a longer word (characters) are removed (0: off)"
    )
    c4_min_sentences: int = Field(
        5, ge=0, le=1000, description="C4: documents with fewer sentences in the lines kept are dropped (0: off)"
    )
    c4_remove_citations: bool = Field(True, description="C4: remove Wikipedia-style citation marks ([1], [edit])")
    c4_drop_javascript_lines: bool = Field(True, description="C4: remove lines mentioning javascript")
    c4_drop_policy_lines: bool = Field(
        True, description="C4: remove lines mentioning terms of use, privacy or cookie policies"
    )
    c4_drop_lorem_ipsum: bool = Field(True, description="C4: drop documents holding 'lorem ipsum'")
    c4_drop_curly_bracket: bool = Field(True, description="C4: drop documents holding '{' (code, templates)")
    fineweb_min_punct_lines_ratio: float = Field(
        0.12, ge=0, le=1, description="FineWeb: smallest share of lines ending in terminal punctuation"
    )
    fineweb_max_short_lines_ratio: float = Field(
        0.67, ge=0, le=1, description="FineWeb: largest share of lines of at most fineweb_short_line_chars"
    )
    fineweb_short_line_chars: int = Field(30, ge=1, le=10_000, description="FineWeb: what a short line is")
    fineweb_max_dup_line_char_ratio: float = Field(
        0.01,
        ge=0,
        le=1,
        description="FineWeb: largest share of characters (newlines not counted) in lines repeating an earlier one",
    )
    fineweb_max_newline_word_ratio: float = Field(
        0.3, ge=0, le=10, description="FineWeb: most line breaks per word (list-like documents)"
    )

    def top_ngram_limits(self) -> dict[int, float]:
        return {
            2: self.gopher_max_top_2gram_char_frac,
            3: self.gopher_max_top_3gram_char_frac,
            4: self.gopher_max_top_4gram_char_frac,
        }

    def dup_ngram_limits(self) -> dict[int, float]:
        return {n: getattr(self, f"gopher_max_dup_{n}gram_char_frac") for n in range(5, 11)}


@dataclass(frozen=True, kw_only=True)
class LanguageRules:
    """How the rules see a language: its words and the rules that are off for it (and why)."""

    tokens: Literal["words", "chars"]
    """'words': NLTK-like word tokens; 'chars': every non-space character is a word (no spaces between words)."""
    stop_words: frozenset[str]
    """Empty: the stop-word rule is off (no list shipped, or words cannot be cut from the text)."""
    off: frozenset[str] = frozenset()
    why_off: str = ""


# rules that count whitespace-separated words or word lengths, meaningless where words are not separated
_UNSPACED_OFF = frozenset(
    {"gopher_mean_word_length", "c4_min_words_per_line", "c4_too_few_sentences", "fineweb_list_like"}
)
_UNSPACED_WHY = (
    "words are not separated by spaces: counted in characters (mean word length is always 1), and C4's words per "
    "line, sentences (., ?, ! only) and FineWeb's line breaks per word do not apply"
)
UNKNOWN_LANGUAGE = "und"  # ISO 639-2 "undetermined": a space-separated script, language not known
LANGUAGES: dict[str, LanguageRules] = {
    **{
        lang: LanguageRules(tokens="words", stop_words=words)
        for lang, words in STOP_WORDS.items()
        if lang not in ("zh", "ja")
    },
    "zh": LanguageRules(tokens="chars", stop_words=STOP_WORDS["zh"], off=_UNSPACED_OFF, why_off=_UNSPACED_WHY),
    "ja": LanguageRules(tokens="chars", stop_words=STOP_WORDS["ja"], off=_UNSPACED_OFF, why_off=_UNSPACED_WHY),
    "th": LanguageRules(
        tokens="chars",
        stop_words=frozenset(),
        off=_UNSPACED_OFF,
        why_off=_UNSPACED_WHY + "; no Thai segmenter: no stop words",
    ),
    "ko": LanguageRules(
        tokens="words",
        stop_words=frozenset(),
        why_off="Korean particles attach to words: no stop words without a segmenter",
    ),
    UNKNOWN_LANGUAGE: LanguageRules(
        tokens="words", stop_words=ANY_LANGUAGE, why_off="language unknown: the stop words of every shipped list"
    ),
}
OTHER_LANGUAGE = LanguageRules(
    tokens="words", stop_words=frozenset(), why_off="no stop-word list shipped for this language"
)
"""A language with spaces between words that the table does not name."""
