"""The cleaned_jsonl settings, declared once: the asset's run config and the plain `clean_corpus` share them."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from tokenmill.settings import StageSettings
from tokenmill.stages.clean.language import check_languages
from tokenmill.stages.clean.pii import placeholder_problem
from tokenmill.stages.clean.quality.settings import QualitySettings


class CleanSettings(StageSettings, QualitySettings):
    """Which repairs run, how boilerplate is detected, the limits of the garbage filters, and the web quality
    profile with its rules' thresholds (`QualitySettings`: quality, gopher_*, c4_*, fineweb_*)."""

    asset_key: ClassVar[str] = "cleaned_jsonl"

    normalization: Literal["NFC", "NFKC", "none"] = Field(
        "NFC",
        description="Unicode normalization: 'NFC' (keeps full-width CJK punctuation), 'NFKC' (also folds "
        "full-width ASCII, ligatures, circled digits), or 'none'",
    )
    fix_mojibake: bool = Field(
        True,
        description="Repair mojibake (UTF-8 read with the wrong codec) and HTML "
        "entities with ftfy (no width/quote/line-break changes)",
    )
    collapse_inner_spaces: bool = Field(
        True,
        description="Collapse a run of spaces inside a line to one space; a text with an indented line (a tab or "
        "two spaces: code, aligned text) keeps its spacing",
    )
    extract_metadata: bool = Field(
        True,
        description="Move title/author/dynasty/date/source header lines "
        "(Title:/Author:/作者：/朝代：/By ...) from the top of the text "
        "into meta",
    )
    max_header_lines: int = Field(
        6, ge=0, le=100, description="How many lines at the top of a text may be metadata header lines"
    )
    boilerplate: bool = Field(True, description="Strip boilerplate lines (two-pass corpus-wide detector)")
    bp_min_df: int = Field(
        5, ge=1, description="A line must occur in at least this many documents to be a boilerplate candidate"
    )
    bp_threshold: float = Field(
        0.65,
        ge=0.0,
        le=1.0,
        description="Joint boilerplate score (df, position, template, short; 0..1) from "
        "which a candidate line is stripped",
    )
    bp_edge_frac: float = Field(
        0.05,
        ge=0.0,
        le=0.5,
        description="Header/footer zone: the first/last share of a document's lines (at least one line each)",
    )
    min_chars: int = Field(
        10,
        ge=0,
        description="Records with fewer non-whitespace characters after cleaning are "
        "rejected ('too_short'); a 20-character jueju passes",
    )
    max_chars: int = Field(
        1_000_000,
        ge=0,
        description="Records longer than this (characters, before cleaning) are "
        "rejected ('too_long'); 0 disables the guard",
    )
    max_placeholder_ratio: float = Field(
        0.10,
        ge=0.0,
        le=1.0,
        description="Reject when more than this share of characters are "
        "placeholders (U+FFFD, □, ■, private use, stray ?)",
    )
    max_dup_line_frac: float = Field(
        0.40,
        ge=0.0,
        le=1.0,
        description="Reject when more than this share of lines repeat an earlier line "
        "(texts of 4+ lines; Gopher uses 0.30 for web text, poetry with "
        "refrains needs more room)",
    )
    max_dup_line_char_frac: float = Field(
        0.40,
        ge=0.0,
        le=1.0,
        description="Reject when more than this share of characters sits in repeated lines (texts of 4+ lines)",
    )
    max_top_2gram_frac: float = Field(
        0.60,
        ge=0.0,
        le=1.0,
        description="Reject when the most frequent word 2-gram (CJK: character "
        "2-gram) covers more than this share of the tokens (texts of 50+ "
        "words or 80+ CJK characters). Spam sits near 1.0; on "
        "chinese-poetry (90k poems) no genuine poem passes 0.6, while "
        "refrain poems of the Shijing and Yuan qu reach 0.5",
    )
    max_top_3gram_frac: float = Field(0.60, ge=0.0, le=1.0, description="As max_top_2gram_frac, for 3-grams")
    max_top_4gram_frac: float = Field(0.60, ge=0.0, le=1.0, description="As max_top_2gram_frac, for 4-grams")
    language_id: bool = Field(
        True,
        description="Identify each kept record's language (meta.language, ISO 639-1 where one exists, else ISO "
        "639-3; meta.language_score 0..1) with CLD2, and py3langid where CLD2 is unsure",
    )
    languages: list[str] = Field(
        [],
        description="Language codes to keep (e.g. ['en', 'de']); others are rejected ('language'). Empty keeps all",
    )
    min_language_score: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Reject records whose language score is below this ('language'); 0 keeps all",
    )
    pii_mask: bool = Field(
        True,
        description="Replace e-mail and IP addresses in the text by placeholders before anything is written "
        "(rules and near misses: tokenmill/stages/clean/pii.py)",
    )
    pii_phone: bool = Field(False, description="Also mask phone numbers (+<country> ..., (555) 123-4567)")
    pii_ip_scope: Literal["public", "all"] = Field(
        "public",
        description="'public': mask globally routable IP addresses only (private, loopback, documentation ranges "
        "identify no one); 'all': every address",
    )
    pii_email_placeholder: str = Field("<EMAIL>", min_length=1, max_length=64, description="Replaces an e-mail")
    pii_ip_placeholder: str = Field("<IP_ADDRESS>", min_length=1, max_length=64, description="Replaces an IP")
    pii_phone_placeholder: str = Field(
        "<PHONE_NUMBER>", min_length=1, max_length=64, description="Replaces a phone number"
    )
    decontaminate: list[str] = Field(
        [],
        description="Evaluation files (.jsonl, .jsonl.gz, .json, .parquet; relative to the run's directory) whose "
        "items no record may share an n-gram with (rules: tokenmill/stages/clean/decontam.py)",
    )
    decontaminate_field: str = Field(
        "text",
        min_length=1,
        description="The evaluation items' text field; rows without it use the first of question, prompt, "
        "problem, input, instruction, query, context, ctx, sentence, passage",
    )
    decontaminate_mode: Literal["drop", "flag"] = Field(
        "drop",
        description="'drop': a contaminated record is rejected ('contamination'); 'flag': it is kept with "
        "meta.contamination naming the evaluation file and item",
    )
    decontaminate_words: int = Field(
        13, ge=5, le=100, description="Words per n-gram for texts in space-separated scripts"
    )
    decontaminate_chars: int = Field(
        50, ge=10, le=500, description="Characters per n-gram for CJK, Thai, ... texts (written without spaces)"
    )
    quality_model: str = Field(
        "",
        description="A quality classifier scoring every kept record (meta.quality_score, meta.quality_model): a "
        "fastText .bin, a `tokenmill train-quality` folder or a transformers sequence-classification folder, "
        "relative to the run's directory; read from disk only. Empty: no model step",
    )
    quality_model_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where a transformers model scores: 'auto' takes CUDA when torch sees a GPU"
    )
    quality_max_tokens: int = Field(
        512, ge=1, le=100_000, description="Each text is cut to this many tokens (fastText: words) before scoring"
    )
    quality_threshold: float | None = Field(
        None, description="Keep records scoring at least this; the others are rejected ('quality_score')"
    )
    quality_keep_share: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="Keep the top share of each batch by score (round(share x records), ties broken by record "
        "id); the others are rejected ('quality_score')",
    )
    quality_per_language: bool = Field(
        False,
        description="Apply quality_keep_share within each meta.language (identified, or the source's) instead of "
        "over the whole batch",
    )
    examples: int = Field(6, ge=0, le=1000, description="Before/after examples kept in _stats.json")

    @field_validator("languages")
    @classmethod
    def _known_languages(cls, codes: list[str]) -> list[str]:
        return check_languages(codes) if codes else codes

    @field_validator("pii_email_placeholder", "pii_ip_placeholder", "pii_phone_placeholder")
    @classmethod
    def _usable_placeholder(cls, placeholder: str) -> str:
        problem = placeholder_problem(placeholder)
        if problem:
            raise ValueError(f"placeholder {placeholder!r} {problem}")
        return placeholder

    @field_validator("decontaminate")
    @classmethod
    def _distinct_files(cls, files: list[str]) -> list[str]:
        if any(not f.strip() for f in files):
            raise ValueError("an evaluation file path is empty")
        if len(set(files)) != len(files):
            raise ValueError("an evaluation file is named twice")
        return files

    @model_validator(mode="after")
    def _check_combinations(self) -> CleanSettings:
        if not self.language_id and (self.languages or self.min_language_score):
            raise ValueError("languages and min_language_score need language_id on")
        if (self.quality_threshold is not None or self.quality_keep_share is not None) and not self.quality_model:
            raise ValueError("quality_threshold and quality_keep_share need a quality_model")
        if self.quality_threshold is not None and self.quality_keep_share is not None:
            raise ValueError("quality_threshold and quality_keep_share: set one of them, not both")
        if self.quality_per_language and self.quality_keep_share is None:
            raise ValueError("quality_per_language needs quality_keep_share")
        if self.max_chars and self.min_chars > self.max_chars:
            raise ValueError(
                f"min_chars ({self.min_chars}) must not exceed max_chars ({self.max_chars}) "
                "unless max_chars is 0 (no limit)"
            )
        return self

    def ngram_limits(self) -> dict[int, float]:
        """n -> the largest share of tokens the most frequent n-gram may cover."""
        return {2: self.max_top_2gram_frac, 3: self.max_top_3gram_frac, 4: self.max_top_4gram_frac}
