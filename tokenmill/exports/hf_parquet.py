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

Each file is one task on the active engine (map_ordered: the local worker pool or Ray), written in row groups of
ROW_GROUP_ROWS rows counted from the stream's start, so the bytes are the same whatever the worker count;
tokenized rows are built from whole chunks of the loader's streams (offsets, no per-token Python).
An empty split is one file of 0 rows holding the columns (pyarrow reads it; `datasets` refuses a split without rows).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from tokenmill.common.io import json_parser, record_shards, shards_as_written
from tokenmill.common.parallel import map_ordered
from tokenmill.exports.streams import dataset_version, open_splits, size_stats
from tokenmill.settings import StageSettings
from tokenmill.stages.tokenize.forgotten import read_forgotten
from tokenmill_loader import Store, open_store

# code_version of hf_parquet (Dagster shows what an older one built as stale): the date of the last
# change to the output's bytes; bump it with such a change, not with a refactor that keeps them byte-identical.
VERSION = "2026-12-03"

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


def row_groups(start: int, end: int) -> Iterator[tuple[int, int]]:
    """Rows [start, end) cut at multiples of ROW_GROUP_ROWS: the row groups of a file cut from one stream of row
    groups, so a file's bytes do not depend on which task wrote it or on the files before it."""
    while start < end:
        stop = min(end, (start // ROW_GROUP_ROWS + 1) * ROW_GROUP_ROWS)
        yield start, stop
        start = stop


@dataclass(frozen=True, kw_only=True)
class ParquetFile:
    """One part-XXXXX.parquet: rows [start, end) of a records or tokenized stream (an empty stream still gets one
    file holding the schema, so it loads as 0 rows). Each kind adds its source, `schema` and `tables()`."""

    path: str
    start: int
    end: int
    compression: str


def write_parquet_file(task: RecordsFile | TokenizedFile) -> int:
    """A worker task: writes one file, a row group per table; returns its rows."""
    rows = 0
    with pq.ParquetWriter(task.path, task.schema, compression=task.compression) as writer:
        for table in task.tables():
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            rows += table.num_rows
    return rows


RECORD_KEYS = ["id", "text", "meta", "source"]  # a deduped_jsonl record's fields, in the order its stages write them
META_KEY, SOURCE_KEY = b', "meta": ', b', "source": '


def meta_source_json(line: bytes, rec: dict) -> tuple[str, str]:
    """A record's meta and source as JSON text (json.dumps, ensure_ascii=False): cut from its line, which a stage
    wrote with the same dumps, when the line's layout makes the cut unambiguous (id and text strings, a flat source
    without a "source" key: a raw quote only occurs between JSON values, so the first META_KEY and the last
    SOURCE_KEY are the record's own); else written again."""
    source = rec.get("source")
    if (
        list(rec) == RECORD_KEYS
        and isinstance(rec["id"], str)
        and isinstance(rec["text"], str)
        and isinstance(source, dict)
        and "source" not in source
        and not any(isinstance(v, (dict, list)) for v in source.values())
    ):
        body = line.rstrip(b"\n")
        meta_at, source_key_at = body.index(META_KEY) + len(META_KEY), body.rindex(SOURCE_KEY)
        return body[meta_at:source_key_at].decode(), body[source_key_at + len(SOURCE_KEY) : -1].decode()
    return json.dumps(rec.get("meta"), ensure_ascii=False), json.dumps(source, ensure_ascii=False)


@dataclass(frozen=True, kw_only=True)
class RecordsFile(ParquetFile):
    """Records [start, end) of deduped_jsonl's shards (`parts`: each shard and its record count, in order), less
    those a takedown named (`tokenmill forget`: tokenized_bins/_forgotten.jsonl), so a file can hold fewer rows."""

    parts: tuple[tuple[str, int], ...]
    bins_dir: str

    schema: ClassVar[pa.Schema] = RECORD_SCHEMA

    def _lines(self) -> Iterator[bytes]:
        first = 0
        for path, count in self.parts:
            if first + count > self.start and first < self.end:
                with open(path, "rb") as f:
                    lines = (line for line in f if line.strip())
                    yield from itertools.islice(lines, max(0, self.start - first), self.end - first)
            first += count

    def tables(self) -> Iterator[pa.Table]:
        lines = self._lines()
        forgotten = read_forgotten(Path(self.bins_dir))
        for a, b in row_groups(self.start, self.end):
            group = list(itertools.islice(lines, b - a))
            parse = json_parser(b"".join(group))
            ids, texts, metas, sources = [], [], [], []
            for line in group:
                rec = parse(line)
                if forgotten and forgotten.holds(rec["id"], rec):
                    continue
                meta, source = meta_source_json(line, rec)
                ids.append(str(rec["id"]))
                texts.append(rec.get("text"))
                metas.append(meta)
                sources.append(source)
            yield pa.table([ids, texts, metas, sources], schema=RECORD_SCHEMA)


def _lists(starts: np.ndarray, values: np.ndarray) -> pa.ListArray:
    """Rows of `values` cut at `starts` (relative, ending with len(values))."""
    return pa.ListArray.from_arrays(pa.array(starts.astype(np.int32)), pa.array(values))


def _record_range(store: Store, key: str, r0: int, r1: int) -> tuple[np.ndarray, int, int]:
    """Records [r0, r1) of `key`: their starts relative to `begin`, then the end; and the stream slice [begin, end)
    that holds them."""
    starts = store.doc_starts(key)
    begin = int(starts[r0])
    end = int(starts[r1]) if r1 < len(starts) else store.num_items(key)
    return np.append(starts[r0:r1], end) - begin, begin, end


def sequence_table(store: Store, r0: int, r1: int) -> pa.Table:
    """seq/conditional/sft rows: input_ids, attention_mask, labels (-100 where the loss mask is 0)."""
    rel, begin, end = _record_range(store, "sequence", r0, r1)
    tokens = store.read("sequence", begin, end).astype(np.int32)
    masked = "loss_mask" in store.keys
    labels = np.where(store.read("loss_mask", begin, end) == 1, tokens, IGNORE_INDEX) if masked else tokens
    return pa.table(
        {
            "input_ids": _lists(rel, tokens),
            "attention_mask": _lists(rel, np.ones(len(tokens), dtype=np.int8)),
            "labels": _lists(rel, labels.astype(np.int32)),
        }
    )


def _split_prompt(store: Store, key: str, r0: int, r1: int):
    """A dpo key's records cut into their masked prompt and their trained response (docs/format.md: 0s then 1s)."""
    rel, begin, end = _record_range(store, key, r0, r1)
    tokens = store.read(key, begin, end).astype(np.int32)
    trained = store.read(f"{key}_mask", begin, end).astype(bool)
    trained_before = np.concatenate([[0], np.cumsum(trained, dtype=np.int64)])  # trained tokens before position p
    response_starts = trained_before[rel]
    prompt_starts = rel - response_starts
    return _lists(prompt_starts, tokens[~trained]), _lists(response_starts, tokens[trained])


def dpo_table(store: Store, r0: int, r1: int) -> pa.Table:
    """dpo rows: prompt_ids (from chosen), chosen_ids, rejected_ids."""
    prompt, chosen = _split_prompt(store, "chosen", r0, r1)
    rejected = _split_prompt(store, "rejected", r0, r1)[1]
    return pa.table({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})


TABLES = {"seq": sequence_table, "conditional": sequence_table, "sft": sequence_table, "dpo": dpo_table}
SCHEMAS = {
    sequence_table: pa.schema(
        [("input_ids", pa.list_(pa.int32())), ("attention_mask", pa.list_(pa.int8())), ("labels", pa.list_(pa.int32()))]
    ),
    dpo_table: pa.schema([(c, pa.list_(pa.int32())) for c in DPO_COLUMNS]),
}


@dataclass(frozen=True, kw_only=True)
class TokenizedFile(ParquetFile):
    """Records [start, end) of one split of tokenized_bins (`version` pins the dataset version the export reads)."""

    split_dir: str
    version: int | None
    training_type: str

    @property
    def schema(self) -> pa.Schema:
        return SCHEMAS[TABLES[self.training_type]]

    def tables(self) -> Iterator[pa.Table]:
        store = open_store(self.split_dir, version=self.version)
        for a, b in row_groups(self.start, self.end):
            yield TABLES[self.training_type](store, a, b).cast(self.schema)


def _files(folder: Path, rows: int, settings: ParquetSettings) -> list[tuple[str, int, int]]:
    """(path, first row, end row) of each file of a stream of `rows` rows: rows_per_file each, at least one."""
    folder.mkdir(parents=True, exist_ok=True)
    cuts = range(0, max(rows, 1), settings.rows_per_file)
    return [(str(folder / part_name(i)), r0, min(rows, r0 + settings.rows_per_file)) for i, r0 in enumerate(cuts)]


def _outcome(tasks: Sequence[ParquetFile], rows: Sequence[int]) -> dict:
    return {
        "rows": sum(rows),
        "files": len(tasks),
        "bytes": sum(Path(t.path).stat().st_size for t in tasks),
    }


def _record_counts(deduped_dir: str | os.PathLike) -> tuple[tuple[str, int], ...]:
    """Each shard of deduped_jsonl and its records: from its folder's shard figures when the shards are still as
    written (a CRC-32 pass on threads), else by counting the non-blank lines as RecordsFile reads them."""
    counts = []
    for folder in dict.fromkeys(part.parent for part in record_shards(deduped_dir)):
        figures = shards_as_written(folder)
        if figures is not None:
            counts += [(str(folder / f["name"]), f["records"]) for f in figures["shards"]]
            continue
        for part in record_shards(folder):
            with open(part, "rb") as f:
                counts.append((str(part), sum(1 for line in f if line.strip())))
    return tuple(counts)


def write_hf_parquet(
    deduped_dir: str | os.PathLike, bins_dir: str | os.PathLike, out_dir: str | os.PathLike, settings: ParquetSettings
) -> dict:
    """Writes records/ from `deduped_dir` and tokenized/<split>/ from `bins_dir` into `out_dir`, one task per file
    on the active engine (map_ordered); returns counts, files and bytes per token of the tokenized part."""
    out_dir = Path(out_dir)
    parts = _record_counts(deduped_dir)
    records = [
        RecordsFile(path=path, start=r0, end=r1, compression=settings.compression, parts=parts, bins_dir=str(bins_dir))
        for path, r0, r1 in _files(out_dir / RECORDS_DIR, sum(n for _, n in parts), settings)
    ]
    stores = open_splits(bins_dir)
    training_type = stores["train"].training_type
    tokenized = {
        split: [
            TokenizedFile(
                path=path,
                start=r0,
                end=r1,
                compression=settings.compression,
                split_dir=str(Path(bins_dir) / split),
                version=store.version,
                training_type=training_type,
            )
            for path, r0, r1 in _files(out_dir / TOKENIZED_DIR / split, store.num_records, settings)
        ]
        for split, store in stores.items()
        if training_type in TABLES
    }
    files: list[RecordsFile | TokenizedFile] = [*records, *(t for tasks in tokenized.values() for t in tasks)]
    rows = list(map_ordered(write_parquet_file, files))
    stats = {
        "records": _outcome(records, rows[: len(records)]),
        "training_type": training_type,
        "tokenized_bins_version": dataset_version(stores),
    }
    if not tokenized:
        stats["tokenized"] = None
        return stats
    rows_of = dict(zip(files, rows))
    stats["tokenized"] = {split: _outcome(tasks, [rows_of[t] for t in tasks]) for split, tasks in tokenized.items()}
    stats.update(size_stats(stores, sum(s["bytes"] for s in stats["tokenized"].values())))
    return stats


def usage(folder: Path, tokenizer_dir: Path) -> str:
    """How to load the folder with datasets and train on it with TRL (markdown)."""
    return (
        "```python\n"  # short lines: the page shows the snippet about 60 characters wide
        "from datasets import load_dataset\n"
        "from transformers import AutoTokenizer\n"
        "\n"
        f"folder = '{folder}'\n"
        "records = load_dataset(\n"
        f"    'parquet', data_files=f'{{folder}}/{RECORDS_DIR}/*.parquet'\n"
        ")['train']\n"
        "tokenized = load_dataset('parquet', data_files={\n"
        f"    'train': f'{{folder}}/{TOKENIZED_DIR}/train/*.parquet',\n"
        f"    'validation': f'{{folder}}/{TOKENIZED_DIR}/val/*.parquet',\n"
        "})\n"
        "# pad, bos, eos and the chat template set:\n"
        f"tokenizer = AutoTokenizer.from_pretrained('{tokenizer_dir}')\n"
        "```\n\n"
        "`meta` and `source` are JSON strings (`json.loads`). Tokenized columns: "
        f"{', '.join(f'`{c}`' for c in SEQUENCE_COLUMNS)} (-100 = masked) for seq/conditional/sft, which TRL's "
        f"SFTTrainer takes as already tokenized; {', '.join(f'`{c}`' for c in DPO_COLUMNS)} for dpo (what TRL's "
        "DPOTrainer builds from conversational prompt/chosen/rejected with this tokenizer, and its "
        "DataCollatorForPreference reads); none for grpo (TRL's GRPOTrainer generates from text prompts)."
    )
