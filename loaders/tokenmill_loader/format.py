"""The tokenmill token-shard format (docs/format.md): every constant of it, and its one validator.

Both sides import this module: tokenmill's `tokenized_bins` stage writes with these names and builders, and
`Store` reads through `read_dataset` / `read_shard`; the asset check `token_shards_consistent` calls
`validate_dataset`. It needs the standard library and numpy only (no torch, no Dagster), so a writer or a
validator can use it without the training stack. A change here is a format change: bump FORMAT_VERSION.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT_NAME = "tokenmill-shards"
FORMAT_VERSION = 1

# file names of a split folder: dataset.json + tokenizer.json + shard-XXXXX/{meta.json, record_ids.json, <key>.bin}
DATASET_FILE = "dataset.json"
TOKENIZER_FILE = "tokenizer.json"
SHARD_META_FILE = "meta.json"
RECORD_IDS_FILE = "record_ids.json"
SPLITS = ("train", "val")

# special tokens, ids 0.. in this order for a tokenizer trained by tokenmill; dataset.json lists the ids used
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<|title|>", "<|author|>", "<|content|>",
                  "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
PAD_TOKEN = "<pad>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}

# what a key holds (dataset.json keys.<key>.kind), and the dtype of each kind (tokens: the dataset's token dtype)
TOKENS, MASK, VALUES = "tokens", "mask", "values"
KIND_DTYPES = {MASK: "uint8", VALUES: "float32"}
TOKEN_DTYPES = ("uint16", "uint32")

# training type -> {key: kind}, in file order
KEYS: dict[str, dict[str, str]] = {
    "seq": {"sequence": TOKENS},
    "conditional": {"sequence": TOKENS, "loss_mask": MASK},
    "sft": {"sequence": TOKENS, "loss_mask": MASK},
    "dpo": {"chosen": TOKENS, "rejected": TOKENS, "chosen_mask": MASK, "rejected_mask": MASK},
    "grpo": {"prompts": TOKENS, "responses": TOKENS, "masks": MASK, "rewards": VALUES},
}
TRAINING_TYPES = tuple(KEYS)
KIND_OF = {key: kind for keys in KEYS.values() for key, kind in keys.items()}
# the key whose items are the records
RECORD_KEY = {"seq": "sequence", "conditional": "sequence", "sft": "sequence", "dpo": "chosen", "grpo": "prompts"}
TOKEN_KEYS = {tt: tuple(k for k, kind in keys.items() if kind == TOKENS) for tt, keys in KEYS.items()}
ALL_TOKEN_KEYS = ("sequence", "chosen", "rejected", "prompts", "responses")
# mask key -> the token key it masks (same shape and offsets)
MASK_OF = {"loss_mask": "sequence", "chosen_mask": "chosen", "rejected_mask": "rejected", "masks": "responses"}
# grpo: keys with one item per response; record i owns responses GROUP_KEY.offsets[i]:GROUP_KEY.offsets[i+1]
RESPONSE_KEYS = ("responses", "masks")
GROUP_KEY = "rewards"


class DatasetError(ValueError):
    """A dataset on disk does not match its metadata (size, dtype, offsets, shard list, checksum).

    The message always names the offending file.
    """


# ------------------------------------------------------------------------------------------------
# names and dtypes
# ------------------------------------------------------------------------------------------------
def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def data_file(key: str) -> str:
    """The headerless little-endian file of a key inside a shard folder."""
    return f"{key}.bin"


def auto_token_dtype(vocab_size: int) -> str:
    """uint16 when every id of the vocabulary fits, else uint32."""
    return "uint16" if vocab_size <= 2 ** 16 else "uint32"


def dtype_fits(vocab_size: int, token_dtype) -> bool:
    """Every id < vocab_size is representable in token_dtype."""
    return vocab_size <= np.iinfo(np.dtype(token_dtype)).max + 1


def key_dtype(kind: str, token_dtype) -> np.dtype:
    """The dtype of a key of this kind in a dataset whose token dtype is token_dtype."""
    return np.dtype(token_dtype if kind == TOKENS else KIND_DTYPES[kind])


def infer_training_type(keys: Iterable[str]) -> str:
    """The training type a set of keys implies (conditional and sft share their keys: sft)."""
    keys = set(keys)
    if "prompts" in keys:
        return "grpo"
    if "chosen" in keys:
        return "dpo"
    if "loss_mask" in keys:
        return "sft"
    return "seq"


# ------------------------------------------------------------------------------------------------
# builders (the writer's side)
# ------------------------------------------------------------------------------------------------
def key_meta(dtype, offsets) -> dict:
    """One key's entry of a shard's meta.json; offsets are item boundaries 0..len."""
    offsets = [int(x) for x in offsets]
    return {"shape": [offsets[-1]], "dtype": np.dtype(dtype).name, "offsets": offsets}


def dataset_manifest(*, training_type: str, split: str, vocab_size: int, token_dtype, special_tokens: dict,
                     shards: list[dict], totals: dict, tokenizer: dict | None = None,
                     keys: Iterable[str] | None = None) -> dict:
    """dataset.json of a split: `shards` are {name, tokens, records, files: {file: {bytes, sha256}}}; `keys`
    defaults to every key of the training type."""
    token_dtype = np.dtype(token_dtype).name
    manifest = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION,
        "training_type": training_type, "split": split,
        "vocab_size": vocab_size, "token_dtype": token_dtype,
    }
    if tokenizer is not None:
        manifest["tokenizer"] = tokenizer
    manifest.update({
        "special_tokens": special_tokens,
        "keys": {k: {"dtype": key_dtype(KIND_OF[k], token_dtype).name, "kind": KIND_OF[k]}
                 for k in (KEYS[training_type] if keys is None else keys)},
        "shards": shards,
        "totals": totals,
    })
    return manifest


# ------------------------------------------------------------------------------------------------
# the validator (the reader's side)
# ------------------------------------------------------------------------------------------------
@dataclass
class KeyData:
    """One key of one shard, as its meta.json describes it (checked against the file size)."""

    dtype: np.dtype
    length: int
    offsets: np.ndarray


@dataclass
class Shard:
    name: str
    folder: Path
    keys: dict[str, KeyData]
    records: int = 0

    def path(self, key: str) -> Path:
        return self.folder / data_file(key)


@dataclass
class Dataset:
    """A split folder whose dataset.json, meta.json files and data files agree."""

    folder: Path
    manifest: dict
    training_type: str
    shards: list[Shard]
    tokens: int = 0
    max_token_id: int | None = None  # with scan=True
    problems: list[str] = field(default_factory=list)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def read_json(path: Path, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing ({what})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise DatasetError(f"{path}: not valid JSON ({what}): {e}") from None


def _int(value, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DatasetError(f"{where}: {what} must be an integer, not {value!r}")
    return value


def _map(path: Path, dtype: np.dtype, length: int) -> np.ndarray:
    return np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r", shape=(length,)) if length else \
        np.empty(0, dtype=dtype)


def check_records(shard: Shard, training_type: str | None, where) -> int:
    """The structure every shard keeps (masks aligned with their tokens, one item per record, grpo groups);
    sets and returns shard.records."""
    keys = shard.keys
    tt = training_type or infer_training_type(keys)
    rkey = RECORD_KEY[tt]
    if rkey not in keys:
        raise DatasetError(f"{where}: training_type {tt} needs key {rkey!r}; keys are {sorted(keys)}")
    shard.records = len(keys[rkey].offsets) - 1
    for mk, tk in MASK_OF.items():
        if mk in keys and (tk not in keys or not np.array_equal(keys[mk].offsets, keys[tk].offsets)):
            raise DatasetError(f"{where}: {mk} does not have the shape/offsets of {tk}")
    for k, spec in keys.items():
        if k not in RESPONSE_KEYS and len(spec.offsets) - 1 != shard.records:
            raise DatasetError(f"{where}: key {k!r} has {len(spec.offsets) - 1} items, "
                               f"expected {shard.records} records")
    if tt == "grpo":
        if GROUP_KEY not in keys:
            raise DatasetError(f"{where}: grpo needs {GROUP_KEY!r} (its offsets group the responses)")
        responses = keys[GROUP_KEY].length
        for k in RESPONSE_KEYS:
            if k in keys and len(keys[k].offsets) - 1 != responses:
                raise DatasetError(f"{where}: {k} has {len(keys[k].offsets) - 1} responses, "
                                   f"{GROUP_KEY} has {responses}")
    return shard.records


def read_shard(folder: Path, training_type: str | None = None, declared: dict | None = None,
               manifest_path: Path | None = None) -> Shard:
    """A shard folder's meta.json checked against its data files (and the dtypes dataset.json declares)."""
    folder = Path(folder)
    mpath = folder / SHARD_META_FILE
    meta = read_json(mpath, "shard metadata")
    if not isinstance(meta, dict) or not meta:
        raise DatasetError(f"{mpath}: expected a mapping from key to {{shape, dtype, offsets}}")
    shard = Shard(folder.name, folder, {})
    for key, m in meta.items():
        try:
            shape = [int(x) for x in m["shape"]]
            dt = np.dtype(m["dtype"])
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{mpath}: key {key!r}: bad shape/dtype ({e})") from None
        spec = (declared or {}).get(key)
        want = spec.get("dtype") if isinstance(spec, dict) else None
        if want is not None:  # before the size check, so a wrong dtype is not reported as truncation
            try:
                want_dt = np.dtype(want)
            except TypeError:
                raise DatasetError(f"{manifest_path}: key {key!r} declares an unknown dtype {want!r}") from None
            if want_dt != dt:
                raise DatasetError(f"{mpath}: {key} has dtype {dt}, {manifest_path} declares {want}")
        if len(shape) != 1:
            raise DatasetError(f"{mpath}: key {key!r}: shape {shape} is not one-dimensional")
        n = shape[0]
        bpath = folder / data_file(key)
        if not bpath.exists():
            raise DatasetError(f"{bpath}: missing (listed in {mpath})")
        size = bpath.stat().st_size
        if size != n * dt.itemsize:
            raise DatasetError(f"{bpath}: {size} bytes, expected {n * dt.itemsize} = {n} x {dt} "
                               f"from {mpath} (truncated or corrupted)")
        offs = m.get("offsets")
        if offs is None:
            raise DatasetError(f"{mpath}: key {key!r} has no offsets")
        raw = np.asarray(offs)
        if raw.size and raw.dtype.kind not in "iu":
            raise DatasetError(f"{mpath}: key {key!r}: offsets must be integers (found {raw.dtype} values)")
        offs = raw.astype(np.int64)
        if offs.ndim != 1 or len(offs) < 1 or offs[0] != 0 or offs[-1] != n:
            raise DatasetError(f"{mpath}: key {key!r}: offsets must start at 0 and end at shape[0]={n}")
        if len(offs) > 1 and (np.diff(offs) < 0).any():
            bad = int(np.argmax(np.diff(offs) < 0))
            raise DatasetError(f"{mpath}: key {key!r}: offsets decrease at item {bad}")
        shard.keys[key] = KeyData(dt, n, offs)
    check_records(shard, training_type, mpath)
    return shard


def _check_listed_files(folder: Path, files, dpath: Path, checksums: bool) -> None:
    if not isinstance(files, dict):
        raise DatasetError(f"{dpath}: 'files' of shard {folder.name} must be an object")
    for fname, fmeta in files.items():
        fpath = folder / fname
        if not isinstance(fmeta, dict) or Path(fname).name != fname:
            raise DatasetError(f"{dpath}: file entry {fname!r} of {folder.name} must name a file of the shard "
                               f"with an object {{bytes, sha256}}")
        if not fpath.is_file():
            raise DatasetError(f"{fpath}: listed in {dpath} but missing")
        size = fpath.stat().st_size
        if "bytes" in fmeta and size != _int(fmeta["bytes"], str(dpath), f"{fname} bytes"):
            raise DatasetError(f"{fpath}: {size} bytes, {dpath} lists {fmeta['bytes']} "
                               f"(truncated, corrupted or from another build)")
        if checksums and fmeta.get("sha256") and sha256_file(fpath) != fmeta["sha256"]:
            raise DatasetError(f"{fpath}: sha256 differs from {dpath} (corrupted)")


def _check_shard_data(shard: Shard, vocab: int | None, dpath: Path) -> int:
    """Reads the data: token ids < vocab_size, masks 0/1. Returns the largest token id (-1: none)."""
    top_id = -1
    for key, spec in shard.keys.items():
        if not spec.length:
            continue
        arr = _map(shard.path(key), spec.dtype, spec.length)
        if key in ALL_TOKEN_KEYS:
            top = int(arr.max())
            top_id = max(top_id, top)
            if vocab and top >= vocab:
                raise DatasetError(f"{shard.path(key)}: token id {top} >= vocab_size {vocab} of {dpath}")
        elif key in MASK_OF and int(arr.max()) > 1:
            raise DatasetError(f"{shard.path(key)}: mask values other than 0/1")
    return top_id


def _manifest(folder: Path) -> tuple[Path, dict, str | None]:
    dpath = folder / DATASET_FILE
    info = read_json(dpath, "dataset description")
    if not isinstance(info, dict):
        raise DatasetError(f"{dpath}: expected a JSON object")
    if info.get("format") != FORMAT_NAME:
        raise DatasetError(f"{dpath}: format is {info.get('format')!r}, expected {FORMAT_NAME!r}")
    if info.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{dpath}: format_version {info.get('format_version')!r} is not supported "
                           f"(this loader reads {FORMAT_VERSION})")
    if not isinstance(info.get("shards"), list):
        raise DatasetError(f"{dpath}: 'shards' must be a list")
    for name in ("keys", "totals", "special_tokens", "tokenizer"):
        if info.get(name) is not None and not isinstance(info[name], dict):
            raise DatasetError(f"{dpath}: '{name}' must be an object")
    tt = info.get("training_type")
    if tt is not None and tt not in RECORD_KEY:
        raise DatasetError(f"{dpath}: unknown training_type {tt!r}")
    if info.get("vocab_size") is not None:
        _int(info["vocab_size"], str(dpath), "vocab_size")
    tokdt = info.get("token_dtype")
    if tokdt is not None and tokdt not in TOKEN_DTYPES:
        raise DatasetError(f"{dpath}: token_dtype {tokdt!r} is not one of {TOKEN_DTYPES}")
    return dpath, info, tt


def _dataset_shard(root: Path, entry, info: dict, tt: str | None, dpath: Path, checksums: bool) -> Shard:
    if not isinstance(entry, dict):
        raise DatasetError(f"{dpath}: shard entry {entry!r} is not an object")
    name = entry.get("name")
    # a shard is a folder of the dataset, never a path leaving it
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise DatasetError(f"{dpath}: shard name {name!r} is not a folder name inside the dataset")
    folder = root / name
    if not folder.is_dir():
        raise DatasetError(f"{folder}: shard listed in {dpath} is missing")
    _check_listed_files(folder, entry.get("files") or {}, dpath, checksums)
    declared = info.get("keys") or {}
    shard = read_shard(folder, tt, declared, dpath)
    for k in shard.keys:
        if declared and k not in declared:
            raise DatasetError(f"{folder / SHARD_META_FILE}: key {k!r} is not declared in {dpath}")
    for k in declared:
        if k not in shard.keys:
            raise DatasetError(f"{folder / SHARD_META_FILE}: key {k!r} declared in {dpath} is missing")
    tokens = sum(shard.keys[k].length for k in TOKEN_KEYS[tt or infer_training_type(shard.keys)] if k in shard.keys)
    if "records" in entry and _int(entry["records"], str(dpath), "records") != shard.records:
        raise DatasetError(f"{folder / SHARD_META_FILE}: {shard.records} records, {dpath} lists {entry['records']}")
    if "tokens" in entry and _int(entry["tokens"], str(dpath), "tokens") != tokens:
        raise DatasetError(f"{folder / SHARD_META_FILE}: {tokens} tokens, {dpath} lists {entry['tokens']}")
    tokdt = info.get("token_dtype")
    for k in ALL_TOKEN_KEYS:
        if tokdt is not None and k in shard.keys and shard.keys[k].dtype != np.dtype(tokdt):
            raise DatasetError(f"{folder / SHARD_META_FILE}: {k} is {shard.keys[k].dtype}, "
                               f"{dpath} token_dtype is {tokdt}")
    return shard


def validate_dataset(folder, *, checksums: bool = False, scan: bool = False, collect: bool = False) -> Dataset:
    """A split folder checked against its dataset.json: shard list, file sizes, meta.json (dtypes, offsets,
    alignment, record counts), totals; `checksums` adds the SHA-256 of every listed file, `scan` reads the
    data (token ids < vocab_size, masks 0/1).

    Raises DatasetError (naming the file) at the first problem; with `collect`, a shard's problem is listed
    in `problems` and the next shard is checked (a dataset.json that cannot be read still raises).
    """
    root = Path(folder)
    dpath, info, tt = _manifest(root)
    dataset = Dataset(root, info, tt or "seq", [])
    vocab = info.get("vocab_size")

    def problem(e: DatasetError) -> None:
        if not collect:
            raise e
        dataset.problems.append(str(e))

    top_id = -1
    for entry in info["shards"]:
        try:
            shard = _dataset_shard(root, entry, info, tt, dpath, checksums)
            if scan:
                top_id = max(top_id, _check_shard_data(shard, vocab, dpath))
        except DatasetError as e:
            problem(e)
            continue
        dataset.shards.append(shard)
    if tt is None and dataset.shards:
        dataset.training_type = infer_training_type(dataset.shards[0].keys)
    dataset.tokens = sum(s.keys[k].length for s in dataset.shards for k in TOKEN_KEYS[dataset.training_type]
                         if k in s.keys)
    dataset.max_token_id = top_id if scan else None
    if dataset.problems:
        return dataset  # totals cannot agree with a shard list that has holes
    totals = info.get("totals") or {}
    if "records" in totals and _int(totals["records"], str(dpath), "totals.records") != \
            sum(s.records for s in dataset.shards):
        problem(DatasetError(f"{dpath}: totals.records {totals['records']} != sum over shards "
                             f"{sum(s.records for s in dataset.shards)}"))
    if "tokens" in totals and _int(totals["tokens"], str(dpath), "totals.tokens") != dataset.tokens:
        problem(DatasetError(f"{dpath}: totals.tokens {totals['tokens']} != {dataset.tokens} in the shards"))
    return dataset


def read_record_ids(shard_folder: Path) -> list[str]:
    """record_ids.json of a shard: the record id of each record, in order (lineage; the loader ignores it)."""
    return read_json(Path(shard_folder) / RECORD_IDS_FILE, "record ids")


def dumps_compact(obj) -> bytes:
    """How meta.json and record_ids.json are serialized (compact separators: they hold long offset lists)."""
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")

