"""After training: a step's samples traced to records and source lines (`tokenmill trace`), and the steps that
showed a record or a source file's records (`tokenmill where`).

The loader side (tokenmill_loader.trace) says which windows a DataLoader with given settings yields at a step, and
the steps that yield given windows, from the loader's own sampler. This side names the records of those windows:
an index per dataset version (both splits) maps every record id to its split and record number and to its source
file and line, and every record dedup removed to the record it was folded into. It is built once per version from
each shard's record_ids.json and the version's deduped_jsonl batches, kept as .npy files (memory-mapped by every
query) in `<data root>/_trace_index/v<K>-<manifest sha>/`, written to a temporary folder and renamed. Its size and
build time at scale: benchmarks/bench_trace.py (docs/training.md, 'After training: trace and where').
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import (
    REJECTED_FILE,
    REMOVED_FILE,
    batch_folders,
    record_id,
    record_shards,
    temporary_path,
)
from tokenmill.explain import ID_RE, explain, resolve_ids
from tokenmill.explain import where as source_text
from tokenmill_loader import DataLoader, TokenDataset, open_store
from tokenmill_loader.format import SPLITS, list_versions, manifest_path, read_record_ids, sha256_file
from tokenmill_loader.trace import Sample, find_windows, trace_step, windows_of_records

INDEX_DIR = "_trace_index"
NO_SPLIT = 255  # `split` of a record the version does not hold (or, removed by dedup, whose kept record it does not)
LOCATORS = ("line", "index")  # `kind` 1 and 2: how `at` locates the record in its source file (0: no source)
SHOWN = 10  # records and sightings `tokenmill where` prints (--json: all)
MAX_FOLDS = 8  # removed -> kept chains are one step (dedup keeps one record per cluster); a few more tolerated


@dataclass(kw_only=True)
class LoaderSettings:
    """The DataLoader a training run read: the TokenDataset's windows and the sampler's settings."""

    seq_len: int = 2049
    """Tokens per window (README's L + 1)."""
    stride: int | None = None
    """Tokens between window starts (None: seq_len - 1, README's L)."""
    batch_size: int = 32
    seed: int = 0
    shuffle: bool = True
    world_size: int = 1
    num_workers: int = 0
    drop_last: bool = False
    full_shuffle_max: int = 1 << 22
    state: dict | None = None
    """The loader state the run resumed from (`loader.state_dict()`); steps then count from it."""
    resumed_at: int = 0
    """The run's step number of the first batch after `state`."""


@dataclass(kw_only=True)
class RecordIndex:
    """Every record of a dataset version (both splits) and every record dedup folded into one, sorted by id."""

    folder: Path
    ids: np.ndarray  # uint64: the 16 hex digits of the record id
    split: np.ndarray  # uint8: index into SPLITS of the record holding the tokens (NO_SPLIT: none)
    record: np.ndarray  # int64: that record's number in its split
    folded: np.ndarray  # bool: removed by dedup, its tokens are those of `record`
    file: np.ndarray  # int32: index into files (-1: no source)
    at: np.ndarray  # int64: line or index in the file
    kind: np.ndarray  # uint8: 0 no source, else 1 + LOCATORS index
    files: list[str]
    by_record: dict[str, np.ndarray]  # split -> entry of each of its records, in record order

    def source(self, entry: int) -> dict | None:
        kind = int(self.kind[entry])
        if not kind:
            return None
        return {"path": self.files[int(self.file[entry])], LOCATORS[kind - 1]: int(self.at[entry])}

    def entries_of(self, record_id: str) -> np.ndarray:
        if not ID_RE.fullmatch(record_id):
            return np.arange(0)
        key = hex_ids([record_id])
        at = int(np.searchsorted(self.ids, key[0]))
        return np.arange(at, at + 1) if at < len(self.ids) and self.ids[at] == key[0] else np.arange(0)

    def folded_into(self, split: str, records) -> dict[int, list[int]]:
        """record -> the entries of the records dedup folded into it."""
        found = np.flatnonzero(self.folded & (self.split == SPLITS.index(split)) & np.isin(self.record, records))
        out: dict[int, list[int]] = {}
        for entry in found.tolist():
            out.setdefault(int(self.record[entry]), []).append(entry)
        return out


def hex_ids(ids: list[str]) -> np.ndarray:
    """16-hex-digit record ids as uint64, vectorized (tens of millions of ids in a version)."""
    return _hex(np.frombuffer("".join(ids).encode("ascii"), dtype=np.uint8).reshape(-1, 16))


_NIBBLE = np.zeros(256, dtype=np.uint8)
_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)


def _hex(digits: np.ndarray) -> np.ndarray:
    """Rows of 16 lower-case hex digits (uint8 ASCII) as uint64: two digits per byte, read big-endian."""
    nibbles = _NIBBLE[digits]
    packed = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
    return packed.view(">u8").ravel().astype(np.uint64)


def id_text(value) -> str:
    return f"{int(value):016x}"


def record_index(data_root: Path, version: int | None = None) -> RecordIndex:
    """The index of `version` (default: the latest), built on first use."""
    bins = Path(data_root) / "tokenized_bins"
    manifest = manifest_path(bins / SPLITS[0], version)
    name = f"v{version_of(manifest):06d}-{sha256_file(manifest)[:12]}"
    folder = Path(data_root) / INDEX_DIR / name
    if not (folder / "files.json").is_file():
        write_index(folder, build_index(Path(data_root), version_of(manifest)))
        remove_stale_indexes(Path(data_root), keep=name)
    arrays = {p.stem: np.load(p, mmap_mode="r") for p in folder.glob("*.npy")}
    return RecordIndex(
        folder=folder,
        files=json.loads((folder / "files.json").read_text(encoding="utf-8")),
        by_record={split: arrays.pop(f"by_record_{split}") for split in SPLITS},
        **arrays,
    )


def version_of(manifest: Path) -> int:
    return int(json.loads(manifest.read_text(encoding="utf-8")).get("version") or 0)


def build_index(data_root: Path, version: int | None) -> dict:
    """The index's arrays: the records of each split (record_ids.json), their sources (deduped_jsonl) and the
    records dedup removed (removed.jsonl of each batch of the version)."""
    bins = data_root / "tokenized_bins"
    kept_ids, kept_split, kept_record = [], [], []
    batches: list[str] = []
    for s, name in enumerate(SPLITS):
        store = open_store(bins / name, version=version or None)
        # a shard at a time: a Python string per record of the whole split would be most of the build's memory
        ids = np.concatenate([hex_ids(read_record_ids(part.folder)) for part in store.parts] or [hex_ids([])])
        kept_ids.append(ids)
        kept_split.append(np.full(len(ids), s, dtype=np.uint8))
        kept_record.append(np.arange(len(ids), dtype=np.int64))
        batches = store.info.get("batches") or [p.name for p in batch_folders(data_root / "deduped_jsonl")]
    files: dict[str, int] = {}
    sources = _sources(data_root, batches, files)
    removed, duplicate_of = sources.pop("removed"), sources.pop("duplicate_of")
    # deduped records the version does not hold (tokenized_bins could not render them, or they were forgotten):
    # entries without a split, so that `where` names them and explain says why
    absent = np.setdiff1d(sources["ids"], np.concatenate([*kept_ids, removed]))
    ids = np.concatenate([*kept_ids, absent, removed])
    split = np.concatenate([*kept_split, np.full(len(absent) + len(removed), NO_SPLIT, dtype=np.uint8)])
    record = np.concatenate([*kept_record, np.full(len(absent) + len(removed), -1, dtype=np.int64)])
    folded = np.arange(len(ids)) >= len(ids) - len(removed)
    order = np.argsort(ids, kind="stable")
    ids, split, record, folded = ids[order], split[order], record[order], folded[order]
    target = np.zeros(len(ids), dtype=np.uint64)  # duplicate_of of each removed entry, in sorted order
    target[np.argsort(order)[len(ids) - len(removed) :]] = duplicate_of
    # a removed record's tokens are its kept record's: follow duplicate_of to an entry kept
    pending = np.flatnonzero(folded)
    for _ in range(MAX_FOLDS):
        at = np.minimum(np.searchsorted(ids, target[pending]), max(0, len(ids) - 1))
        hit = ids[at] == target[pending]
        done = hit & ~folded[at]
        split[pending[done]], record[pending[done]] = split[at[done]], record[at[done]]
        again = hit & folded[at]  # folded into a record itself folded (an exact copy of a removed one)
        target[pending[again]] = target[at[again]]
        pending = pending[again]
    out = {
        "ids": ids,
        "split": split,
        "record": record,
        "folded": folded,
        **_joined(ids, sources),
        "files": list(files),
    }
    for s, name in enumerate(SPLITS):
        mine = np.flatnonzero((split == s) & ~folded)
        by_record = np.empty(len(mine), dtype=np.int64)
        by_record[record[mine]] = mine
        out[f"by_record_{name}"] = by_record
    return out


def _joined(ids: np.ndarray, sources: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """file, at and kind of each of `ids` from the sources table (sorted by id); -1, -1, 0 where it has none."""
    out: dict[str, np.ndarray] = {
        "file": np.full(len(ids), -1, np.int32),
        "at": np.full(len(ids), -1, np.int64),
        "kind": np.zeros(len(ids), np.uint8),
    }
    if len(sources["ids"]):
        at = np.minimum(np.searchsorted(sources["ids"], ids), len(sources["ids"]) - 1)
        known = sources["ids"][at] == ids
        for key in out:
            out[key][known] = sources[key][at[known]]
    return out


def _sources(data_root: Path, batches: list[str], files: dict[str, int]) -> dict[str, np.ndarray]:
    """Source of every record of deduped_jsonl (kept and removed) in `batches`, sorted by id, and the removed
    records with the record each was folded into."""
    escaped: dict[bytes, int] = {}  # a path as its lines spell it -> its number (one per source file)
    parts: list[tuple[np.ndarray, ...]] = []
    removed: list[dict] = []
    for batch in batches:
        folder = data_root / "deduped_jsonl" / batch
        for path in record_shards(folder):
            with open(path, "rb") as f:
                while lines := f.readlines(READ_BYTES):
                    parts.append(_as_arrays(*_record_sources(lines), escaped))
        if (folder / REMOVED_FILE).is_file():
            with open(folder / REMOVED_FILE, "rb") as f:
                removed += [json.loads(line) for line in f]  # a few per cent of the records: parsed whole
    ids = [e["id"] for e in removed]
    parts.append(_as_arrays(hex_ids(ids), [_source_fields(e) for e in removed], escaped))
    keys, number, at, kind = (np.concatenate(column) for column in zip(*parts))
    as_file = np.array([files.setdefault(json.loads(b'"' + raw + b'"'), len(files)) if raw else -1 for raw in escaped])
    order = np.argsort(keys, kind="stable")
    return {
        "ids": keys[order],
        "file": as_file.astype(np.int32)[number[order]] if len(escaped) else np.full(len(keys), -1, np.int32),
        "at": at[order],
        "kind": kind[order],
        "removed": hex_ids(ids),
        "duplicate_of": hex_ids([e["duplicate_of"] for e in removed]),
    }


def _as_arrays(ids: np.ndarray, fields: list[tuple[bytes, bytes, bytes]], escaped: dict[bytes, int]):
    """(ids, path number, at, kind) of some records as arrays: no Python object per record outlives its chunk."""
    number = np.array([escaped.setdefault(f[0], len(escaped)) for f in fields], dtype=np.int64)
    at = np.array([f[2] for f in fields], dtype=bytes).astype(np.int64)
    return ids, number, at, np.array([LOCATOR_KIND.get(f[1], 0) for f in fields], dtype=np.uint8)


# a record line as the record stages write it: the id first ({"id": "<16 hex>"), the source last (path, line or
# index, a WARC offset); only the top-level source ends the line
_ID_PREFIX = np.frombuffer(b'{"id": "', dtype=np.uint8)
_SOURCE_END = re.compile(
    rb'"source": \{"path": "([^"\\\n]*(?:\\.[^"\\\n]*)*)", "(line|index)": (\d+)(?:, "offset": \d+)?\}\}$',
    re.MULTILINE,
)
LOCATOR_KIND = {name.encode("ascii"): 1 + i for i, name in enumerate(LOCATORS)}
READ_BYTES = 1 << 26  # lines read and matched at once: bounded memory for any part file


def _record_sources(lines: list[bytes]) -> tuple[np.ndarray, list[tuple[bytes, bytes, bytes]]]:
    """The ids of record lines (read at each line's start, vectorized) and (path as the line spells it, locator,
    number) of each (one regex over all the lines, which never parses the texts: 2-3x faster than json per line);
    lines in another layout are parsed whole."""
    data = b"".join(lines)
    found = _SOURCE_END.findall(data)
    starts = np.cumsum([0] + [len(line) for line in lines[:-1]], dtype=np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)
    heads = raw[np.minimum(starts[:, None] + np.arange(25), len(raw) - 1)]
    if len(found) == len(lines) and (heads[:, :8] == _ID_PREFIX).all() and (heads[:, 24] == ord('"')).all():
        return _hex(heads[:, 8:24]), found
    records = [json.loads(line) for line in lines]
    return hex_ids([r["id"] for r in records]), [_source_fields(r) for r in records]


def _source_fields(record: dict) -> tuple[bytes, bytes, bytes]:
    """What _SOURCE_END takes from a record line, from the parsed record (empty locator: no source)."""
    source = record.get("source") or {}
    loc = next((k for k in LOCATORS if k in source), None)
    if "path" not in source or loc is None:
        return b"", b"", b"-1"
    raw = json.dumps(source["path"], ensure_ascii=False).encode("utf-8")[1:-1]
    return raw, loc.encode("ascii"), str(source[loc]).encode("ascii")


def write_index(folder: Path, arrays: dict) -> None:
    """The arrays as .npy files and the file list as files.json, in a temporary folder renamed to `folder`."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staged = temporary_path(folder)
    staged.mkdir()
    try:
        for key, value in arrays.items():
            if key == "files":
                (staged / "files.json").write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
            else:
                np.save(staged / f"{key}.npy", value)
        os.rename(staged, folder)
    except OSError:
        if not (folder / "files.json").is_file():  # another process renamed its copy first: that one is as good
            raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def remove_stale_indexes(data_root: Path, keep: str) -> None:
    """Indexes of versions retention removed (their manifest is gone): nothing can trace them any more."""
    published = set(list_versions(data_root / "tokenized_bins" / SPLITS[0]))
    for folder in (data_root / INDEX_DIR).glob("v*-*"):
        if folder.name != keep and int(folder.name[1:7]) not in published:
            shutil.rmtree(folder, ignore_errors=True)


def open_loader(data_root: Path, settings: LoaderSettings, split: str = "train", version: int | None = None):
    """The DataLoader the run read (rank 0: tracing covers every rank), at its resumed state if any."""
    state = settings.state or {}
    ds = TokenDataset(
        Path(data_root) / "tokenized_bins" / split,
        seq_len=settings.seq_len,
        stride=settings.stride or max(1, settings.seq_len - 1),
        version=version if version is not None else state.get("version"),
        fields=("input_ids",),
    )
    loader = DataLoader(
        ds,
        batch_size=settings.batch_size,
        shuffle=settings.shuffle,
        seed=settings.seed,
        world_size=settings.world_size,
        drop_last=settings.drop_last,
        num_workers=settings.num_workers,
        full_shuffle_max=settings.full_shuffle_max,
        pin_memory=False,
    )
    if settings.state is not None:
        loader.load_state_dict(settings.state)
    return loader


def trace(
    data_root: Path,
    step: int,
    settings: LoaderSettings,
    rank: int | None = None,
    split: str = "train",
    version: int | None = None,
) -> dict:
    """The samples of the run's step `step` (every rank's, or rank `rank`'s): each window's pieces with their
    record id, source and the records dedup folded into them."""
    if step < settings.resumed_at:
        raise ValueError(
            f"step {step} is before the resume at step {settings.resumed_at}: trace it with the run's earlier state"
        )
    loader = open_loader(data_root, settings, split, version)
    samples = trace_step(loader, step - settings.resumed_at, rank)
    index = record_index(data_root, loader.dataset.store.version)
    records = sorted({p.record for s in samples for p in s.pieces})
    folds = index.folded_into(split, records)
    return {
        "split": split,
        "dataset_version": loader.dataset.store.version,
        "step": step,
        "epoch": samples[0].epoch if samples else None,
        "samples": [_sample_view(s, index, split, folds, settings.resumed_at) for s in samples],
    }


def where(
    data_root: Path,
    settings: LoaderSettings,
    key: str | None = None,
    source: str | None = None,
    epochs: int = 1,
    split: str = "train",
    version: int | None = None,
) -> dict:
    """Where the records of `key` (a record id or PATH:N) or of source file `source` are seen in the next `epochs`
    epochs of the run: every (epoch, step, rank, row) of a window holding their tokens. A record in another split,
    dropped before tokenized_bins or not in the version says so (its fate from `tokenmill explain`)."""
    if (key is None) == (source is None):
        raise ValueError("give a record id (or PATH:N) or --source PATH, one of them")
    loader = open_loader(data_root, settings, split, version)
    index = record_index(data_root, loader.dataset.store.version)
    if source is not None:
        number = index.files.index(source) if source in index.files else -1
        entries = np.flatnonzero(np.asarray(index.file) == number) if number >= 0 else np.arange(0)
        entries = entries[np.argsort(index.at[entries], kind="stable")]  # in file order
        missing: list[dict] = dropped_from(Path(data_root), source)
    elif key is not None:
        entries = np.concatenate([index.entries_of(rid) for rid in resolve_ids(key)])
        missing = [] if len(entries) else [_fate(Path(data_root), key)]
    absent = (np.asarray(index.split)[entries] == NO_SPLIT) & ~np.asarray(index.folded)[entries]
    missing += [_fate(Path(data_root), id_text(index.ids[entry])) for entry in entries[absent].tolist()]
    records = [_record_view(index, entry) for entry in entries[~absent].tolist()]
    wanted = {r["record"] for r in records if r["split"] == split}
    seen = []
    for s in find_windows(loader, windows_of_records(loader.dataset, sorted(wanted)), epochs):
        view = _sample_view(s, index, split, {}, settings.resumed_at)
        view["pieces"] = [p for p in view["pieces"] if p["record"] in wanted]
        seen.append(view)
    return {
        "split": split,
        "dataset_version": loader.dataset.store.version,
        "epochs": epochs,
        "records": records,
        "not_in_dataset": missing,
        "seen": seen,
    }


def _record_view(index: RecordIndex, entry: int) -> dict:
    split = int(index.split[entry])
    return {
        "id": id_text(index.ids[entry]),
        "source": index.source(entry),
        "split": SPLITS[split] if split != NO_SPLIT else None,
        "record": int(index.record[entry]),
        "folded_into": id_text(index.ids[index.by_record[SPLITS[split]][int(index.record[entry])]])
        if bool(index.folded[entry]) and split != NO_SPLIT
        else None,
    }


def _sample_view(s: Sample, index: RecordIndex, split: str, folds: dict[int, list[int]], resumed_at: int) -> dict:
    view = asdict(s)
    view["step"] = s.step + resumed_at
    by_record = index.by_record[split]
    for piece in view["pieces"]:
        entry = int(by_record[piece["record"]])
        piece["id"] = id_text(index.ids[entry])
        piece["source"] = index.source(entry)
        piece["folded"] = [
            {"id": id_text(index.ids[e]), "source": index.source(e)} for e in folds.get(piece["record"], [])
        ]
    return view


def _fate(data_root: Path, key: str) -> dict:
    fate = explain(data_root, key) or {"id": key, "fate": "unknown"}
    return {
        k: fate.get(k) for k in ("id", "fate", "stage", "batch", "reason", "detail", "source", "split") if k in fate
    }


def dropped_from(data_root: Path, source: str) -> list[dict]:
    """The records of source file `source` that raw_records or cleaned_jsonl dropped, with the reason."""
    needle = json.dumps(source, ensure_ascii=False).encode("utf-8")
    out = []
    for stage in ("raw_records", "cleaned_jsonl"):
        for folder in batch_folders(data_root / stage):
            path = folder / REJECTED_FILE
            if not path.is_file():
                continue
            with open(path, "rb") as f:
                for line in f:
                    if needle not in line:
                        continue
                    entry = json.loads(line)
                    where_from = entry.get("source") or {k: entry[k] for k in ("path", "line", "index") if k in entry}
                    if where_from.get("path") == source:
                        locator = {k: where_from[k] for k in LOCATORS if k in where_from}
                        out.append(
                            {
                                "id": entry.get("id") or record_id(source, **locator),
                                "fate": "dropped",
                                "stage": stage,
                                "batch": folder.name,
                                "reason": entry.get("reason"),
                                "source": where_from,
                            }
                        )
    return out


def render_trace(found: dict) -> str:
    """`tokenmill trace`'s text: a line per sample, then a line per record piece of its window."""
    lines = [
        f"step {found['step']} (epoch {found['epoch']}): {len(found['samples'])} samples of {found['split']} "
        f"version {found['dataset_version']}"
    ]
    for s in found["samples"]:
        lines.append(
            f"  rank {s['rank']} row {s['row']}{_worker(s)}: window {s['window']}, tokens {s['begin']}..{s['end']}"
        )
        lines += [_piece_line(p) for p in s["pieces"]]
    return "\n".join(lines)


def _piece_line(p: dict) -> str:
    folded = "".join(f"\n        folded: {f['id']} {source_text(f['source'])}" for f in p.get("folded", []))
    return (
        f"    at {p['at']:>5}: {p['id']} tokens {p['begin']}..{p['end']} of the record  {source_text(p['source'])}"
        + folded
    )


def _why(fate: dict) -> str:
    """A record's fate in a few words: `dropped by cleaned_jsonl: repetition`, `last kept by deduped_jsonl`."""
    if not fate.get("stage"):
        return str(fate.get("fate"))
    why = f"last kept by {fate['stage']}" if fate.get("fate") == "kept" else f"{fate.get('fate')} by {fate['stage']}"
    return why + (f": {fate['reason']}" if fate.get("reason") and fate.get("reason") != fate.get("fate") else "")


def _worker(sample: dict) -> str:
    return "" if sample["worker"] is None else f" (worker {sample['worker']})"


def render_where(found: dict, shown: int = SHOWN) -> str:
    """`tokenmill where`'s text: the records asked about, then a line per window piece of theirs a sample showed
    (the first `shown` of each; --json lists every one)."""
    records, missing, seen = found["records"], found["not_in_dataset"], found["seen"]
    counts = {
        f"in {s}" + ("" if s == found["split"] else " (in no batch)"): sum(
            r["split"] == s and not r["folded_into"] for r in records
        )
        for s in SPLITS
    }
    counts["folded into another by dedup"] = sum(bool(r["folded_into"]) for r in records)
    counts["not in the dataset"] = len(missing)
    total = len(records) + len(missing)
    lines = [
        f"{total} record{'' if total == 1 else 's'}: " + ", ".join(f"{n} {what}" for what, n in counts.items() if n)
    ]
    for r in records[:shown]:
        place = f"{r['split']} record {r['record']}" if r["split"] else "its kept record is not in this version"
        if r["folded_into"]:
            place = f"folded by dedup into {r['folded_into']} ({place})"
        lines.append(f"  record {r['id']}  {source_text(r['source'])}  {place}")
    for m in missing[: max(0, shown - len(records))]:
        lines.append(f"  record {m.get('id')}  {source_text(m.get('source'))}  not in the dataset: {_why(m)}")
    if len(records) + len(missing) > shown:
        lines.append(f"  … {len(records) + len(missing) - shown} more")
    pieces = [(s, p) for s in seen for p in s["pieces"]]
    lines.append(
        f"seen in {len(seen)} samples over {found['epochs']} epoch(s) of {found['split']} version "
        f"{found['dataset_version']}" + (":" if seen else "")
    )
    for s, p in pieces[:shown]:
        lines.append(
            f"  epoch {s['epoch']} step {s['step']} rank {s['rank']} row {s['row']}{_worker(s)}: window "
            f"{s['window']} at {p['at']}, {p['id']} tokens {p['begin']}..{p['end']}"
        )
    if len(pieces) > shown:
        lines.append(f"  … {len(pieces) - shown} more (--json lists every one)")
    return "\n".join(lines)
