"""Parquet shards that Hugging Face `datasets` loads (`load_dataset("parquet", data_files=...)`) and TRL trains on:

    hf_parquet/records/part-XXXXX.parquet            deduped_jsonl: id, text, meta, source (meta and source as
                                                     JSON strings: their keys vary by source format)
    hf_parquet/tokenized/{train,val}/part-XXXXX.parquet
        seq, conditional, sft: input_ids, attention_mask (1 over the record), labels (-100 where masked), the
                               columns TRL's SFTTrainer takes as already tokenized (its collator pads and keeps
                               labels)
        dpo:                   prompt_ids, chosen_ids, rejected_ids (chosen and rejected are the trained responses,
                               `<|end|></s>` included): what TRL's DPOTrainer builds from conversational text with
                               tokenmill's chat template, and what its DataCollatorForPreference reads
        grpo:                  none: TRL's GRPOTrainer generates completions from text prompts (use records/)

Records are streamed in row groups of ROW_GROUP_ROWS; tokenized rows are built from whole chunks of the loader's
streams (offsets, no per-token Python).
An empty split is one file of 0 rows holding the columns (pyarrow reads it; `datasets` refuses a split without rows).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from tokenmill.common.io import iter_jsonl, record_shards
from tokenmill.exports.streams import open_splits, size_stats
from tokenmill.settings import StageSettings
from tokenmill_loader import Store

RECORDS_DIR, TOKENIZED_DIR = "records", "tokenized"
ROW_GROUP_ROWS = 4096  # rows held in memory at a time (a few MiB of text or tokens)
IGNORE_INDEX = -100  # labels of masked tokens, what transformers' losses skip
RECORD_SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("meta", pa.string()), ("source", pa.string())])
SEQUENCE_COLUMNS = ("input_ids", "attention_mask", "labels")
DPO_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
TOKENIZED_TYPES = ("seq", "conditional", "sft", "dpo")


class ParquetSettings(StageSettings):
    """How hf_parquet cuts and compresses its files."""

    asset_key: ClassVar[str] = "hf_parquet"

    rows_per_file: int = Field(100_000, ge=1, le=10**9, description="Rows per Parquet file (records or tokenized)")
    compression: Literal["zstd", "snappy", "none"] = Field(
        "zstd", description="Parquet compression codec (datasets/pyarrow read all three)"
    )


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


class ParquetShards:
    """Tables appended to part-XXXXX.parquet files of at most `rows_per_file` rows; an empty output still gets one
    file holding the schema, so it loads as 0 rows."""

    def __init__(self, folder: Path, schema: pa.Schema, settings: ParquetSettings):
        self.folder, self.schema, self.settings = folder, schema, settings
        folder.mkdir(parents=True, exist_ok=True)
        self.files: list[str] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._in_file = 0

    def _open(self) -> None:
        self.files.append(part_name(len(self.files)))
        self._writer = pq.ParquetWriter(
            self.folder / self.files[-1], self.schema, compression=self.settings.compression
        )
        self._in_file = 0

    def _close_file(self) -> None:
        self._writer.close()
        self._writer = None

    def write(self, table: pa.Table) -> None:
        while table.num_rows:
            if self._writer is None:
                self._open()
            take = min(table.num_rows, self.settings.rows_per_file - self._in_file)
            self._writer.write_table(table.slice(0, take), row_group_size=ROW_GROUP_ROWS)
            table, self._in_file, self.rows = table.slice(take), self._in_file + take, self.rows + take
            if self._in_file == self.settings.rows_per_file:
                self._close_file()

    def close(self) -> dict:
        if not self.files:
            self._open()
        if self._writer is not None:
            self._close_file()
        return {
            "rows": self.rows,
            "files": len(self.files),
            "bytes": sum((self.folder / name).stat().st_size for name in self.files),
        }


def _json_column(values: list) -> list[str]:
    return [json.dumps(v, ensure_ascii=False) for v in values]


def write_records(deduped_dir: str | os.PathLike, out_dir: Path, settings: ParquetSettings) -> dict:
    """deduped_jsonl's records (every batch's shards, in order) as records/part-*.parquet."""
    out = ParquetShards(out_dir / RECORDS_DIR, RECORD_SCHEMA, settings)
    batch: list[dict] = []

    def flush():
        columns = {
            "id": [str(r["id"]) for r in batch],
            "text": [r.get("text") for r in batch],
            "meta": _json_column([r.get("meta") for r in batch]),
            "source": _json_column([r.get("source") for r in batch]),
        }
        out.write(pa.table(columns, schema=RECORD_SCHEMA))
        batch.clear()

    for part in record_shards(deduped_dir):
        for rec in iter_jsonl(part):
            batch.append(rec)
            if len(batch) == ROW_GROUP_ROWS:
                flush()
    if batch:
        flush()
    return out.close()


def _lists(starts: np.ndarray, values: np.ndarray) -> pa.ListArray:
    """Rows of `values` cut at `starts` (relative, ending with len(values))."""
    return pa.ListArray.from_arrays(pa.array(starts.astype(np.int32)), pa.array(values))


def _record_chunks(store: Store, key: str):
    """ROW_GROUP_ROWS records of `key` at a time: (their starts relative to `begin`, then the end; begin; end), the
    stream slice [begin, end) that holds them."""
    starts = store.doc_starts(key)
    ends = np.append(starts[1:], store.num_items(key))
    for r0 in range(0, len(starts), ROW_GROUP_ROWS):
        r1 = min(len(starts), r0 + ROW_GROUP_ROWS)
        begin, end = int(starts[r0]), int(ends[r1 - 1])
        yield np.append(starts[r0:r1], end) - begin, begin, end


def sequence_tables(store: Store):
    """seq/conditional/sft rows: input_ids, attention_mask, labels (-100 where the loss mask is 0)."""
    masked = "loss_mask" in store.keys
    for rel, begin, end in _record_chunks(store, "sequence"):
        tokens = store.read("sequence", begin, end).astype(np.int32)
        labels = np.where(store.read("loss_mask", begin, end) == 1, tokens, IGNORE_INDEX) if masked else tokens
        yield pa.table(
            {
                "input_ids": _lists(rel, tokens),
                "attention_mask": _lists(rel, np.ones(len(tokens), dtype=np.int8)),
                "labels": _lists(rel, labels.astype(np.int32)),
            }
        )


def _split_prompt(store: Store, key: str, rel: np.ndarray, begin: int, end: int):
    """A dpo key's chunk cut into its masked prompt and its trained response (docs/format.md: 0s then 1s)."""
    tokens = store.read(key, begin, end).astype(np.int32)
    trained = store.read(f"{key}_mask", begin, end).astype(bool)
    trained_before = np.concatenate([[0], np.cumsum(trained, dtype=np.int64)])  # trained tokens before position p
    response_starts = trained_before[rel]
    prompt_starts = rel - response_starts
    return _lists(prompt_starts, tokens[~trained]), _lists(response_starts, tokens[trained])


def dpo_tables(store: Store):
    """dpo rows: prompt_ids (from chosen), chosen_ids, rejected_ids."""
    for (rel_c, b_c, e_c), (rel_r, b_r, e_r) in zip(_record_chunks(store, "chosen"), _record_chunks(store, "rejected")):
        prompt, chosen = _split_prompt(store, "chosen", rel_c, b_c, e_c)
        rejected = _split_prompt(store, "rejected", rel_r, b_r, e_r)[1]
        yield pa.table({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})


TABLES = {"seq": sequence_tables, "conditional": sequence_tables, "sft": sequence_tables, "dpo": dpo_tables}
SCHEMAS = {
    sequence_tables: pa.schema(
        [("input_ids", pa.list_(pa.int32())), ("attention_mask", pa.list_(pa.int8())), ("labels", pa.list_(pa.int32()))]
    ),
    dpo_tables: pa.schema([(c, pa.list_(pa.int32())) for c in DPO_COLUMNS]),
}


def write_hf_parquet(
    deduped_dir: str | os.PathLike, bins_dir: str | os.PathLike, out_dir: str | os.PathLike, settings: ParquetSettings
) -> dict:
    """Writes records/ from `deduped_dir` and tokenized/<split>/ from `bins_dir` into `out_dir`; returns counts,
    files and bytes per token of the tokenized part."""
    out_dir = Path(out_dir)
    stats = {"records": write_records(deduped_dir, out_dir, settings)}
    stores = open_splits(bins_dir)
    training_type = stores["train"].training_type
    stats["training_type"] = training_type
    tables = TABLES.get(training_type)
    if tables is None:
        stats["tokenized"] = None
        return stats
    stats["tokenized"] = {}
    for split, store in stores.items():
        out = ParquetShards(out_dir / TOKENIZED_DIR / split, SCHEMAS[tables], settings)
        for table in tables(store):
            out.write(table.cast(SCHEMAS[tables]))
        stats["tokenized"][split] = out.close()
    stats.update(size_stats(stores, sum(s["bytes"] for s in stats["tokenized"].values())))
    return stats


def usage(folder: Path, tokenizer_dir: Path) -> str:
    """How to load the folder with datasets and train on it with TRL (markdown)."""
    return (
        "```python\n"
        "from datasets import load_dataset\n"
        f"records = load_dataset('parquet', data_files='{folder}/{RECORDS_DIR}/*.parquet', split='train')\n"
        f"tokenized = load_dataset('parquet', data_files={{'train': '{folder}/{TOKENIZED_DIR}/train/*.parquet', "
        f"'validation': '{folder}/{TOKENIZED_DIR}/val/*.parquet'}})\n"
        f"tokenizer = AutoTokenizer.from_pretrained('{tokenizer_dir}')  # pad, bos, eos and the chat template set\n"
        "```\n\n"
        "`meta` and `source` are JSON strings (`json.loads`). Tokenized columns: "
        f"{', '.join(f'`{c}`' for c in SEQUENCE_COLUMNS)} (-100 = masked) for seq/conditional/sft, which TRL's "
        f"SFTTrainer takes as already tokenized; {', '.join(f'`{c}`' for c in DPO_COLUMNS)} for dpo (what TRL's "
        "DPOTrainer builds from conversational prompt/chosen/rejected with this tokenizer, and its "
        "DataCollatorForPreference reads); none for grpo (TRL's GRPOTrainer generates from text prompts)."
    )
