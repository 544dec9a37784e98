"""nanoGPT's data layout (data/<name>/ of karpathy/nanoGPT): `train.bin` and `val.bin`, every record's tokens
back to back (`<s> ... </s>` framing kept), headerless little-endian in the shards' token dtype, and `meta.pkl`
holding `vocab_size`, which nanoGPT's train.py reads to size the model. Masked training types (conditional, sft)
also get `train_loss_mask.bin` / `val_loss_mask.bin` (uint8, 1 = trained) aligned token for token: nanoGPT's own
train.py ignores them (every token is a target there), a get_batch that slices the mask like the tokens uses them.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

from tokenmill.errors import ConfigError
from tokenmill.exports.streams import copy_key, dataset_version, open_splits, size_stats

# code_version of nanogpt_bins (Dagster shows what an older one built as stale): the date of the last
# change to the output's bytes; bump it with such a change, not with a refactor that keeps them byte-identical.
VERSION = "2026-12-03"

TOKENS_KEY, MASK_KEY = "sequence", "loss_mask"
META_PKL = "meta.pkl"
META_JSON = "meta.json"  # the same facts for readers that do not unpickle
PICKLE_PROTOCOL = 4  # fixed, so meta.pkl has the same bytes whatever Python writes it


def tokens_file(split: str) -> str:
    return f"{split}.bin"


def mask_file(split: str) -> str:
    return f"{split}_{MASK_KEY}.bin"


def write_nanogpt(bins_dir: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Writes the nanoGPT layout of `bins_dir` (tokenized_bins) into `out_dir`; returns what it wrote."""
    out_dir = Path(out_dir)
    stores = open_splits(bins_dir)
    train = stores["train"]
    if TOKENS_KEY not in train.keys:
        raise ConfigError(
            f"{bins_dir}: nanogpt_bins needs one token stream ({TOKENS_KEY!r}); training type "
            f"{train.training_type!r} has {train.keys} (use seq, conditional or sft)"
        )
    masked = MASK_KEY in train.keys
    files = {}
    for split, store in stores.items():
        files[tokens_file(split)] = copy_key(store, TOKENS_KEY, out_dir / tokens_file(split))
        if masked:
            files[mask_file(split)] = copy_key(store, MASK_KEY, out_dir / mask_file(split))
    meta = {
        "vocab_size": train.vocab_size,
        "dtype": str(train.dtypes[TOKENS_KEY]),
        "training_type": train.training_type,
        "loss_mask": masked,
    }
    (out_dir / META_PKL).write_bytes(pickle.dumps(meta, protocol=PICKLE_PROTOCOL))
    (out_dir / META_JSON).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    tokens_bytes = sum(size for name, size in files.items() if MASK_KEY not in name)
    return {
        **meta,
        "files": files,
        "documents": {split: store.num_records for split, store in stores.items()},
        "tokenized_bins_version": dataset_version(stores),
        **size_stats(stores, tokens_bytes),
        "bytes_with_masks": sum(files.values()),
    }


def usage(folder: Path, stats: dict) -> str:
    """How to train on the folder with nanoGPT (markdown for the asset's metadata)."""
    dtype = stats["dtype"]
    reads = (
        "train.py memmaps uint16 as written"
        if dtype == "uint16"
        else f"change train.py's `np.uint16` to `np.{dtype}` (vocabulary over 65,536)"
    )
    # short lines: the page shows the snippet in a column about 60 characters wide at a 1600 px window
    lines = [
        f"Set nanoGPT's `data_dir` to `{folder}`: train.py reads `meta.pkl` for `vocab_size`; {reads}.",
        "",
        "```python",
        "import numpy as np",
        "import torch",
        "",
        f"folder = '{folder}'",
        "block_size, batch_size = 1024, 12  # train.py's defaults",
        f"data = np.memmap(f'{{folder}}/train.bin', np.{dtype}, mode='r')",
        "ix = torch.randint(len(data) - block_size, (batch_size,))",
        "# one window of block_size + 1 tokens per row, split in two",
        "rows = np.stack([data[i : i + 1 + block_size] for i in ix])",
        "rows = torch.from_numpy(rows.astype(np.int64))",
        "x, y = rows[:, :-1], rows[:, 1:]",
    ]
    if stats["loss_mask"]:
        lines += [
            f"mask = f'{{folder}}/train_{MASK_KEY}.bin'  # 1 = trained",
            "m = np.memmap(mask, dtype=np.uint8, mode='r')",
            "keep = np.stack([m[i + 1 : i + 1 + block_size] for i in ix])",
            "y[~torch.from_numpy(keep.astype(bool))] = -1  # ignore_index",
            "```",
            "",
            f"**nanoGPT's own train.py ignores `<split>_{MASK_KEY}.bin`**: unchanged, it trains on every token "
            "(prompts and metadata too). Add the mask lines to its get_batch to train only the masked-in tokens "
            "(its cross_entropy has `ignore_index=-1`).",
        ]
    else:
        lines.append("```")
    return "\n".join(lines)
