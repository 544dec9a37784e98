"""exports: the shards and records in the layouts of the trainers users already run (nanoGPT, Megatron-Core,
Hugging Face datasets/TRL). Off in the whole-graph job: select them in the UI or a run config. Each writes
`$TOKENMILL_DATA/<asset key>/` in one atomic publish and says in its metadata how to load it."""

import time
from pathlib import Path

import dagster as dg

from assets.dedup import deduped_jsonl
from assets.metadata import source_metadata
from assets.tokenize import tokenized_bins
from resources import Compute, DataRoot
from tokenmill.common.io import staged_output
from tokenmill.exports import hf_parquet as hf
from tokenmill.exports import megatron, nanogpt

EXPORTS_GROUP = "exports"


class ParquetConfig(hf.ParquetSettings, dg.Config):
    """hf_parquet run config: rows per file and compression."""


def export_metadata(stats: dict, folder: Path, usage: str, seconds: float) -> dict:
    """The figures every export shows, what it was written from (the source, its generation and the
    tokenized_bins version) and how to use it (a code snippet for the target library)."""
    version = stats["tokenized_bins_version"]
    return {
        **source_metadata(folder),
        "tokenized_bins_version": dg.MetadataValue.int(version) if version is not None else "unversioned",
        "tokens": dg.MetadataValue.int(stats.get("tokens") or 0),
        "bytes": dg.MetadataValue.int(stats.get("bytes") or 0),
        "bytes_per_token": dg.MetadataValue.float(float(stats.get("bytes_per_token") or 0.0)),
        "shard_bytes_per_token": dg.MetadataValue.float(float(stats.get("shard_bytes_per_token") or 0.0)),
        "training_type": stats["training_type"],
        "usage": dg.MetadataValue.md(usage),
        "details": dg.MetadataValue.json(stats),
        "seconds": dg.MetadataValue.float(round(seconds, 3)),
        "path": dg.MetadataValue.path(str(folder)),
    }


@dg.asset(group_name=EXPORTS_GROUP, kinds={"python", "numpy"}, deps=[tokenized_bins], code_version=nanogpt.VERSION)
def nanogpt_bins(data_root: DataRoot) -> dg.MaterializeResult:
    """tokenized_bins as nanoGPT's `train.bin` / `val.bin` (every record's tokens back to back, token dtype) and
    `meta.pkl` (vocab_size); conditional/sft also get `<split>_loss_mask.bin`, which nanoGPT's own train.py
    ignores."""
    t0 = time.perf_counter()
    folder = data_root.path("nanogpt_bins")
    with staged_output(folder) as out:
        stats = nanogpt.write_nanogpt(data_root.path("tokenized_bins"), out)
    usage = nanogpt.usage(folder, stats)
    return dg.MaterializeResult(metadata=export_metadata(stats, folder, usage, time.perf_counter() - t0))


@dg.asset(group_name=EXPORTS_GROUP, kinds={"python", "numpy"}, deps=[tokenized_bins], code_version=megatron.VERSION)
def megatron_indexed(data_root: DataRoot) -> dg.MaterializeResult:
    """tokenized_bins as Megatron-Core indexed datasets: `<split>_<key>_document.bin` + `.idx` per split and key
    (a record is a document; uint16 or int32 tokens, uint8 masks)."""
    t0 = time.perf_counter()
    folder = data_root.path("megatron_indexed")
    with staged_output(folder) as out:
        stats = megatron.write_megatron(data_root.path("tokenized_bins"), out)
    usage = megatron.usage(folder, data_root.path("tokenizer"))
    return dg.MaterializeResult(metadata=export_metadata(stats, folder, usage, time.perf_counter() - t0))


@dg.asset(
    group_name=EXPORTS_GROUP,
    kinds={"python", "parquet"},
    deps=[deduped_jsonl, tokenized_bins],
    code_version=hf.VERSION,
)
def hf_parquet(
    context: dg.AssetExecutionContext, config: ParquetConfig, data_root: DataRoot, compute: Compute
) -> dg.MaterializeResult:
    """deduped_jsonl's records (`records/`: id, text, meta and source as JSON strings) and, for seq, conditional,
    sft and dpo, the tokenized records in TRL's column names (`tokenized/{train,val}/`) as Parquet shards that
    `datasets.load_dataset("parquet", ...)` loads."""
    t0 = time.perf_counter()
    folder = data_root.path("hf_parquet")
    with compute.activated(context, data_root), staged_output(folder) as out:  # a file per task
        stats = hf.write_hf_parquet(data_root.path("deduped_jsonl"), data_root.path("tokenized_bins"), out, config)
    usage = hf.usage(folder, data_root.path("tokenizer"))
    return dg.MaterializeResult(metadata=export_metadata(stats, folder, usage, time.perf_counter() - t0))


EXPORT_ASSETS = [nanogpt_bins, megatron_indexed, hf_parquet]
