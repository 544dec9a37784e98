"""tokenizer and tokenized_bins: a byte-level BPE tokenizer (frozen once trained), then versioned training-ready
token shards that each new source batch is appended to (docs/format.md)."""

import dagster as dg

from assets.checks import TOKEN_SHARDS_CONSISTENT, refuse_unless_passed, token_shards_consistent
from assets.dedup import deduped_jsonl
from assets.metadata import compute_metadata, tokenized_bins_metadata, tokenizer_metadata
from resources import Compute, DataRoot
from tokenmill.common.io import batch_folders, staged_output
from tokenmill.errors import CheckFailedError, StaleUpstreamError
from tokenmill.stages import tokenize
from tokenmill.stages.tokenize import ShardSettings, TokenizerSettings, tokenize_batches, train_tokenizer
from tokenmill.stages.tokenize.frozen import frozen_tokenizer
from tokenmill.stages.tokenize.versions import added_batches


class TokenizerConfig(TokenizerSettings, dg.Config):
    """How the tokenizer is trained, or which existing tokenizer.json is used."""


class ShardConfig(ShardSettings, dg.Config):
    """The training type's rendering, the train/val split, shard size, token dtype and version retention."""


@dg.asset(group_name="tokenize", kinds={"python", "huggingface"}, deps=[deduped_jsonl], code_version=tokenize.VERSION)
def tokenizer(
    context: dg.AssetExecutionContext, config: TokenizerConfig, data_root: DataRoot, compute: Compute
) -> dg.MaterializeResult:
    """Byte-level BPE (HF tokenizers) trained on a bounded, deterministic sample of deduped_jsonl (records with the
    smallest id hash; 1 record in 20 held out to measure chars per token), with special tokens `<s>`, `</s>`,
    `<pad>`, `<|title|>`, `<|author|>`, `<|content|>`, `<|system|>`, `<|user|>`, `<|assistant|>`, `<|end|>` at ids
    0-9; or an existing tokenizer.json when `tokenizer_path` is set. Frozen once trained: later batches reuse it
    (`retrain: true` trains a new one and starts a new generation of tokenized_bins)."""
    folder = data_root.path("tokenizer")
    if (frozen := frozen_tokenizer(folder, config)) is not None:
        context.log.info(f"tokenizer: frozen, reusing {folder} (set retrain: true to train a new one)")
        return dg.MaterializeResult(metadata={**tokenizer_metadata(frozen, folder), "frozen": True})
    with compute.activated(context, data_root) as usage, staged_output(folder) as out:
        result = train_tokenizer(data_root.path("deduped_jsonl"), out, config, log=context.log)
    return dg.MaterializeResult(
        metadata={**tokenizer_metadata(result, folder), "frozen": False, **compute_metadata(usage)}
    )


@dg.asset(
    group_name="tokenize",
    kinds={"python", "numpy"},
    deps=[deduped_jsonl, tokenizer],
    code_version=tokenize.VERSION,
    check_specs=[TOKEN_SHARDS_CONSISTENT],
)
def tokenized_bins(context: dg.AssetExecutionContext, config: ShardConfig, data_root: DataRoot, compute: Compute):
    """deduped_jsonl as training-ready token shards in train/ and val/ (split by a hash of the record id): one
    headerless little-endian .bin per key plus meta.json with record offsets. Each run appends the batches not yet
    in the dataset and publishes a new version of each split's manifest (dataset.json is the latest; readers keep
    the version they opened; old versions are removed after `retention_hours`); a new tokenizer or new settings
    re-encode every batch as a new generation. training_type picks the rendering: auto (the default: conditional
    when >= 10% of records carry a title or author, else seq; chosen once per generation), seq, conditional
    (title/author prefix loss-masked, metadata dropout), sft (chat template, assistant turns trained), dpo, grpo."""
    bins, deduped, tokenizer_dir = (data_root.path(k) for k in ("tokenized_bins", "deduped_jsonl", "tokenizer"))
    checks = []

    def check(version: int) -> None:  # blocking: a version that fails is never published
        added = [
            deduped / key for key in added_batches(bins, version)
        ]  # earlier shards were checked, and are immutable
        checks.append(token_shards_consistent(bins, added, tokenizer_dir, version))
        refuse_unless_passed(checks[-1])

    batches = [(p.name, p) for p in batch_folders(deduped)]
    if not batches:  # an empty list would publish an empty generation over the readers' dataset
        raise StaleUpstreamError(f"{deduped} holds no batch: materialize deduped_jsonl first")
    try:
        with compute.activated(context, data_root) as usage:
            result = tokenize_batches(batches, tokenizer_dir, bins, config, log=context.log, check=check)
    except CheckFailedError:
        yield from checks  # the failed evaluation is recorded before the step fails
        raise
    if not result.new_version:  # nothing new was published: the check describes the version readers open
        checks.append(token_shards_consistent(bins, [batches[-1][1]], tokenizer_dir))
    yield dg.MaterializeResult(
        metadata={**tokenized_bins_metadata(result, data_root.path("tokenized_bins")), **compute_metadata(usage)},
        check_results=checks,
    )
