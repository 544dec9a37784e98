"""tokenizer and tokenized_bins: a byte-level BPE tokenizer, then training-ready token shards (docs/format.md).

Steps, one module each:
  settings   TokenizerSettings and ShardSettings, declared once (asset config and plain functions)
  tokenizer  loading tokenizer.json, special-token ids, pinning the one a run started from (SHA-256)
  train      a bounded, deterministic sample of the records -> BPE training (or an existing tokenizer.json)
  render     one function per training type: a record -> special tokens and text pieces with mask bits
  encode     one task per newline-aligned byte range: parse, route train/val, render, encode a batch at once
  shards     shards planned from the tasks' record token counts, one pack task per shard -> shard folders;
             the version manifests of each split
  versions   what is published, publishing a version (current.json switches both splits), recovery, retention
  forgotten  the takedown list: records `tokenmill forget` removed, dropped as `forgotten` wherever they come again
  takedown   the next version without some records: their shards re-packed, the rest listed unchanged
  summary    counts per input batch and the stage's _stats.json
  verify     re-encoding a sample of the shards' records with the dataset's tokenizer (the asset check)
  stage      train_tokenizer and tokenize_batches: the steps in order

The shard format itself (names, keys, kinds, dtypes, manifest, validator) is tokenmill_loader.format.
"""

from tokenmill.stages.tokenize.settings import ShardSettings, TokenizerSettings
from tokenmill.stages.tokenize.stage import TokenizerResult, tokenize_batches, tokenize_corpus, train_tokenizer
from tokenmill.stages.tokenize.summary import TokenizeResult

# code_version of tokenizer and tokenized_bins (Dagster shows what an older one built as stale): the date of the last
# change to the output's bytes; bump it with such a change, not with a refactor that keeps them byte-identical.
VERSION = "2026-12-04.3"  # that day: _stats.json through write_result, then token counts in .npz

__all__ = [
    "VERSION",
    "ShardSettings",
    "TokenizeResult",
    "TokenizerResult",
    "TokenizerSettings",
    "tokenize_batches",
    "tokenize_corpus",
    "train_tokenizer",
]
