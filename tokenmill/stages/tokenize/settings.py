"""The tokenizer and tokenized_bins settings, declared once: the assets' run config and the plain stage functions
share them."""

from __future__ import annotations

from typing import ClassVar, Literal, get_args

from pydantic import Field, model_validator

from tokenmill.settings import StageSettings
from tokenmill_loader.format import SPECIAL_TOKENS, TOKEN_DTYPES, TRAINING_TYPES, dtype_fits

BYTE_TOKENS = 256  # a byte-level BPE starts from every byte
# the largest vocabulary trained: the BPE trainer reserves ~32 bytes per entry up front (2^24: 0.5 GiB measured;
# 2^32 aborted the process allocating 283 GB), and more ids than this never occur in a trainable sample
MAX_TRAINED_VOCAB = 2**24
# a task holds its byte range and ~10x that in token arrays: 256 MiB keeps a worker near 3 GiB
TASK_BYTES_LIMIT = 256 << 20
# training_type auto: conditional from this share of records with a title or author. Below it the conditioning is
# learned from too few records to matter while every other record still gets a masked <|content|>; a share rather
# than "any record" so one stray titled record does not switch a plain-text corpus (demo corpus: 45%)
AUTO_CONDITIONAL_SHARE = 0.1
Pretokenizer = Literal["punct_attach", "bytelevel"]
PRETOKENIZERS = get_args(Pretokenizer)
# the settings' choices spelled out for the type checker: the loader's format names them (checked here)
TrainingTypeSetting = Literal["auto", "seq", "conditional", "sft", "dpo", "grpo"]
TokenDtypeSetting = Literal["auto", "uint16", "uint32"]
assert get_args(TrainingTypeSetting) == ("auto", *TRAINING_TYPES)
assert get_args(TokenDtypeSetting) == ("auto", *TOKEN_DTYPES)


class TokenizerSettings(StageSettings):
    """How the tokenizer is trained (or which existing one is used)."""

    asset_key: ClassVar[str] = "tokenizer"

    vocab_size: int = Field(
        4096,
        ge=1,
        le=MAX_TRAINED_VOCAB,
        description="Vocabulary size including the special tokens (uint16 token files up to 65,536; at most 2^24)",
    )
    min_frequency: int = Field(2, ge=0, le=10**9, description="A pair must occur this often in the sample to be merged")
    sample_chars: int = Field(
        1_000_000,
        ge=0,
        description="Characters of training text sampled (records with the smallest id hash first); 0 = every record",
    )
    held_out_chars: int = Field(
        200_000,
        ge=0,
        description="Characters of held-out text (records never trained on) used to measure chars per token",
    )
    pretokenizer: Pretokenizer = Field(
        "punct_attach",
        description="punct_attach: GPT-2 byte-level split, but punctuation stays with the word "
        'before it ("明月光，"), so BPE can absorb it (isolated punctuation 13% -> 2% '
        "of poetry tokens, 4% fewer tokens); bytelevel: plain GPT-2 split",
    )
    tokenizer_path: str = Field(
        "",
        description="An existing tokenizer.json (or a folder holding one) to use "
        "instead of training; empty = train. Nothing is downloaded",
    )
    retrain: bool = Field(
        False,
        description="Train again although a tokenizer exists. The tokenizer is frozen once trained: later batches "
        "are encoded with it, so their tokens match the earlier shards. Retraining re-encodes every batch as a "
        "new generation of tokenized_bins (readers keep the versions they opened)",
    )

    @model_validator(mode="after")
    def _check_vocabulary(self) -> TokenizerSettings:
        floor = len(SPECIAL_TOKENS) + BYTE_TOKENS
        if not self.tokenizer_path and self.vocab_size < floor:
            raise ValueError(
                f"vocab_size {self.vocab_size} is below the {len(SPECIAL_TOKENS)} special tokens + "
                f"{BYTE_TOKENS} byte tokens a byte-level BPE starts from ({floor})"
            )
        return self


class ShardSettings(StageSettings):
    """How records become token shards."""

    asset_key: ClassVar[str] = "tokenized_bins"

    training_type: TrainingTypeSetting = Field(
        "auto",
        description="auto | seq | conditional | sft | dpo | grpo (renderings in docs/format.md). auto: conditional "
        f"when at least {AUTO_CONDITIONAL_SHARE:.0%} of the records carry a title or author, else seq; chosen once "
        "per dataset generation",
    )
    val_fraction: float = Field(
        0.05,
        ge=0.0,
        lt=1.0,
        description="Share of documents in val, chosen by a hash of the record id (stable when records are added). "
        "Above 0, val never stays empty when there are 2 records or more: the record with the smallest split hash "
        "moves there when a new generation's hash split leaves val empty",
    )
    min_val_records: int = Field(
        10,
        ge=0,
        description="Fewer val records than this is warned about (val_warning in the stats and the UI): a val loss "
        "averaged over a handful of documents mostly measures which documents they are. 0: never warn",
    )
    metadata_dropout: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="conditional: share of documents rendered without title/author (per document, seeded by id)",
    )
    seed: int = Field(42, ge=0, le=2**63 - 1, description="Seed of the per-document metadata dropout")
    shard_tokens: int = Field(
        32_000_000,
        ge=1,
        le=2**32,  # a shard's record offsets and ids are held until it closes
        description="A shard is closed before a record would take it past this many tokens (records never straddle)",
    )
    token_dtype: TokenDtypeSetting = Field(
        "auto",
        description="auto (uint16 when the vocabulary fits, else uint32) | uint16 | uint32; a vocabulary "
        "too large for the dtype is refused",
    )
    batch_records: int = Field(2048, ge=1, le=10**7, description="Records per encode_batch call inside a task")
    task_bytes: int = Field(
        0,
        ge=0,
        le=TASK_BYTES_LIMIT,
        description="Input bytes per task (0: about 8 tasks per worker, 256 KiB..16 MiB); never changes the output",
    )
    retention_hours: float = Field(
        24.0,
        ge=0.0,
        le=24.0 * 365 * 100,
        description="A superseded dataset version (its manifest, and the shards no kept version names) is removed "
        "once a newer version has been published for this long: a reader that opened it can read it that long",
    )
    keep_versions: int = Field(
        1, ge=1, le=10**6, description="The newest versions kept whatever their age (1: the latest only)"
    )

    # the settings that change the tokens of a record: another value starts a new dataset generation (every batch
    # encoded again); the others (shard size, task cut, retention, the val warning) apply to what is written from
    # then on. A version's manifest records them with training_type resolved (never "auto")
    ENCODING: ClassVar[tuple[str, ...]] = ("training_type", "val_fraction", "metadata_dropout", "seed", "token_dtype")

    def encoding(self) -> dict:
        return {k: getattr(self, k) for k in self.ENCODING}

    def run_problems(self, run: dict[str, StageSettings]) -> list[str]:
        """An explicit token_dtype must hold the vocabulary the same run trains (checked again on the real file)."""
        tokenizer = run.get(TokenizerSettings.asset_key)
        if (
            self.token_dtype == "auto"
            or not isinstance(tokenizer, TokenizerSettings)
            or tokenizer.tokenizer_path
            or dtype_fits(tokenizer.vocab_size, self.token_dtype)
        ):
            return []
        return [
            f"{self.asset_key}.token_dtype: {self.token_dtype} cannot hold the {tokenizer.vocab_size:,} ids of "
            f"tokenizer.vocab_size; use uint32 or auto"
        ]
