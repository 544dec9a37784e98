"""Independent verifiers behind the asset checks: they re-read outputs and report a figure and the problems."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from tokenmill.common.io import record_shards, read_json

MAX_PROBLEMS = 20  # problems listed in a check's metadata; the count is always complete


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def validate_records(stage_dir: Path) -> dict:
    """Every line of every shard is a record {"id": str, "text": str, "meta": dict, "source": {"path", "line"|"index"}}."""
    problems, records, ids = [], 0, set()
    for shard in record_shards(stage_dir):
        with open(shard, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                records += 1
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    problems.append(f"{shard.name}:{n}: not JSON ({e.msg})")
                    continue
                except RecursionError:  # a reader lets no such record through; a check must not crash on one
                    problems.append(f"{shard.name}:{n}: nested too deeply to parse")
                    continue
                src = r.get("source") if isinstance(r, dict) else None
                if not (isinstance(r, dict) and isinstance(r.get("id"), str) and isinstance(r.get("text"), str)
                        and isinstance(r.get("meta"), dict) and isinstance(src, dict) and "path" in src
                        and ("line" in src or "index" in src)):
                    problems.append(f"{shard.name}:{n}: does not match the record schema")
                elif r["id"] in ids:
                    problems.append(f"{shard.name}:{n}: duplicate id {r['id']}")
                else:
                    ids.add(r["id"])
    return {"records": records, "problems": problems}


def validate_token_dataset(folder: Path, verify_checksums: bool = True) -> dict:
    """dataset.json against the shard files: sizes, checksums, offsets, token ids < vocabulary, masks aligned."""
    folder = Path(folder)
    problems: list[str] = []
    manifest_path = folder / "dataset.json"
    if not manifest_path.exists():
        return {"tokens": 0, "max_token_id": None, "problems": [f"{manifest_path}: missing"]}
    manifest = read_json(manifest_path)
    vocab = int(manifest["vocab_size"])
    tokens, max_id = 0, -1
    for shard in manifest["shards"]:
        shard_dir = folder / shard["name"]
        for name, spec in shard["files"].items():
            path = shard_dir / name
            if not path.exists():
                problems.append(f"{path}: listed in dataset.json but missing")
            elif path.stat().st_size != spec["bytes"]:
                problems.append(f"{path}: {path.stat().st_size} bytes, dataset.json says {spec['bytes']}")
            elif verify_checksums and _sha256(path) != spec["sha256"]:
                problems.append(f"{path}: SHA-256 differs from dataset.json")
        meta_path = shard_dir / "meta.json"
        if not meta_path.exists():
            continue
        meta = read_json(meta_path)
        arrays = {}
        for key, spec in meta.items():
            path = shard_dir / f"{key}.bin"
            want = int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize
            if not path.exists() or path.stat().st_size != want:
                problems.append(f"{path}: size does not match meta.json ({want} bytes)")
                continue
            offsets = np.asarray(spec.get("offsets", []), dtype=np.int64)
            if len(offsets) == 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != spec["shape"][0]:
                problems.append(f"{meta_path}: '{key}' offsets are not 0..{spec['shape'][0]} and sorted")
            arrays[key] = (np.memmap(path, dtype=spec["dtype"], mode="r") if want else np.zeros(0, spec["dtype"]), offsets)
        for key, (arr, _) in arrays.items():
            if manifest["keys"].get(key, {}).get("kind") == "tokens" and arr.size:
                tokens += arr.size
                top = int(arr.max())
                max_id = max(max_id, top)
                if top >= vocab:
                    problems.append(f"{shard_dir / (key + '.bin')}: token id {top} >= vocabulary {vocab}")
        for key, (arr, offsets) in arrays.items():
            token_key = _mask_partner(key)
            if token_key and token_key in arrays:
                t_arr, t_off = arrays[token_key]
                if arr.shape != t_arr.shape or not np.array_equal(offsets, t_off):
                    problems.append(f"{shard_dir}: '{key}' is not aligned with '{token_key}' (shape or offsets differ)")
                elif arr.size and int(arr.max()) > 1:
                    problems.append(f"{shard_dir / (key + '.bin')}: mask values other than 0/1")
    if tokens != manifest.get("totals", {}).get("tokens", tokens):
        problems.append(f"{manifest_path}: totals.tokens {manifest['totals']['tokens']} != {tokens} in shards")
    return {"tokens": tokens, "max_token_id": max_id, "vocab_size": vocab, "problems": problems}


def _mask_partner(key: str) -> str | None:
    """The token key a mask key labels: loss_mask->sequence, chosen_mask->chosen, masks->responses."""
    return {"loss_mask": "sequence", "chosen_mask": "chosen", "rejected_mask": "rejected",
            "masks": "responses"}.get(key)
