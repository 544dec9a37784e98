"""Tiny writer of the docs/format.md token-shard format, for the loader's own tests and benchmarks.

Independent of tokenmill's writer on purpose: the loader package must read the documented format.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

RECORD_KEY = {"seq": "sequence", "conditional": "sequence", "sft": "sequence", "dpo": "chosen", "grpo": "prompts"}
TOKEN_KEYS = {"seq": ("sequence",), "conditional": ("sequence",), "sft": ("sequence",),
              "dpo": ("chosen", "rejected"), "grpo": ("prompts", "responses")}
RESPONSE_KEYS = ("responses", "masks")


def _dtype_for(key: str, token_dtype: str) -> str:
    if key == "rewards":
        return "float32"
    if "mask" in key:
        return "uint8"
    return token_dtype


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_shard(folder: Path, records: list[dict], training_type: str, token_dtype: str = "uint16") -> dict:
    """Write one shard folder; returns its dataset.json entry (without name)."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = list(records[0]) if records else list(TOKEN_KEYS[training_type])
    meta = {}
    for k in keys:
        dt = np.dtype(_dtype_for(k, token_dtype))
        if k in RESPONSE_KEYS:
            items = [item for r in records for item in r[k]]
        else:
            items = [r[k] for r in records]
        lens = [len(x) for x in items]
        offs = [0] + np.cumsum(lens).tolist() if items else [0]
        flat = np.asarray([v for x in items for v in x], dtype=dt)
        flat.astype(dt.newbyteorder("<")).tofile(folder / f"{k}.bin")
        meta[k] = {"shape": [int(len(flat))], "dtype": dt.name, "offsets": [int(o) for o in offs]}
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "record_ids.json").write_text(json.dumps([f"{i:016x}" for i in range(len(records))]))
    files = {f"{k}.bin": {"bytes": (folder / f"{k}.bin").stat().st_size, "sha256": _sha(folder / f"{k}.bin")}
             for k in keys}
    files["meta.json"] = {"bytes": (folder / "meta.json").stat().st_size, "sha256": _sha(folder / "meta.json")}
    tokens = sum(meta[k]["shape"][0] for k in TOKEN_KEYS[training_type] if k in meta)
    return {"tokens": int(tokens), "records": len(records), "files": files, "_keys": {k: meta[k]["dtype"] for k in keys}}


def write_dataset(root, records: list[dict], training_type: str = "seq", shard_records: int | None = None,
                  token_dtype: str = "uint16", vocab_size: int = 1000, tokenizer_file: str | None = None) -> Path:
    """Write records (dicts of token lists, format.md key names) as a split folder with dataset.json."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    n = shard_records or max(1, len(records))
    chunks = [records[i:i + n] for i in range(0, len(records), n)] or [[]]
    shards = []
    keys = {}
    for si, chunk in enumerate(chunks):
        e = write_shard(root / f"shard-{si:05d}", chunk, training_type, token_dtype)
        keys.update(e.pop("_keys"))
        shards.append({"name": f"shard-{si:05d}", **e})
    info = {
        "format": "tokenmill-shards", "format_version": 1,
        "training_type": training_type, "split": "train",
        "vocab_size": vocab_size, "token_dtype": token_dtype,
        "keys": {k: {"dtype": dt, "kind": "mask" if "mask" in k else ("rewards" if k == "rewards" else "tokens")}
                 for k, dt in keys.items()},
        "shards": shards,
        "totals": {"tokens": sum(s["tokens"] for s in shards), "records": sum(s["records"] for s in shards)},
        "special_tokens": {"<s>": 0, "</s>": 1, "<pad>": 2},
    }
    if tokenizer_file:
        import shutil
        shutil.copy(tokenizer_file, root / "tokenizer.json")
        info["tokenizer"] = {"file": "tokenizer.json", "sha256": _sha(root / "tokenizer.json"), "vocab_size": vocab_size}
    (root / "dataset.json").write_text(json.dumps(info, indent=1))
    return root


def random_docs(n: int, seed: int = 0, min_len: int = 3, max_len: int = 40, vocab: int = 1000,
                masked: bool = False) -> list[dict]:
    """n random documents (seq), or sft-like ones with a masked prefix when masked=True."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        L = int(rng.integers(min_len, max_len + 1))
        seq = rng.integers(3, vocab, size=L).tolist()
        seq[0] = 0  # <s>
        rec = {"sequence": seq}
        if masked:
            p = int(rng.integers(0, L))
            rec["loss_mask"] = [0] * p + [1] * (L - p)
        out.append(rec)
    return out
