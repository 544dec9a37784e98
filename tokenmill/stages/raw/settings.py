"""The raw_records settings, declared once: the asset's run config and the plain `ingest` function share them."""

from __future__ import annotations

import importlib.util
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from tokenmill.settings import StageSettings

Extractor = Literal["tokenmill", "trafilatura", "resiliparse"]
EXTRACTOR_EXTRA = {"trafilatura": "trafilatura", "resiliparse": "resiliparse"}  # extractor -> module it imports


class RawSettings(StageSettings):
    """How the source files are read into records."""

    asset_key: ClassVar[str] = "raw_records"

    text_field: str = Field(
        "text",
        min_length=1,
        description="Field (JSON key or CSV column) holding the document text; when a record "
        "lacks it, the presets apply",
    )
    presets: bool = Field(
        True,
        description="Auto-detect common layouts when `text_field` is absent: chinese-poetry "
        "(title/rhythmic + paragraphs/content/para), chat `messages`, dpo "
        "`prompt/chosen/rejected`, grpo `prompt/responses/rewards`",
    )
    txt_mode: Literal["blocks", "file"] = Field(
        "blocks", description=".txt files: 'blocks' = one record per blank-line-separated block, 'file' = one per file"
    )
    records_per_shard: int = Field(
        50_000,
        ge=1,
        le=10_000_000,
        description="Records per output shard (part-XXXXX.jsonl); a task starts a new shard after this many",
    )
    task_mb: float = Field(
        8.0,
        gt=0,
        le=65_536,
        description="Input megabytes per parallel task (whole files; a bigger file is a task of "
        "its own). Fixed, not derived from the worker count, so the shard layout is "
        "the same for any number of workers",
    )
    csv_delimiter: str = Field(
        ",", min_length=1, max_length=1, description="Field delimiter of .csv files (the first row is the header)"
    )
    max_record_bytes: int = Field(
        32 << 20,
        ge=1,
        le=1 << 30,  # a record is held whole, and parsing a JSON document takes several times its bytes
        description="Largest record read, in (decompressed) bytes: a .jsonl or .csv line, "
        "a .txt block or file, a whole .json document (parsed at once). A "
        "longer one is skipped without being held in memory and rejected "
        "('record_too_large'). 32 MiB: 30x the clean stage's max_chars",
    )
    max_file_bytes: int = Field(
        8 << 30,
        ge=1,
        description="Most decompressed bytes read from one file: a .gz bomb stops here, "
        "the records before are kept and the rest is rejected "
        "('file_too_large')",
    )
    parquet_batch_rows: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Rows of a .parquet file decoded at a time (one batch held in memory; row groups are read "
        "one after another): 1024 web pages of ~5 KB are ~5 MB",
    )
    max_rejected_share: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="Largest share of a batch's records read that are rejected before the batch fails (above it the "
        "source or these settings are wrong, not the records; refused files, never opened, are not in it); the "
        "rejected ones stay in raw_records/_quarantine/<batch>",
    )
    extractor: Extractor = Field(
        "tokenmill",
        description="HTML main-text extractor: 'tokenmill' (ours, the default), 'trafilatura' (its fast mode) or "
        "'resiliparse'; the other two need the `extractors` extra (pip install -e '.[extractors]'). Each record's "
        "meta names the extractor and its version",
    )
    html_max_bytes: int = Field(
        4 << 20,
        ge=1,
        le=1 << 30,
        description="Largest HTML page extracted (a WARC response payload or an .html file), in bytes; a bigger one "
        "is rejected ('record_too_large') before extraction. 4 MiB: 4x Common Crawl's 1 MiB payload cap",
    )
    html_max_tags: int = Field(
        50_000,
        ge=1,
        le=10_000_000,
        description="Most tags ('<' characters) in a page extracted; extraction time grows with them (~5 us each "
        "for tokenmill's extractor, ~0.5 ms for trafilatura's), so a bigger page is rejected ('record_too_large') "
        "before extraction: a bound on time per page that gives the same output on any machine. 50,000: 2.5x a "
        "1 MB Wikipedia article",
    )
    follow_outside_symlinks: bool = Field(
        False, description="Read symlinks that point outside the source folder (otherwise rejected as 'outside_source')"
    )

    @model_validator(mode="after")
    def _check_combinations(self) -> RawSettings:
        if self.csv_delimiter in ('"', "\r", "\n"):
            raise ValueError(f"csv_delimiter {self.csv_delimiter!r} is the CSV quote or a line break")
        module = EXTRACTOR_EXTRA.get(self.extractor)
        if module is not None and importlib.util.find_spec(module) is None:
            raise ValueError(f"extractor {self.extractor!r} needs the {module} package: pip install -e '.[extractors]'")
        if self.max_record_bytes > self.max_file_bytes:
            raise ValueError(
                f"max_record_bytes ({self.max_record_bytes}) must not exceed max_file_bytes ({self.max_file_bytes})"
            )
        return self
