"""`tokenmill trace` / `tokenmill where` at scale: the record index's size and build time, and the time of a query.

    python benchmarks/bench_trace.py [--tokens 1_000_000_000] [--text-bytes 64] [--dir /tmp/tm_bench_trace]

A data root is synthesised cheaply: tokenized_bins train (99%) and val (1%) in 32M-token shards (the stage's
default shard_tokens) of uint16 tokens whose sequence.bin is a sparse file (trace and where read offsets and record
ids, never tokens), lognormal record lengths (mean about 500 tokens), record ids and their sources (1,000 source
files) in deduped_jsonl, 1% of them also as dedup removals folded into a kept record. `--text-bytes` sets each
record's text in deduped_jsonl: the index build reads every line of it, so its time has a per-record part and a
per-byte part; run it twice (many records with short texts, fewer with texts of real length: about 4 bytes per
token) to measure both. `--tokens 10_000_000_000` measures a 10B-token version directly (20M records; sparse token
files, so about 4 GB on disk with short texts, and some 10 minutes on 2 busy cores).
Figures: docs/training.md, 'After training: trace and where'.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tokenmill.trace import INDEX_DIR, LoaderSettings, record_index, trace, where
from tokenmill_loader.format import (
    DATASET_FILE,
    RECORD_IDS_FILE,
    SHARD_META_FILE,
    data_file,
    dataset_manifest,
    dumps_compact,
    key_meta,
    shard_entry,
    shard_folder_name,
)
from tokenmill_loader.sampler import ResumableSampler

SHARD_TOKENS = 32_000_000  # tokenized_bins' default shard_tokens
FILES = 1000  # source files the records come from
BATCH = "g1-b000001"
RUN = LoaderSettings(seq_len=2049, batch_size=32, world_size=8, seed=0)  # README's L = 2048, 8 ranks
WINDOWS_10B = 10_000_000_000 // 2048  # windows of an epoch of 10B tokens at L = 2048


def write_split(folder: Path, lengths: np.ndarray, ids: np.ndarray) -> None:
    """A split of records of `lengths` tokens (sparse sequence.bin) with record ids `ids`, in 32M-token shards."""
    folder.mkdir(parents=True)
    ends = np.cumsum(lengths)
    cuts = np.searchsorted(ends, np.arange(SHARD_TOKENS, int(ends[-1]), SHARD_TOKENS), side="right")
    entries = []
    for s, (lo, hi) in enumerate(zip([0, *cuts.tolist()], [*cuts.tolist(), len(lengths)])):
        shard = folder / shard_folder_name(s)
        shard.mkdir()
        offsets = np.concatenate([[0], np.cumsum(lengths[lo:hi])])
        with open(shard / data_file("sequence"), "wb") as f:
            f.truncate(int(offsets[-1]) * 2)  # sparse: zeros, no disk blocks
        (shard / SHARD_META_FILE).write_bytes(dumps_compact({"sequence": key_meta(np.uint16, offsets)}))
        (shard / RECORD_IDS_FILE).write_bytes(dumps_compact([f"{x:016x}" for x in ids[lo:hi].tolist()]))
        files = {name: _file_entry(shard / name) for name in (data_file("sequence"), SHARD_META_FILE)}
        entries.append(
            shard_entry(shard.name, tokens=int(offsets[-1]), records=hi - lo, max_token_id=0, files=files, batch=BATCH)
        )
    manifest = dataset_manifest(
        training_type="seq",
        split=folder.name,
        vocab_size=50_000,
        token_dtype="uint16",
        special_tokens={"<s>": 0, "</s>": 1, "<pad>": 2},
        shards=entries,
        totals={"tokens": int(ends[-1]), "records": len(lengths)},
    )
    (folder / DATASET_FILE).write_bytes(dumps_compact({**manifest, "batches": [BATCH]}))


def _file_entry(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}


def make_data_root(root: Path, tokens: int, text_bytes: int, seed: int = 0) -> tuple[Path, np.ndarray]:
    """The data root and its record ids (train first, then val), reused when already there."""
    data = root / f"data-{tokens}-{text_bytes}"
    if (data / "tokenized_bins" / "val" / DATASET_FILE).is_file():
        return data, np.load(data / "ids.npy")
    shutil.rmtree(data, ignore_errors=True)
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(5.8, 0.9, size=tokens // 400).astype(np.int64))
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    ids = np.unique(rng.integers(0, 2**63, size=len(lengths) + 1000, dtype=np.uint64))[: len(lengths)]
    rng.shuffle(ids)
    n_val = len(ids) // 100
    write_split(data / "tokenized_bins" / "train", lengths[n_val:], ids[n_val:])
    write_split(data / "tokenized_bins" / "val", lengths[:n_val], ids[:n_val])
    batch = data / "deduped_jsonl" / BATCH
    batch.mkdir(parents=True)
    text = "x" * text_bytes
    file_of = rng.integers(0, FILES, size=len(ids))
    with open(batch / "part-00000.jsonl", "w", encoding="utf-8") as f:
        for i, (rid, file) in enumerate(zip(ids.tolist(), file_of.tolist())):
            f.write(
                f'{{"id": "{rid:016x}", "text": "{text}", "meta": {{"language": "en"}}, '
                f'"source": {{"path": "corpus/file-{file:04d}.jsonl", "line": {i + 1}}}}}\n'
            )
    kept = rng.choice(ids[n_val:], size=len(ids) // 100)
    with open(batch / "removed.jsonl", "w", encoding="utf-8") as f:
        for i, kept_id in enumerate(kept.tolist()):
            f.write(
                f'{{"id": "{(int(kept_id) ^ (1 << 63)):016x}", "duplicate_of": "{kept_id:016x}", "level": "exact", '
                f'"reason": "exact_duplicate", "source": {{"path": "corpus/dups.jsonl", "line": {i + 1}}}, '
                f'"text": "{text[:200]}"}}\n'
            )
    (batch / "_stats.json").write_text("{}", encoding="utf-8")
    np.save(data / "ids.npy", ids)
    return data, ids


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def build_in_a_child(data: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS bytes) of building the index in a fresh process (its imports not
    counted). CPU seconds are what to compare on a busy machine: wall time there waits for the cores."""
    code = (
        "import json, resource, sys, time; from pathlib import Path; from tokenmill.trace import record_index; "
        "cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2]); t, c = time.perf_counter(), cpu(); "
        "record_index(Path(sys.argv[1])); "
        "print(json.dumps([time.perf_counter() - t, cpu() - c, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, check=True).stdout
    wall, cpu, peak_kib = json.loads(out.splitlines()[-1])
    return wall, cpu, peak_kib * 1024


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1_000_000_000)
    parser.add_argument("--text-bytes", type=int, default=64, help="bytes of each record's text in deduped_jsonl")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/tm_bench_trace"))
    args = parser.parse_args()
    (data, ids), made = timed(make_data_root, args.dir, args.tokens, args.text_bytes)
    records = len(ids)
    text = du(data / "deduped_jsonl")
    print(f"data root: {args.tokens:,} tokens, {records:,} records, deduped_jsonl {text / 1e9:.2f} GB ({made:.0f} s)")
    shutil.rmtree(data / INDEX_DIR, ignore_errors=True)
    build, cpu, peak = build_in_a_child(data)
    index = record_index(data)
    size = du(index.folder)
    print(
        f"index build: {build:.1f} s, {cpu:.1f} s of CPU ({cpu / records * 1e6:.2f} us per record), peak RSS "
        f"{peak / 1e9:.2f} GB"
    )
    print(f"index size: {size / 1e6:.0f} MB ({size / records:.1f} B per record incl. 1% folded duplicates)")
    _, opened = timed(record_index, data)
    rid = f"{int(ids[len(ids) // 2]):016x}"
    found, one = timed(where, data, RUN, key=rid)
    _, source = timed(where, data, RUN, source="corpus/file-0007.jsonl")
    n_source = len(where(data, RUN, source="corpus/file-0007.jsonl")["records"])
    _, step = timed(trace, data, 41_200, RUN)
    windows = -(-args.tokens // 2048)
    _, perm = timed(ResumableSampler(WINDOWS_10B).permutation, 0)
    print(
        f"queries (seq_len 2049, batch 32, 8 ranks, 1 epoch of {windows:,} windows): index open {opened * 1e3:.0f} ms, "
        f"where ID {one * 1e3:.0f} ms ({len(found['seen'])} samples), where --source {source * 1e3:.0f} ms "
        f"({n_source:,} records), trace --step 41200 {step * 1e3:.0f} ms"
    )
    print(f"an epoch's order at 10B tokens ({WINDOWS_10B:,} windows, Feistel): {perm:.2f} s (where: once per epoch)")
    scale = 10_000_000_000 / args.tokens
    print(
        f"at 10B tokens (x{scale:.0f}, records and bytes per token as here): index {size * scale / 1e9:.2f} GB, "
        f"built in ~{cpu * scale:.0f} s of CPU (deduped_jsonl {text * scale / 1e9:.0f} GB to read)"
    )


if __name__ == "__main__":
    main()
