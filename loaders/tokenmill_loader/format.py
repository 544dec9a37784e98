"""The tokenmill token-shard format (docs/format.md): every constant of it, and its one validator.

Both sides import this module: tokenmill's `tokenized_bins` stage writes with these names and builders, and
`Store` reads through `validate_dataset` / `read_shard` / `read_manifest`; the asset check `token_shards_consistent`
calls `validate_dataset`. A split may hold several versions, each an immutable manifest (`version_file`,
`read_manifest(folder, version)`); the latest is the one tokenized_bins/current.json names for both splits
(`current_version`; without the pointer, dataset.json). It needs the standard library and numpy only (no torch, no
Dagster), so a writer or a validator can use it without the training stack. A change here is a format change: bump
FORMAT_VERSION (a new optional field or file that older readers ignore, like a shard's max_token_id, a manifest's
version, generation, batches and encoding, or current.json, is not).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import reprlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

FORMAT_NAME = "tokenmill-shards"
FORMAT_VERSION = 1

# file names of a split folder: dataset.json + tokenizer.json + shard-XXXXX/{meta.json, record_ids.json, <key>.bin};
# a versioned split also holds one immutable manifest per version (dataset.v000001.json, ...; dataset.json is a copy
# of the latest one) and the tokenizer of each version under a content-addressed name (tokenizer-<sha256[:16]>.json)
DATASET_FILE = "dataset.json"
TOKENIZER_FILE = "tokenizer.json"
VERSION_FILE = re.compile(r"dataset\.v(\d{6})\.json")
# tokenizer files the tokenizer folder may hold besides tokenizer.json (Hugging Face's AutoTokenizer reads them)
TOKENIZER_EXTRA_FILES = ("tokenizer_config.json", "special_tokens_map.json")
SHARD_META_FILE = "meta.json"
RECORD_IDS_FILE = "record_ids.json"
SPLITS = ("train", "val")
# tokenized_bins/current.json, {"version": K}: the version every split publishes, replaced atomically, so train and
# val switch together (a folder written before it has none: each split's dataset.json is its latest)
CURRENT_FILE = "current.json"

# special tokens, ids 0.. in this order for a tokenizer trained by tokenmill; dataset.json lists the ids used
SPECIAL_TOKENS = (
    "<s>",
    "</s>",
    "<pad>",
    "<|title|>",
    "<|author|>",
    "<|content|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)
PAD_TOKEN = "<pad>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}

# what a key holds (dataset.json keys.<key>.kind), and the dtype of each kind (tokens: the dataset's token dtype)
TOKENS, MASK, VALUES = "tokens", "mask", "values"
KIND_DTYPES = {MASK: "uint8", VALUES: "float32"}
TOKEN_DTYPES = ("uint16", "uint32")
DATA_DTYPES = frozenset(TOKEN_DTYPES) | set(KIND_DTYPES.values())
MAX_VOCAB_SIZE = 2**32  # every id fits the widest token dtype
# shard folders, keys and listed files are plain names inside their folder: no separators, no "..", no hidden files
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")

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
SHARD_DIR = re.compile(r"shard-(\d{5,})")


def shard_folder_name(index: int) -> str:
    """The folder of a split's index-th shard (its data files, meta and record ids)."""
    return f"shard-{index:05d}"


def data_file(key: str) -> str:
    """The headerless little-endian file of a key inside a shard folder."""
    return f"{key}.bin"


def version_file(version: int) -> str:
    """The immutable manifest of one version of a split."""
    return f"dataset.v{version:06d}.json"


def versioned_tokenizer_file(sha256: str) -> str:
    """The immutable copy of the tokenizer a version was encoded with, named by its content."""
    return f"tokenizer-{sha256[:16]}.json"


def list_versions(folder) -> list[int]:
    """The versions whose manifest is in a split folder, ascending."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for m in map(VERSION_FILE.fullmatch, os.listdir(folder)) if m)


def auto_token_dtype(vocab_size: int) -> str:
    """uint16 when every id of the vocabulary fits, else uint32."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


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
    offsets = np.asarray(offsets, dtype=np.int64).tolist()  # Python ints, far faster than int() per item
    return {"shape": [offsets[-1]], "dtype": np.dtype(dtype).name, "offsets": offsets}


def shard_entry(
    name: str, *, tokens: int, records: int, max_token_id: int, files: dict, batch: str | None = None
) -> dict:
    """One shard of dataset.json `shards`: `max_token_id` is the largest id of its token keys (-1: no tokens), so
    a reader checks it against vocab_size without reading the data; `files` maps file -> {bytes, sha256}; `batch`
    names the input batch its records came from (a shard never holds two batches)."""
    entry: dict = {"name": name}
    if batch is not None:
        entry["batch"] = batch
    entry.update({"tokens": int(tokens), "records": int(records), "max_token_id": int(max_token_id), "files": files})
    return entry


def dataset_manifest(
    *,
    training_type: str,
    split: str,
    vocab_size: int,
    token_dtype,
    special_tokens: dict,
    shards: list[dict],
    totals: dict,
    tokenizer: dict | None = None,
    keys: Iterable[str] | None = None,
    version: dict | None = None,
) -> dict:
    """dataset.json of a split: `shards` are `shard_entry`s; `keys` defaults to every key of the training type.

    `version` ({"version", "generation", "batches", "encoding"}) makes it the manifest of one version: its number
    (1, 2, ... in publish order), the generation (bumped when the dataset is encoded again from scratch: another
    tokenizer or encoding settings), the input batches it holds in order, and the encoding settings."""
    token_dtype = np.dtype(token_dtype).name
    manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **(version or {})}
    manifest.update(
        {
            "training_type": training_type,
            "split": split,
            "vocab_size": vocab_size,
            "token_dtype": token_dtype,
        }
    )
    if tokenizer is not None:
        manifest["tokenizer"] = tokenizer
    manifest.update(
        {
            "special_tokens": special_tokens,
            "keys": {
                k: {"dtype": key_dtype(KIND_OF[k], token_dtype).name, "kind": KIND_OF[k]}
                for k in (KEYS[training_type] if keys is None else keys)
            },
            "shards": shards,
            "totals": totals,
        }
    )
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
    max_token_id: int | None = None  # as dataset.json records it (None: not recorded, an older manifest)
    meta_sha256: str = ""  # of the meta.json bytes read (with read_shard(digest=True))

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
    manifest_sha256: str = ""  # of the dataset.json bytes read: identifies the dataset (it lists every file's hash)
    problems: list[str] = field(default_factory=list)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 60, 60, 40


def _show(value) -> str:
    """A bounded repr for messages: a hostile value can be huge or deeply nested."""
    return _SHORT.repr(value)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


_OFFSETS_OPEN = b'"offsets":['
_PARSE_LISTS_ABOVE = 1 << 20  # bytes of JSON above which offsets lists are parsed by numpy


def _int_lists_as_arrays(data: bytes, nonce: str) -> tuple[bytes, list[np.ndarray]]:
    """`data` with each `"offsets":[...]` list of plain integers replaced by a placeholder string (a nonce drawn
    for this call and the list's index in the returned arrays, so no string of the file can pass for one), and those
    lists as int64 arrays: numpy parses them faster than json + np.asarray (a 10B-token dataset's meta.json
    files hold ~10M offsets). Lists with anything but digits and single commas are left to json; a number past
    int64 saturates, which the offsets checks then refuse."""
    arrays: list[np.ndarray] = []
    pieces, copied, at = [], 0, 0
    while (at := data.find(_OFFSETS_OPEN, at)) >= 0:
        begin = at + len(_OFFSETS_OPEN)
        end = data.find(b"]", begin)
        if end < 0:
            break
        text = data[begin:end]
        if text and not text.translate(None, b"0123456789,"):
            arr = np.fromstring(text, dtype=np.int64, sep=",")
            if len(arr) == text.count(b",") + 1:  # no empty item ("1,,2", "1,2,")
                pieces += [data[copied:at], b'"offsets":"%s%d"' % (nonce.encode(), len(arrays))]
                arrays.append(arr)
                copied = end + 1
        at = end + 1
    return b"".join([*pieces, data[copied:]]), arrays


def _put_arrays(obj, arrays: list[np.ndarray], nonce: str):
    """Placeholders back: each key's `offsets` placeholder becomes its array."""
    if isinstance(obj, dict):
        for m in obj.values():
            at = m.get("offsets") if isinstance(m, dict) else None
            if isinstance(at, str) and at.startswith(nonce):
                m["offsets"] = arrays[int(at[len(nonce) :])]
    return obj


def load_json(path: Path, what: str, digest: bool = True, offsets_as_arrays: bool = False) -> tuple[object, str]:
    """A JSON file and the SHA-256 of the bytes parsed ("" unless `digest`). Unreadable, invalid (NaN, numbers
    over Python's 4300 digits, nesting past the recursion limit) or non-UTF-8 content raises DatasetError naming
    the file. `offsets_as_arrays` (meta.json): in a large file, the keys' offsets lists come as int64 arrays."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing ({what})") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({what}): {e.strerror or e}") from None
    arrays: list[np.ndarray] = []
    text = data
    nonce = f"offsets-{secrets.token_hex(8)}-"
    if offsets_as_arrays and len(data) > _PARSE_LISTS_ABOVE:
        text, arrays = _int_lists_as_arrays(data, nonce)
    try:
        content = json.loads(text.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DatasetError(f"{path}: not valid JSON ({what}): {str(e)[:200]}") from None
    return _put_arrays(content, arrays, nonce) if arrays else content, hashlib.sha256(
        data
    ).hexdigest() if digest else ""


def _int(value, where, what: str, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DatasetError(f"{where}: {what} must be an integer, not {_show(value)}")
    if low is not None and value < low:
        raise DatasetError(f"{where}: {what} {_show(value)} is below {low}")
    if high is not None and value > high:
        raise DatasetError(f"{where}: {what} {_show(value)} is above {high}")
    return value


def _plain_name(name, where, what: str) -> str:
    """name, refused unless it is a plain file or folder name (no separator, no "..", not hidden)."""
    if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name):
        raise DatasetError(f"{where}: {what} {_show(name)} is not a plain name inside its folder")
    return name


def _confine(path: Path, inside: str, where) -> Path:
    """path, refused when it resolves (through a symlink) outside the real folder `inside`."""
    real = os.path.realpath(path)
    if real != inside and not real.startswith(inside.rstrip(os.sep) + os.sep):
        raise DatasetError(f"{path}: resolves to {real}, outside {inside} (named in {where})")
    return path


SCAN_BYTES = 16 << 20  # a data file is scanned through one buffer of this size: mapped, every page it touched
# stayed in the checking process's resident memory until the file was done (hundreds of MiB on a 10M-document
# version)


def _largest(path: Path, dtype: np.dtype, length: int) -> int:
    """The largest of the first `length` values of a data file (-1: none), read block by block."""
    dtype = dtype.newbyteorder("<")
    buf = np.empty(max(1, min(length, SCAN_BYTES // dtype.itemsize)), dtype=dtype)
    top, done = -1, 0
    with open(path, "rb") as f:
        while done < length:
            block = buf[: min(len(buf), length - done)]
            if f.readinto(block.view(np.uint8).data) != block.nbytes:
                raise DatasetError(f"{path}: shorter than its {length} listed values (truncated)")
            top = max(top, int(block.max()))
            done += len(block)
    return top


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
            raise DatasetError(
                f"{where}: key {k!r} has {len(spec.offsets) - 1} items, expected {shard.records} records"
            )
    if tt == "grpo":
        if GROUP_KEY not in keys:
            raise DatasetError(f"{where}: grpo needs {GROUP_KEY!r} (its offsets group the responses)")
        responses = keys[GROUP_KEY].length
        for k in RESPONSE_KEYS:
            if k in keys and len(keys[k].offsets) - 1 != responses:
                raise DatasetError(
                    f"{where}: {k} has {len(keys[k].offsets) - 1} responses, {GROUP_KEY} has {responses}"
                )
    return shard.records


def _offsets(value, n: int, mpath: Path, key: str) -> np.ndarray:
    """A key's item boundaries: a flat list of integers from 0 to n, non-decreasing."""
    try:
        raw = value if isinstance(value, np.ndarray) else np.asarray(value) if isinstance(value, list) else None
    except (ValueError, TypeError, OverflowError, RecursionError):  # ragged or absurdly nested lists
        raw = None
    if raw is None or raw.ndim != 1 or (raw.size and raw.dtype.kind not in "iu"):
        raise DatasetError(f"{mpath}: key {key!r}: offsets must be integers (a flat JSON list)")
    offs = raw.astype(np.int64)
    if len(offs) < 1 or offs[0] != 0 or offs[-1] != n:
        raise DatasetError(f"{mpath}: key {key!r}: offsets must start at 0 and end at shape[0]={n}")
    if len(offs) > 1 and (np.diff(offs) < 0).any():
        bad = int(np.argmax(np.diff(offs) < 0))
        raise DatasetError(f"{mpath}: key {key!r}: offsets decrease at item {bad}")
    return offs


def read_shard(
    folder: Path,
    training_type: str | None = None,
    declared: dict | None = None,
    manifest_path: Path | None = None,
    digest: bool = False,
    lazy_data: bool = False,
) -> Shard:
    """A shard folder's meta.json checked against its data files (and the dtypes dataset.json declares); every
    file read must resolve inside the shard folder. `digest` sets meta_sha256 (a shard opened alone). `lazy_data`:
    a data file may be absent (a remote store's cache fetches it on first touch and checks it then)."""
    folder = Path(folder)
    inside = os.path.realpath(folder)
    mpath = _confine(folder / SHARD_META_FILE, inside, folder)
    meta, meta_sha256 = load_json(mpath, "shard metadata", digest, offsets_as_arrays=True)
    if not isinstance(meta, dict) or not meta:
        raise DatasetError(f"{mpath}: expected a mapping from key to {{shape, dtype, offsets}}")
    shard = Shard(folder.name, folder, {}, meta_sha256=meta_sha256)
    for key, m in meta.items():
        _plain_name(key, mpath, "key")
        if not isinstance(m, dict):
            raise DatasetError(f"{mpath}: key {key!r}: expected an object {{shape, dtype, offsets}}, not {_show(m)}")
        shape, dtype_name = m.get("shape"), m.get("dtype")
        if not isinstance(shape, list) or len(shape) != 1:
            raise DatasetError(f"{mpath}: key {key!r}: shape {_show(shape)} is not one-dimensional [length]")
        n = _int(shape[0], mpath, f"key {key!r} shape[0]", low=0)
        if not isinstance(dtype_name, str) or dtype_name not in DATA_DTYPES:
            raise DatasetError(f"{mpath}: key {key!r}: dtype {_show(dtype_name)} is not one of {sorted(DATA_DTYPES)}")
        dt = np.dtype(dtype_name)
        spec = (declared or {}).get(key)
        want = spec.get("dtype") if isinstance(spec, dict) else None  # _manifest checked it is a dtype name
        if want is not None and want != dtype_name:  # before the size check: a wrong dtype is not truncation
            raise DatasetError(f"{mpath}: {key} has dtype {dt}, {manifest_path} declares {want}")
        bpath = _confine(folder / data_file(key), inside, mpath)
        present = bpath.is_file()
        if not present and not lazy_data:
            raise DatasetError(f"{bpath}: missing (listed in {mpath})")
        size = bpath.stat().st_size if present else n * dt.itemsize
        if size != n * dt.itemsize:
            raise DatasetError(
                f"{bpath}: {size} bytes, expected {n * dt.itemsize} = {n} x {dt} from {mpath} (truncated or corrupted)"
            )
        shard.keys[key] = KeyData(dt, n, _offsets(m.get("offsets"), n, mpath, key))
    check_records(shard, training_type, mpath)
    return shard


def _check_listed_files(folder: Path, files, dpath: Path, checksums: bool, lazy_data: bool = False) -> None:
    if not isinstance(files, dict):
        raise DatasetError(f"{dpath}: 'files' of shard {folder.name} must be an object")
    inside = os.path.realpath(folder)
    for fname, fmeta in files.items():
        _plain_name(fname, dpath, f"file of shard {folder.name}")
        if not isinstance(fmeta, dict):
            raise DatasetError(f"{dpath}: file entry {fname!r} of {folder.name} must be an object {{bytes, sha256}}")
        fpath = _confine(folder / fname, inside, dpath)
        if lazy_data and fname != SHARD_META_FILE and not fpath.is_file():
            continue  # fetched on first touch, its bytes and SHA-256 checked against this entry then
        if not fpath.is_file():
            raise DatasetError(f"{fpath}: listed in {dpath} but missing")
        size = fpath.stat().st_size
        if "bytes" in fmeta and size != _int(fmeta["bytes"], dpath, f"{fname} bytes"):
            raise DatasetError(
                f"{fpath}: {size} bytes, {dpath} lists {fmeta['bytes']} (truncated, corrupted or from another build)"
            )
        sha = fmeta.get("sha256")
        if sha is not None and not isinstance(sha, str):
            raise DatasetError(f"{dpath}: sha256 of {fname} in {folder.name} must be a string, not {_show(sha)}")
        if checksums and sha and sha256_file(fpath) != sha:
            raise DatasetError(f"{fpath}: sha256 differs from {dpath} (corrupted)")


def _check_shard_data(shard: Shard, vocab: int | None, dpath: Path) -> int:
    """Reads the data: token ids < vocab_size, masks 0/1. Returns the largest token id (-1: none)."""
    top_id = -1
    for key, spec in shard.keys.items():
        if not spec.length:
            continue
        top = _largest(shard.path(key), spec.dtype, spec.length)
        if key in ALL_TOKEN_KEYS:
            top_id = max(top_id, top)
            if vocab and top >= vocab:
                raise DatasetError(f"{shard.path(key)}: token id {top} >= vocab_size {vocab} of {dpath}")
        elif key in MASK_OF and top > 1:
            raise DatasetError(f"{shard.path(key)}: mask values other than 0/1")
    return top_id


def current_version(folder) -> int | None:
    """The version the split folder's tokenized_bins publishes (its parent's current.json); None when there is no
    such pointer (a lone split folder, or one written before the pointer: its dataset.json is the latest)."""
    folder = Path(folder)
    pointer = folder.parent / CURRENT_FILE
    if folder.name not in SPLITS or not pointer.is_file():
        return None
    info, _ = load_json(pointer, "the published version of every split")
    if not isinstance(info, dict):
        raise DatasetError(f"{pointer}: expected a JSON object")
    return _int(info.get("version"), pointer, "version", low=1)


def manifest_path(folder: Path, version: int | None = None) -> Path:
    """The latest version's manifest (the one current.json names, else dataset.json), or the manifest of `version`,
    refused with the versions available when it is not there (never published, or removed by retention)."""
    folder = Path(folder)
    if version is None:
        current = current_version(folder)
        if current is None:
            return folder / DATASET_FILE
        if not (folder / version_file(current)).is_file():
            raise DatasetError(
                f"{folder / version_file(current)}: missing, while {folder.parent / CURRENT_FILE} publishes "
                f"version {current}"
            )
        return folder / version_file(current)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise DatasetError(
            f"{folder}: version must be an integer >= 1 (versions are numbered 1, 2, ...), not {version!r}"
        )
    path = folder / version_file(version)
    if not path.is_file():
        available = list_versions(folder)
        raise DatasetError(
            f"{path}: version {version} is not available (never published, or removed by retention); "
            + (
                f"available: {', '.join(map(str, available))} (open_store(path, version=K) pins one, "
                f"version=None opens the latest)"
                if available
                else "this folder has no versions (written before versions existed: open it without version)"
            )
        )
    return path


def _check_version_fields(info: dict, dpath: Path, version: int | None) -> None:
    for name in ("version", "generation"):
        if name in info:
            _int(info[name], dpath, name, low=1)
    batches = info.get("batches")
    if batches is not None and (not isinstance(batches, list) or not all(isinstance(b, str) for b in batches)):
        raise DatasetError(f"{dpath}: 'batches' must be a list of batch keys")
    if version is not None and info.get("version") != version:
        raise DatasetError(f"{dpath}: holds version {_show(info.get('version'))}, not {version}")


def read_manifest(folder: Path, version: int | None = None) -> tuple[Path, dict, str]:
    """(path, content, SHA-256 of its bytes) of a split's dataset.json (or of the manifest of `version`), every
    field the loader uses checked for its type and range (shard entries are checked by validate_dataset)."""
    dpath = manifest_path(folder, version)
    info, sha256 = load_json(dpath, "dataset description")
    if not isinstance(info, dict):
        raise DatasetError(f"{dpath}: expected a JSON object")
    _check_version_fields(info, dpath, version)
    if info.get("format") != FORMAT_NAME:
        raise DatasetError(f"{dpath}: format is {_show(info.get('format'))}, expected {FORMAT_NAME!r}")
    version = info.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise DatasetError(
            f"{dpath}: format_version {_show(version)} is not supported (this loader reads {FORMAT_VERSION})"
        )
    if not isinstance(info.get("shards"), list):
        raise DatasetError(f"{dpath}: 'shards' must be a list")
    for name in ("keys", "totals", "special_tokens", "tokenizer"):
        if info.get(name) is not None and not isinstance(info[name], dict):
            raise DatasetError(f"{dpath}: '{name}' must be an object")
    tt = info.get("training_type")
    if tt is not None and (not isinstance(tt, str) or tt not in RECORD_KEY):
        raise DatasetError(f"{dpath}: unknown training_type {_show(tt)}")
    vocab = info.get("vocab_size")
    if vocab is not None:
        _int(vocab, dpath, "vocab_size", low=1, high=MAX_VOCAB_SIZE)
    tokdt = info.get("token_dtype")
    if tokdt is not None and (not isinstance(tokdt, str) or tokdt not in TOKEN_DTYPES):
        raise DatasetError(f"{dpath}: token_dtype {_show(tokdt)} is not one of {TOKEN_DTYPES}")
    for key, spec in (info.get("keys") or {}).items():
        _plain_name(key, dpath, "key")
        if not isinstance(spec, dict) or not isinstance(spec.get("dtype"), str) or spec["dtype"] not in DATA_DTYPES:
            raise DatasetError(
                f"{dpath}: keys.{key} must be an object whose dtype is one of {sorted(DATA_DTYPES)}, not {_show(spec)}"
            )
    for token, token_id in (info.get("special_tokens") or {}).items():
        _int(token_id, dpath, f"special_tokens[{_show(token)}]", low=0, high=None if vocab is None else vocab - 1)
    for name, value in (info.get("totals") or {}).items():
        if name in ("records", "tokens"):
            _int(value, dpath, f"totals.{name}", low=0)
    tokenizer = info.get("tokenizer") or {}
    if "file" in tokenizer:
        _plain_name(tokenizer["file"], dpath, "tokenizer.file")
    return dpath, info, sha256


def _recorded_max_id(value, tokens: int, vocab: int | None, name: str, dpath: Path) -> int:
    """A shard's max_token_id from dataset.json, refused when the vocabulary cannot hold it."""
    top = _int(value, dpath, f"max_token_id of shard {name}", low=-1)
    if vocab is not None and top >= vocab:
        raise DatasetError(
            f"{dpath}: shard {name} holds token id {top} >= vocab_size {vocab} "
            f"(tokens from another vocabulary, or corrupted)"
        )
    if (top < 0) != (tokens == 0):
        raise DatasetError(f"{dpath}: max_token_id {top} of shard {name} does not fit its {tokens} tokens")
    return top


def _dataset_shard(
    root: Path, entry, info: dict, tt: str | None, dpath: Path, checksums: bool, lazy_data: bool = False
) -> Shard:
    if not isinstance(entry, dict):
        raise DatasetError(f"{dpath}: shard entry {_show(entry)} is not an object")
    # a shard is a folder of the dataset, never a path or a symlink leaving it
    name = _plain_name(entry.get("name"), dpath, "shard name")
    folder = _confine(root / name, os.path.realpath(root), dpath)
    if not folder.is_dir():
        raise DatasetError(f"{folder}: shard listed in {dpath} is missing")
    _check_listed_files(folder, entry.get("files", {}), dpath, checksums, lazy_data)
    declared = info.get("keys") or {}
    shard = read_shard(folder, tt, declared, dpath, lazy_data=lazy_data)
    for k in shard.keys:
        if declared and k not in declared:
            raise DatasetError(f"{folder / SHARD_META_FILE}: key {k!r} is not declared in {dpath}")
    for k in declared:
        if k not in shard.keys:
            raise DatasetError(f"{folder / SHARD_META_FILE}: key {k!r} declared in {dpath} is missing")
    tokens = sum(shard.keys[k].length for k in TOKEN_KEYS[tt or infer_training_type(shard.keys)] if k in shard.keys)
    if "records" in entry and _int(entry["records"], dpath, "records") != shard.records:
        raise DatasetError(f"{folder / SHARD_META_FILE}: {shard.records} records, {dpath} lists {entry['records']}")
    if "tokens" in entry and _int(entry["tokens"], dpath, "tokens") != tokens:
        raise DatasetError(f"{folder / SHARD_META_FILE}: {tokens} tokens, {dpath} lists {entry['tokens']}")
    if "max_token_id" in entry:
        shard.max_token_id = _recorded_max_id(entry["max_token_id"], tokens, info.get("vocab_size"), name, dpath)
    tokdt = info.get("token_dtype")
    for k in ALL_TOKEN_KEYS:
        if tokdt is not None and k in shard.keys and shard.keys[k].dtype != np.dtype(tokdt):
            raise DatasetError(
                f"{folder / SHARD_META_FILE}: {k} is {shard.keys[k].dtype}, {dpath} token_dtype is {tokdt}"
            )
    return shard


def validate_dataset(
    folder,
    *,
    checksums: bool = False,
    scan: bool = False,
    collect: bool = False,
    version: int | None = None,
    lazy_data: bool = False,
) -> Dataset:
    """A split folder checked against its dataset.json (or the manifest of `version`): shard list (plain names
    resolving inside the folder), file sizes, meta.json (dtypes, offsets, alignment, record counts), totals, each
    shard's recorded max_token_id < vocab_size; `checksums` adds the SHA-256 of every listed file, `scan` reads
    the data (token ids < vocab_size and equal at most to the recorded max_token_id, masks 0/1).

    Raises DatasetError (naming the file) at the first problem; with `collect`, a shard's problem is listed
    in `problems` and the next shard is checked (a dataset.json that cannot be read still raises). `lazy_data`
    (a remote store's local cache): data files not fetched yet are not checked; every meta.json must be there.
    """
    root = Path(folder)
    dpath, info, manifest_sha256 = read_manifest(root, version)
    tt = info.get("training_type")
    dataset = Dataset(root, info, tt or "seq", [], manifest_sha256=manifest_sha256)
    vocab = info.get("vocab_size")

    def problem(e: DatasetError) -> None:
        if not collect:
            raise e
        dataset.problems.append(str(e))

    top_id = -1
    for entry in info["shards"]:
        try:
            shard = _dataset_shard(root, entry, info, tt, dpath, checksums, lazy_data)
            if scan:
                top = _check_shard_data(shard, vocab, dpath)
                if shard.max_token_id is not None and top != shard.max_token_id:
                    raise DatasetError(
                        f"{shard.folder}: largest token id in the data is {top}, {dpath} records "
                        f"{shard.max_token_id} (corrupted or from another build)"
                    )
                top_id = max(top_id, top)
        except DatasetError as e:
            problem(e)
            continue
        dataset.shards.append(shard)
    if tt is None and dataset.shards:
        dataset.training_type = infer_training_type(dataset.shards[0].keys)
    dataset.tokens = sum(
        s.keys[k].length for s in dataset.shards for k in TOKEN_KEYS[dataset.training_type] if k in s.keys
    )
    dataset.max_token_id = top_id if scan else None
    if dataset.problems:
        return dataset  # totals cannot agree with a shard list that has holes
    totals = info.get("totals") or {}
    if "records" in totals and totals["records"] != sum(s.records for s in dataset.shards):
        problem(
            DatasetError(
                f"{dpath}: totals.records {totals['records']} != sum over shards "
                f"{sum(s.records for s in dataset.shards)}"
            )
        )
    if "tokens" in totals and totals["tokens"] != dataset.tokens:
        problem(DatasetError(f"{dpath}: totals.tokens {totals['tokens']} != {dataset.tokens} in the shards"))
    return dataset


def read_record_ids(shard_folder: Path) -> list[str]:
    """record_ids.json of a shard: the record id of each record, in order (lineage; the loader ignores it)."""
    return cast(list[str], load_json(Path(shard_folder) / RECORD_IDS_FILE, "record ids", digest=False)[0])


def dumps_compact(obj) -> bytes:
    """How meta.json and record_ids.json are serialized (compact separators: they hold long offset lists)."""
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")
