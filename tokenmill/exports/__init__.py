"""Exports of the shards and records to the trainers users already run, one module per target:

- `nanogpt`: flat `train.bin` / `val.bin` (+ loss masks) and `meta.pkl` for nanoGPT-style `get_batch`
- `megatron`: `.bin` + `.idx` per split and key, the format `megatron.core.datasets.indexed_dataset` reads
- `hf_parquet`: records and tokenized records as Parquet shards for Hugging Face `datasets` and TRL

`tokenizer_config.json` + `special_tokens_map.json` beside `tokenizer.json`, for transformers, are the tokenizer
stage's own (`tokenmill.stages.tokenize.transformers_config`): every export and training script reads them there.

Each is a plain function over folders (no Dagster); `assets/exports.py` wraps them. The shards are read only
through `tokenmill_loader`'s public API and the records through `record_shards` / `iter_jsonl`.
"""
