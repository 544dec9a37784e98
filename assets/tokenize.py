"""tokenizer and tokenized_bins: a byte-level BPE tokenizer, then training-ready token shards (docs/format.md)."""

import dagster as dg
from pydantic import Field

from resources import DataRoot
from tokenmill.common.io import staged_output
from tokenmill.shards import ShardSettings, tokenize_corpus
from tokenmill.tokenization import TokenizerSettings, train_tokenizer


class TokenizerConfig(dg.Config):
    vocab_size: int = Field(default=TokenizerSettings.vocab_size,
                            description="Vocabulary size including special tokens (uint16 token files up to 65,536)")
    min_frequency: int = Field(default=TokenizerSettings.min_frequency,
                               description="A pair must occur this often in the sample to be merged")
    sample_chars: int = Field(default=TokenizerSettings.sample_chars,
                              description="Characters of training text, records with the smallest id hash first (0: all)")
    held_out_chars: int = Field(default=TokenizerSettings.held_out_chars,
                                description="Characters of never-trained-on text used to measure chars per token")
    pretokenizer: str = Field(default=TokenizerSettings.pretokenizer,
                              description="punct_attach (punctuation stays on the word before it) | bytelevel (GPT-2)")
    tokenizer_path: str = Field(default=TokenizerSettings.tokenizer_path,
                                description="Use this existing tokenizer.json (file or folder) instead of training; "
                                            "nothing is downloaded")


class ShardConfig(dg.Config):
    training_type: str = Field(default=ShardSettings.training_type,
                               description="seq | conditional | sft | dpo | grpo (renderings in docs/format.md)")
    val_fraction: float = Field(default=ShardSettings.val_fraction,
                                description="Share of documents in val, by a hash of the record id")
    metadata_dropout: float = Field(default=ShardSettings.metadata_dropout,
                                    description="conditional: share of documents without title/author prefix")
    seed: int = Field(default=ShardSettings.seed, description="Seed of the per-document metadata dropout")
    shard_tokens: int = Field(default=ShardSettings.shard_tokens, description="Tokens per shard before it rolls over")
    token_dtype: str = Field(default=ShardSettings.token_dtype,
                             description="auto (uint16 when the vocabulary fits, else uint32) | uint16 | uint32")
    batch_records: int = Field(default=ShardSettings.batch_records, description="Records per encode_batch call")
    task_bytes: int = Field(default=ShardSettings.task_bytes,
                            description="Input bytes per worker task (0: automatic); never changes the output")


def _examples_md(examples: list) -> str:
    rows = [f"| {e['text'][:40].replace(chr(10), ' / ')} | {e['tokens']} | {' · '.join(e['pieces'][:16])} |"
            for e in examples]
    return "| text | tokens | first tokens |\n|---|---:|---|\n" + "\n".join(rows)


@dg.asset(group_name="tokenize", kinds={"python", "huggingface"}, deps=["deduped_jsonl"], code_version="1")
def tokenizer(context: dg.AssetExecutionContext, config: TokenizerConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Byte-level BPE (HF tokenizers) trained on a bounded, deterministic sample of deduped_jsonl (records with the
    smallest id hash; 1 record in 20 held out to measure chars per token), with special tokens <s>, </s>, <pad>,
    <|title|>, <|author|>, <|content|>, <|system|>, <|user|>, <|assistant|>, <|end|> at ids 0-9; or an existing
    tokenizer.json when `tokenizer_path` is set."""
    with staged_output(data_root.path("tokenizer")) as out:
        stats = train_tokenizer(data_root.path("deduped_jsonl"), out, TokenizerSettings(**config.model_dump()),
                                log=context.log)
    return dg.MaterializeResult(metadata={
        "docs_in": stats["docs_in"], "docs_out": stats["docs_out"],
        "mode": stats["mode"],
        "vocab_size": stats["vocab_size"],
        "sample_records": stats["sample_records"], "sample_chars": stats["sample_chars"],
        "chars_per_token_held_out": stats["chars_per_token"] or 0.0,
        "examples": dg.MetadataValue.md(_examples_md(stats["examples"])),
        "special_tokens": dg.MetadataValue.json(stats["special_tokens"]),
        "train_seconds": stats["train_seconds"],
        "seconds": stats["seconds"],
        "path": dg.MetadataValue.path(str(data_root.path("tokenizer") / "tokenizer.json")),
    })


def _hist_md(rows: list) -> str:
    top = max((r["docs"] for r in rows), default=0) or 1
    return "| tokens/doc | docs | |\n|---|---:|---|\n" + "\n".join(
        f"| {r['tokens']} | {r['docs']:,} | {'█' * max(0, round(30 * r['docs'] / top))} |" for r in rows)


@dg.asset(group_name="tokenize", kinds={"python", "numpy"}, deps=["deduped_jsonl", "tokenizer"], code_version="1")
def tokenized_bins(context: dg.AssetExecutionContext, config: ShardConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """deduped_jsonl as training-ready token shards in train/ and val/ (split by a hash of the record id): one
    headerless little-endian .bin per key plus meta.json with record offsets, dataset.json written last, byte-identical
    for the same input and config. training_type picks the rendering: seq, conditional (title/author prefix
    loss-masked, metadata dropout), sft (chat template, assistant turns trained), dpo, grpo."""
    with staged_output(data_root.path("tokenized_bins")) as out:
        stats = tokenize_corpus(data_root.path("deduped_jsonl"), data_root.path("tokenizer"), out,
                                ShardSettings(**config.model_dump()), log=context.log)
    tpd = stats["tokens_per_doc"]
    return dg.MaterializeResult(metadata={
        "docs_in": stats["docs_in"], "docs_out": stats["docs_out"],
        **{k: v for k, v in stats.items() if k.startswith("dropped_")},
        "training_type": stats["training_type"],
        "tokens": dg.MetadataValue.int(stats["tokens"]),
        "supervised_tokens": stats["supervised_tokens"], "masked_tokens": stats["masked_tokens"],
        "supervised_share": stats["supervised_share"], "masked_share": stats["masked_share"],
        "records": stats["records"],
        "metadata_dropout": stats["metadata_dropout"], "metadata_dropout_share": stats["metadata_dropout_share"],
        "train_tokens": stats["train_tokens"], "val_tokens": stats["val_tokens"],
        "train_records": stats["train_records"], "val_records": stats["val_records"],
        "chars_per_token": stats["chars_per_token"] or 0.0,
        "isolated_punctuation_share": stats["isolated_punctuation_share"],
        "tokens_per_doc_mean": tpd["mean"], "tokens_per_doc_p99": tpd["p99"],
        "tokens_per_doc": dg.MetadataValue.md(_hist_md(tpd["histogram"])),
        "bytes_on_disk": dg.MetadataValue.md("| file | bytes |\n|---|---:|\n" + "\n".join(
            f"| {k} | {v:,} |" for k, v in sorted(stats["bytes_on_disk"].items()))),
        "token_dtype": stats["token_dtype"], "vocab_size": stats["vocab_size"],
        "sample": dg.MetadataValue.md("Masked tokens in [~~brackets~~]:\n\n" + stats["sample"]["markdown"]
                                      if "sample" in stats else "no records"),
        "tokens_per_second": stats["tokens_per_second"],
        "seconds": stats["seconds"],
        "path": dg.MetadataValue.path(str(data_root.path("tokenized_bins"))),
    })
