"""Megatron-Core's indexed dataset (`megatron.core.datasets.indexed_dataset.IndexedDataset`): per split and key a
`<split>_<key>_document.bin` (the items back to back, headerless little-endian) and `.idx`:

    b"MMIDIDX\\x00\\x00", version <Q = 1, dtype code <B, sequence count <Q, document count <Q,
    sequence lengths int32[sequences], sequence byte offsets int64[sequences], document indices int64[documents]

A sequence is one item of the key (a record's tokens; for grpo `responses`/`masks` one response) and a document is
one record: its sequences `document_indices[d]:document_indices[d + 1]`, so grpo's responses of a record form one
document. Token ids are uint16 when the vocabulary fits (Megatron's own choice below 65,500 ids), else int32
(Megatron has no uint32); masks are uint8, grpo rewards float32. An empty split gives an empty .bin, which
megatron-core opens only with `mmap=False` (numpy cannot map an empty file).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from tokenmill.errors import ConfigError
from tokenmill.exports.streams import copy_key, dataset_version, open_splits, size_stats
from tokenmill_loader import Store
from tokenmill_loader.format import GROUP_KEY, KIND_OF, MASK, RESPONSE_KEYS, TOKENS

# code_version of megatron_indexed (Dagster shows what an older one built as stale): the date of the last
# change to the output's bytes; bump it with such a change, not with a refactor that keeps them byte-identical.
VERSION = "2026-12-03"

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {"uint8": 1, "int32": 4, "float32": 7, "uint16": 8}  # megatron.core's DType enum values
DOCUMENT_SUFFIX = "_document"  # Megatron's preprocess_data.py names its output <prefix>_<key>_document


def dataset_prefix(split: str, key: str) -> str:
    """The path prefix Megatron is given (`--train-data-path <out>/train_sequence_document`)."""
    return f"{split}_{key}{DOCUMENT_SUFFIX}"


def megatron_dtype(store: Store, key: str) -> np.dtype:
    if KIND_OF[key] == TOKENS:
        if store.dtypes[key] == np.uint16:
            return np.dtype(np.uint16)
        if store.vocab_size is None or store.vocab_size > 2**31:
            raise ConfigError(f"{store.path}: vocabulary {store.vocab_size} does not fit Megatron's int32 tokens")
        return np.dtype(np.int32)
    return np.dtype(np.uint8) if KIND_OF[key] == MASK else np.dtype(np.float32)


def document_indices(store: Store, key: str, sequences: int) -> np.ndarray:
    """Sequence index where each record's document starts, plus the end (Megatron's document_indices)."""
    if key in RESPONSE_KEYS and GROUP_KEY in store.keys:
        per_record = store.record_lengths(GROUP_KEY)  # responses per record
    else:
        per_record = np.ones(sequences, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(per_record)]).astype(np.int64)


def index_bytes(dtype: np.dtype, lengths: np.ndarray, documents: np.ndarray) -> bytes:
    """The .idx file of sequences with these lengths (items) and this document grouping."""
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1] * dtype.itemsize)]) if len(lengths) else lengths
    return b"".join(
        [
            INDEX_HEADER,
            struct.pack("<Q", INDEX_VERSION),
            struct.pack("<B", DTYPE_CODES[dtype.name]),
            struct.pack("<Q", len(lengths)),
            struct.pack("<Q", len(documents)),
            np.asarray(lengths, dtype="<i4").tobytes(),
            np.asarray(pointers, dtype="<i8").tobytes(),
            np.asarray(documents, dtype="<i8").tobytes(),
        ]
    )


def write_indexed(store: Store, key: str, prefix: Path) -> dict:
    """One key of one split as `prefix.bin` + `prefix.idx`; returns counts and bytes."""
    dtype = megatron_dtype(store, key)
    lengths = store.record_lengths(key)  # items of the key, without reading data
    if len(lengths) and int(lengths.max()) > np.iinfo(np.int32).max:
        raise ConfigError(f"{store.path}: an item of {key!r} has {int(lengths.max())} values, over Megatron's int32")
    documents = document_indices(store, key, len(lengths))
    data_bytes = copy_key(store, key, prefix.with_suffix(".bin"), dtype)
    idx = index_bytes(dtype, lengths, documents)
    prefix.with_suffix(".idx").write_bytes(idx)
    return {
        "key": key,
        "dtype": dtype.name,
        "sequences": len(lengths),
        "documents": len(documents) - 1,
        "bin_bytes": data_bytes,
        "idx_bytes": len(idx),
    }


def write_megatron(bins_dir: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Writes every key of both splits of `bins_dir` (tokenized_bins) as Megatron indexed datasets into `out_dir`."""
    out_dir = Path(out_dir)
    stores = open_splits(bins_dir)
    datasets = {
        dataset_prefix(split, key): write_indexed(store, key, out_dir / dataset_prefix(split, key))
        for split, store in stores.items()
        for key in store.keys
    }
    token_bytes = sum(d["bin_bytes"] + d["idx_bytes"] for d in datasets.values() if KIND_OF[d["key"]] == TOKENS)
    return {
        "training_type": stores["train"].training_type,
        "vocab_size": stores["train"].vocab_size,
        "datasets": datasets,
        "tokenized_bins_version": dataset_version(stores),
        **size_stats(stores, token_bytes),
        "bytes_with_masks": sum(d["bin_bytes"] + d["idx_bytes"] for d in datasets.values()),
    }


def usage(folder: Path, tokenizer_dir: Path) -> str:
    """How to read the folder with megatron-core and train on it with Megatron-LM (markdown)."""
    train, val = folder / dataset_prefix("train", "sequence"), folder / dataset_prefix("val", "sequence")
    return (
        "```python\n"  # short lines: the page shows the snippet about 60 characters wide
        "from megatron.core.datasets import indexed_dataset\n"
        "\n"
        "# the prefix of the .bin/.idx pair\n"
        f"prefix = '{train}'\n"
        "ds = indexed_dataset.IndexedDataset(prefix)\n"
        "tokens = ds[0]  # record 0 of train\n"
        "# ds.document_indices: the sequences of each record\n"
        "```\n\n"
        f"Megatron-LM: `--train-data-path {train} --valid-data-path {val} --tokenizer-type HuggingFaceTokenizer "
        f"--tokenizer-model {tokenizer_dir}` (every record already ends with `</s>`). dpo and grpo keys are datasets "
        f"of their own (`train_chosen{DOCUMENT_SUFFIX}`, ...); masks are `*_mask{DOCUMENT_SUFFIX}` (uint8), which "
        "Megatron's GPTDataset does not read."
    )
