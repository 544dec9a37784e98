"""tokenizer and tokenized_bins: a byte-level BPE tokenizer, then training-ready token shards (docs/format.md)."""

import dagster as dg

from assets.checks import TOKEN_SHARDS_CONSISTENT, publish_only_if_passed, token_shards_consistent
from assets.metadata import compute_metadata, tokenized_bins_metadata, tokenizer_metadata
from resources import Compute, DataRoot
from tokenmill.common.io import staged_output
from tokenmill.stages.tokenize import ShardSettings, TokenizerSettings, tokenize_corpus, train_tokenizer


class TokenizerConfig(TokenizerSettings, dg.Config):
    """How the tokenizer is trained, or which existing tokenizer.json is used."""


class ShardConfig(ShardSettings, dg.Config):
    """The training type's rendering, the train/val split, shard size and token dtype."""


@dg.asset(group_name="tokenize", kinds={"python", "huggingface"}, deps=["deduped_jsonl"], code_version="1")
def tokenizer(
    context: dg.AssetExecutionContext, config: TokenizerConfig, data_root: DataRoot, compute: Compute
) -> dg.MaterializeResult:
    """Byte-level BPE (HF tokenizers) trained on a bounded, deterministic sample of deduped_jsonl (records with the
    smallest id hash; 1 record in 20 held out to measure chars per token), with special tokens <s>, </s>, <pad>,
    <|title|>, <|author|>, <|content|>, <|system|>, <|user|>, <|assistant|>, <|end|> at ids 0-9; or an existing
    tokenizer.json when `tokenizer_path` is set."""
    with compute.activated(context, data_root) as usage, staged_output(data_root.path("tokenizer")) as out:
        stats = train_tokenizer(data_root.path("deduped_jsonl"), out, config, log=context.log)
    return dg.MaterializeResult(
        metadata={**tokenizer_metadata(stats, data_root.path("tokenizer")), **compute_metadata(usage)}
    )


@dg.asset(
    group_name="tokenize",
    kinds={"python", "numpy"},
    deps=["deduped_jsonl", "tokenizer"],
    code_version="1",
    check_specs=[TOKEN_SHARDS_CONSISTENT],
)
def tokenized_bins(context: dg.AssetExecutionContext, config: ShardConfig, data_root: DataRoot, compute: Compute):
    """deduped_jsonl as training-ready token shards in train/ and val/ (split by a hash of the record id): one
    headerless little-endian .bin per key plus meta.json with record offsets, dataset.json written last (it records
    the SHA-256 of the tokenizer the run started from), byte-identical for the same input and config. training_type
    picks the rendering: seq, conditional (title/author prefix loss-masked, metadata dropout), sft (chat template,
    assistant turns trained), dpo, grpo."""
    with compute.activated(context, data_root) as usage, staged_output(data_root.path("tokenized_bins")) as out:
        stats = tokenize_corpus(
            data_root.path("deduped_jsonl"), data_root.path("tokenizer"), out, config, log=context.log
        )
        check = token_shards_consistent(out, data_root.path("deduped_jsonl"), data_root.path("tokenizer"))
        yield from publish_only_if_passed(check)
    yield dg.MaterializeResult(
        metadata={**tokenized_bins_metadata(stats, data_root.path("tokenized_bins")), **compute_metadata(usage)},
        check_results=[check],
    )
