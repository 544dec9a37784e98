"""The raw_records settings, declared once: the asset's run config and the plain `ingest` function share them."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from tokenmill.settings import StageSettings


class RawSettings(StageSettings):
    """How the source files are read into records."""

    asset_key: ClassVar[str] = "raw_records"

    text_field: str = Field("text", min_length=1,
                            description="Field (JSON key or CSV column) holding the document text; when a record "
                                        "lacks it, the presets apply")
    presets: bool = Field(True, description="Auto-detect common layouts when `text_field` is absent: chinese-poetry "
                                            "(title/rhythmic + paragraphs/content/para), chat `messages`, dpo "
                                            "`prompt/chosen/rejected`, grpo `prompt/responses/rewards`")
    txt_mode: Literal["blocks", "file"] = Field(
        "blocks", description=".txt files: 'blocks' = one record per blank-line-separated block, 'file' = one per file")
    records_per_shard: int = Field(50_000, ge=1, le=10_000_000,
                                   description="Records per output shard (part-XXXXX.jsonl); a task starts a new "
                                               "shard after this many")
    task_mb: float = Field(8.0, gt=0, le=65_536,
                           description="Input megabytes per parallel task (whole files; a bigger file is a task of "
                                       "its own). Fixed, not derived from the worker count, so the shard layout is "
                                       "the same for any number of workers")
    csv_delimiter: str = Field(",", min_length=1, max_length=1,
                               description="Field delimiter of .csv files (the first row is the header)")

    @model_validator(mode="after")
    def _check_combinations(self) -> RawSettings:
        if self.csv_delimiter in ('"', "\r", "\n"):
            raise ValueError(f"csv_delimiter {self.csv_delimiter!r} is the CSV quote or a line break")
        return self
