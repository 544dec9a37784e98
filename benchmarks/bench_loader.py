"""Benchmarks of tokenmill_loader (CPU). Prints the figures the issue asks for.

    python benchmarks/bench_loader.py [--tokens 200_000_000] [--dir /tmp/tm_bench] [--only throughput,startup,...]

Sections:
  throughput  tokens/s delivered to the training loop, seq_len 2048, batch 32, random windows:
              nanoGPT-style get_batch vs the loader (in-process = recommended, and 2 workers)
  startup     open + first batch for a dataset with 10 million windows (target < 1 s)
  state       state_dict() time (target < 1 ms), resume time at epoch start vs near the end
  memory      anonymous RSS (RssAnon) of the worker processes over 10,000 batches (must stay flat)
  packing     packing efficiency (real tokens / capacity) on lognormal lengths, pool 16 and 256
The dataset (uint16, lognormal document lengths, 4 shards, docs/format.md layout) is generated once
into --dir and reused; a nanoGPT-style train.bin holds the same tokens.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tokenmill_loader import DataLoader, PackingLoader, RecordDataset, TokenDataset
from tokenmill_loader.format import (
    DATASET_FILE,
    SHARD_META_FILE,
    data_file,
    dataset_manifest,
    dumps_compact,
    key_meta,
    shard_folder_name,
)

SEQ_LEN, BATCH = 2048, 32


# ---------------------------------------------------------------------------- data
def _write_shard(folder: Path, arrays: dict[str, np.ndarray], offsets: np.ndarray) -> dict:
    """One shard folder (format module names and builders); returns its dataset.json files entry."""
    folder.mkdir(parents=True, exist_ok=True)
    for key, arr in arrays.items():
        arr.tofile(folder / data_file(key))
    (folder / SHARD_META_FILE).write_bytes(dumps_compact({k: key_meta(a.dtype, offsets) for k, a in arrays.items()}))
    return {
        f: {"bytes": (folder / f).stat().st_size, "sha256": hashlib.sha256((folder / f).read_bytes()).hexdigest()}
        for f in [data_file(k) for k in arrays] + [SHARD_META_FILE]
    }


def _write_manifest(ds: Path, training_type: str, vocab: int, entries: list[dict]) -> None:
    info = dataset_manifest(
        training_type=training_type,
        split="train",
        vocab_size=vocab,
        token_dtype="uint16",
        special_tokens={"<s>": 0, "</s>": 1, "<pad>": 2},
        shards=entries,
        totals={"tokens": sum(e["tokens"] for e in entries), "records": sum(e["records"] for e in entries)},
    )
    (ds / DATASET_FILE).write_bytes(dumps_compact(info))


def make_dataset(root: Path, tokens: int, shards: int = 4, seed: int = 0, vocab: int = 50000) -> Path:
    """A seq dataset of about `tokens` uint16 tokens (lognormal doc lengths) + train.bin (nanoGPT)."""
    ds = root / f"ds-{tokens}"
    if (ds / DATASET_FILE).exists():
        return ds
    ds.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = tokens // shards
    entries = []
    with open(ds / "train.bin", "wb") as nano:
        for s in range(shards):
            lens = np.maximum(2, rng.lognormal(5.5, 1.0, size=per // 200 + 10).astype(np.int64))
            cum = np.cumsum(lens)
            k = int(np.searchsorted(cum, per))
            lens = lens[: k + 1]
            lens[-1] -= int(cum[k] - per) if cum[k] > per else 0
            lens = lens[lens > 0]
            offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            toks = rng.integers(3, vocab, size=int(offs[-1]), dtype=np.uint16)
            toks[offs[:-1]] = 0  # <s> at every document start
            toks.tofile(nano)
            files = _write_shard(ds / shard_folder_name(s), {"sequence": toks}, offs)
            entries.append(
                {"name": shard_folder_name(s), "tokens": int(offs[-1]), "records": len(lens), "files": files}
            )
    _write_manifest(ds, "seq", vocab, entries)
    return ds


def make_sft(root: Path, n: int = 20000, seed: int = 1) -> Path:
    """An sft dataset with lognormal record lengths (for packing efficiency)."""
    ds = root / f"sft-{n}"
    if (ds / DATASET_FILE).exists():
        return ds
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(5.3, 0.9, size=n).astype(np.int64), 8, 8192)
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    toks = rng.integers(3, 4096, size=int(offs[-1]), dtype=np.uint16)
    mask = np.ones(int(offs[-1]), dtype=np.uint8)
    files = _write_shard(ds / shard_folder_name(0), {"sequence": toks, "loss_mask": mask}, offs)
    _write_manifest(
        ds, "sft", 4096, [{"name": shard_folder_name(0), "tokens": int(offs[-1]), "records": n, "files": files}]
    )
    return ds


# ---------------------------------------------------------------------------- helpers
def nanogpt_batches(path: Path, n: int, seed: int = 0):
    """nanoGPT's get_batch: a new np.memmap per batch, random offsets, int64 x and y."""
    torch.manual_seed(seed)
    for _ in range(n):
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - SEQ_LEN, (BATCH,))
        x = torch.stack([torch.from_numpy((data[i : i + SEQ_LEN]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + SEQ_LEN]).astype(np.int64)) for i in ix])
        yield x, y


def consume(batches, n: int) -> float:
    """Seconds to pull n batches (touching one element, as a training loop hands them to the device)."""
    it = iter(batches)
    next(it)  # start-up (worker spawn) excluded
    t = time.perf_counter()
    k = 0
    for b in it:
        x = b[0] if isinstance(b, tuple) else b["input_ids"]
        x[0, 0].item()
        k += 1
        if k >= n:
            break
    return (time.perf_counter() - t) / k


def rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def fmt_rate(sec_per_batch: float) -> str:
    return f"{SEQ_LEN * BATCH / sec_per_batch / 1e6:8.1f} M tokens/s ({sec_per_batch * 1e3:6.2f} ms/batch)"


# ---------------------------------------------------------------------------- sections
def bench_throughput(ds: Path, n: int):
    print(f"\n== throughput: seq_len {SEQ_LEN}, batch {BATCH}, random windows, {n} batches each ==")
    dset = TokenDataset(ds, SEQ_LEN)
    wide = TokenDataset(ds, SEQ_LEN)
    wide.out_dtype = np.dtype(np.int64)  # the alternative measured: int64 host tensors
    results = {}
    # warm the page cache
    nano = ds / "train.bin"
    for f in [nano] + sorted(ds.glob("shard-*/sequence.bin")):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    for rnd in range(3):  # three rounds side by side, best of each
        results.setdefault("nanoGPT get_batch (int64 x, y)", []).append(consume(nanogpt_batches(nano, n + 1), n))
        for label, d in (("", dset), (", int64 host tensors", wide)):
            dl = DataLoader(d, batch_size=BATCH, shuffle=True, seed=rnd, num_workers=0, compact_labels=True)
            rec = " (recommended)" if not label else ""
            results.setdefault(f"loader, in process{label}{rec}", []).append(consume(dl, n))
            dl = DataLoader(
                d, batch_size=BATCH, shuffle=True, seed=rnd, num_workers=2, prefetch_factor=4, compact_labels=True
            )
            results.setdefault(f"loader, 2 workers{label}", []).append(consume(dl, n))
            del dl
            gc.collect()
    base = min(results["nanoGPT get_batch (int64 x, y)"])
    for k, v in results.items():
        best = min(v)
        print(f"  {k:44s} {fmt_rate(best)}  {base / best:5.2f}x nanoGPT")
    print(
        "  (loader batches: input_ids, labels, position_ids, int32 on the host as on the GPU path (compact_labels);"
        " nanoGPT: x, y int64)"
    )
    return results


def bench_startup(ds: Path):
    print("\n== start-up, state_dict, resume (10 million windows) ==")
    total = json.loads((ds / DATASET_FILE).read_text())["totals"]["tokens"]
    stride = max(1, (total - SEQ_LEN) // 10_000_000)
    t0 = time.perf_counter()
    dset = TokenDataset(ds, SEQ_LEN, stride=stride)
    t1 = time.perf_counter()
    dl = DataLoader(dset, batch_size=BATCH, shuffle=True, seed=0)
    it = iter(dl)
    next(it)
    t2 = time.perf_counter()
    print(f"  windows: {len(dset):,} (stride {stride}, {total:,} tokens, 4 shards)")
    print(
        f"  start-up (open + validate + first batch): {(t2 - t0) * 1e3:.0f} ms (target < 1000 ms): "
        f"open {(t1 - t0) * 1e3:.0f} ms, epoch permutation + first batch {(t2 - t1) * 1e3:.0f} ms"
    )
    t = time.perf_counter()
    DataLoader(dset, batch_size=BATCH, shuffle=True, seed=0, full_shuffle_max=1 << 40).resumable_sampler.rank_indices()
    print(
        f"  (for comparison, a materialized numpy permutation of the same epoch: "
        f"{(time.perf_counter() - t) * 1e3:.0f} ms; used up to 2^22 items)"
    )
    t = time.perf_counter()
    reps = 10000
    for _ in range(reps):
        sd = dl.state_dict()
    print(f"  state_dict(): {(time.perf_counter() - t) / reps * 1e6:.1f} us (target < 1 ms): {sd}")
    it.close()
    nb = len(dl)
    for label, k in (("the start of an epoch", 1), ("the end of an epoch", nb - 2)) * 2:
        state = {**dl.state_dict(), "epoch": 3, "position": k * BATCH}
        best = 1e9
        for _ in range(3):
            t = time.perf_counter()
            dl2 = DataLoader(dset, batch_size=BATCH, shuffle=True, seed=0)
            dl2.load_state_dict(state)
            it2 = iter(dl2)
            next(it2)
            best = min(best, time.perf_counter() - t)
            it2.close()
        print(f"  resume near {label:22s} (batch {k:>7,} of {nb:,}): {best * 1e3:4.0f} ms to the first batch")


def bench_memory(ds: Path, n: int):
    print(f"\n== worker anonymous memory over {n:,} batches (2 persistent workers) ==")
    dset = TokenDataset(ds, SEQ_LEN, stride=SEQ_LEN // 2)
    dl = DataLoader(dset, batch_size=BATCH, shuffle=True, seed=0, num_workers=2, persistent_workers=True)
    marks = {}
    k = 0
    t = time.perf_counter()
    while k < n:  # crosses epoch ends: a new iter() starts the next epoch with the same workers
        for _ in dl:
            k += 1
            if k in (100, 1000, n // 2, n):
                pids = [w.pid for w in dl._iterator._workers]
                marks[k] = [rss_anon(p) for p in pids]
            if k >= n:
                break
    dt = time.perf_counter() - t
    for kk, v in marks.items():
        print(
            f"  after {kk:>6,} batches: RssAnon per worker = "
            + ", ".join(f"{x / 2**20:.1f} MiB" for x in v)
            + f"; main process {rss_anon(os.getpid()) / 2**20:.0f} MiB"
        )
    growth = max(b - a for a, b in zip(marks[100], marks[n]))
    print(
        f"  growth from batch 100 to {n:,}: {growth / 2**20:+.2f} MiB per worker (flat = no leak); "
        f"{len(dl)} batches/epoch, {dt:.0f} s"
    )


def bench_packing(root: Path):
    print("\n== packing efficiency (real tokens / max_tokens), lognormal sft lengths ==")
    ds = make_sft(root)
    rd = RecordDataset(ds)
    lens = rd.lengths()
    print(f"  {len(lens):,} records, length mean {lens.mean():.0f}, median {np.median(lens):.0f}, max {lens.max()}")
    total = int(lens.sum())
    for max_tokens in (2048, 8192):
        for output in ("flat", "padded"):
            for pool in (16, 256):
                for strategy in ("prefer_closest", "prefer_first"):
                    pk = PackingLoader(
                        rd,
                        max_tokens=max_tokens,
                        pool_size=pool,
                        strategy=strategy,
                        output=output,
                        long_threshold=max_tokens,
                        shuffle=True,
                        seed=0,
                    )
                    t = time.perf_counter()
                    nb, cap = 0, 0
                    for b in pk:
                        nb += 1
                        cost = b["input_ids"].numel()  # flat: T; padded: B x Lmax
                        cap += max(max_tokens, cost)  # an oversize singleton fills its own capacity
                    dt = time.perf_counter() - t
                    # nothing is dropped, so real tokens = all tokens
                    print(
                        f"  max_tokens {max_tokens:5d} {output:6s} pool {pool:>3}  {strategy:14s}: {nb:5d} batches, "
                        f"efficiency {total / cap:6.1%}, {len(lens) / dt:,.0f} samples/s"
                    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200_000_000)
    ap.add_argument("--dir", default="/tmp/tm_bench")
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--memory-batches", type=int, default=10_000)
    ap.add_argument("--only", default="throughput,startup,memory,packing")
    args = ap.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    ds = make_dataset(root, args.tokens)
    print(
        f"dataset: {ds} ({args.tokens:,} tokens, uint16, 4 shards; ready in {time.perf_counter() - t:.1f} s); "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs"
    )
    only = set(args.only.split(","))
    if "throughput" in only:
        bench_throughput(ds, args.batches)
    if "startup" in only:
        bench_startup(ds)
    if "memory" in only:
        bench_memory(ds, args.memory_batches)
    if "packing" in only:
        bench_packing(root)


if __name__ == "__main__":
    sys.exit(main())
