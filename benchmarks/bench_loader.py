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

SEQ_LEN, BATCH = 2048, 32


# ---------------------------------------------------------------------------- data
def make_dataset(root: Path, tokens: int, shards: int = 4, seed: int = 0, vocab: int = 50000) -> Path:
    """A seq dataset of about `tokens` uint16 tokens (lognormal doc lengths) + train.bin (nanoGPT)."""
    ds = root / f"ds-{tokens}"
    if (ds / "dataset.json").exists():
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
            lens = lens[:k + 1]
            lens[-1] -= int(cum[k] - per) if cum[k] > per else 0
            lens = lens[lens > 0]
            offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            toks = rng.integers(3, vocab, size=int(offs[-1]), dtype=np.uint16)
            toks[offs[:-1]] = 0  # <s> at every document start
            folder = ds / f"shard-{s:05d}"
            folder.mkdir(exist_ok=True)
            toks.tofile(folder / "sequence.bin")
            toks.tofile(nano)
            meta = {"sequence": {"shape": [int(offs[-1])], "dtype": "uint16", "offsets": offs.tolist()}}
            (folder / "meta.json").write_text(json.dumps(meta))
            files = {}
            for f in ("sequence.bin", "meta.json"):
                h = hashlib.sha256((folder / f).read_bytes()).hexdigest()
                files[f] = {"bytes": (folder / f).stat().st_size, "sha256": h}
            entries.append({"name": folder.name, "tokens": int(offs[-1]), "records": len(lens), "files": files})
    info = {"format": "tokenmill-shards", "format_version": 1, "training_type": "seq", "split": "train",
            "vocab_size": vocab, "token_dtype": "uint16",
            "keys": {"sequence": {"dtype": "uint16", "kind": "tokens"}}, "shards": entries,
            "totals": {"tokens": sum(e["tokens"] for e in entries), "records": sum(e["records"] for e in entries)}}
    (ds / "dataset.json").write_text(json.dumps(info))
    return ds


def make_sft(root: Path, n: int = 20000, seed: int = 1) -> Path:
    """An sft dataset with lognormal record lengths (for packing efficiency)."""
    ds = root / f"sft-{n}"
    if (ds / "dataset.json").exists():
        return ds
    folder = ds / "shard-00000"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(5.3, 0.9, size=n).astype(np.int64), 8, 8192)
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    toks = rng.integers(3, 4096, size=int(offs[-1]), dtype=np.uint16)
    mask = np.ones(int(offs[-1]), dtype=np.uint8)
    toks.tofile(folder / "sequence.bin")
    mask.tofile(folder / "loss_mask.bin")
    meta = {k: {"shape": [int(offs[-1])], "dtype": dt, "offsets": offs.tolist()}
            for k, dt in (("sequence", "uint16"), ("loss_mask", "uint8"))}
    (folder / "meta.json").write_text(json.dumps(meta))
    files = {f: {"bytes": (folder / f).stat().st_size} for f in ("sequence.bin", "loss_mask.bin", "meta.json")}
    info = {"format": "tokenmill-shards", "format_version": 1, "training_type": "sft", "split": "train",
            "vocab_size": 4096, "token_dtype": "uint16",
            "keys": {"sequence": {"dtype": "uint16", "kind": "tokens"}, "loss_mask": {"dtype": "uint8", "kind": "mask"}},
            "shards": [{"name": "shard-00000", "tokens": int(offs[-1]), "records": n, "files": files}],
            "totals": {"tokens": int(offs[-1]), "records": n}}
    (ds / "dataset.json").write_text(json.dumps(info))
    return ds


# ---------------------------------------------------------------------------- helpers
def nanogpt_batches(path: Path, n: int, seed: int = 0):
    """nanoGPT's get_batch: a new np.memmap per batch, random offsets, int64 x and y."""
    torch.manual_seed(seed)
    for _ in range(n):
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - SEQ_LEN, (BATCH,))
        x = torch.stack([torch.from_numpy((data[i:i + SEQ_LEN]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + SEQ_LEN]).astype(np.int64)) for i in ix])
        yield x, y


def consume(batches, n: int) -> float:
    """Seconds to pull n batches (touching one element, as a training loop hands them to the device)."""
    it = iter(batches)
    first = next(it)  # start-up (worker spawn) excluded
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
    results = {}
    # warm the page cache
    nano = ds / "train.bin"
    with open(nano, "rb") as f:
        while f.read(1 << 24):
            pass
    for rnd in range(2):  # two rounds side by side, best of each
        results.setdefault("nanoGPT get_batch (int64 x, y)", []).append(consume(nanogpt_batches(nano, n + 1), n))
        dl = DataLoader(dset, batch_size=BATCH, shuffle=True, seed=rnd, num_workers=0)
        results.setdefault("tokenmill_loader, in process (recommended)", []).append(consume(dl, n))
        for w in (2,):
            dl = DataLoader(dset, batch_size=BATCH, shuffle=True, seed=rnd, num_workers=w, persistent_workers=False,
                            prefetch_factor=4)
            results.setdefault(f"tokenmill_loader, {w} workers", []).append(consume(dl, n))
            del dl
            gc.collect()
    base = min(results["nanoGPT get_batch (int64 x, y)"])
    for k, v in results.items():
        best = min(v)
        print(f"  {k:48s} {fmt_rate(best)}  {base / best:5.2f}x nanoGPT")
    print("  (loader batches carry input_ids, labels and position_ids, int32 on the host; nanoGPT: x, y int64)")
    return results


def bench_startup(ds: Path):
    print("\n== start-up, state_dict, resume (10 million windows) ==")
    total = json.loads((ds / "dataset.json").read_text())["totals"]["tokens"]
    stride = max(1, (total - SEQ_LEN) // 10_000_000)
    t = time.perf_counter()
    dset = TokenDataset(ds, SEQ_LEN, stride=stride)
    dl = DataLoader(dset, batch_size=BATCH, shuffle=True, seed=0)
    it = iter(dl)
    next(it)
    startup = time.perf_counter() - t
    print(f"  windows: {len(dset):,} (stride {stride}); open + first batch: {startup * 1e3:.0f} ms (target < 1000 ms)")
    t = time.perf_counter()
    reps = 1000
    for _ in range(reps):
        sd = dl.state_dict()
    print(f"  state_dict(): {(time.perf_counter() - t) / reps * 1e6:.1f} us (target < 1 ms); {sd}")
    it.close()
    nb = len(dl)
    for label, k in (("start of epoch", 1), ("near the end", nb - 2)):
        state = {**dl.state_dict(), "epoch": 3, "position": k * BATCH}
        t = time.perf_counter()
        dl2 = DataLoader(dset, batch_size=BATCH, shuffle=True, seed=0)
        dl2.load_state_dict(state)
        it2 = iter(dl2)
        next(it2)
        print(f"  resume at {label:15s} (batch {k:>7,} of {nb:,}): {(time.perf_counter() - t) * 1e3:.0f} ms "
              f"to the first batch")
        it2.close()


def bench_memory(ds: Path, n: int):
    print(f"\n== worker anonymous memory over {n:,} batches (2 workers) ==")
    dset = TokenDataset(ds, SEQ_LEN, stride=SEQ_LEN // 2)
    dl = DataLoader(dset, batch_size=BATCH, shuffle=True, seed=0, num_workers=2, persistent_workers=True)
    it = iter(dl)
    pids = None
    marks = {}
    for k in range(1, n + 1):
        next(it)
        if pids is None:
            pids = [w.pid for w in it.__dict__.get("_workers", [])] if hasattr(it, "_workers") else None
            if pids is None:
                inner = getattr(dl, "_iterator", None)
                pids = [w.pid for w in getattr(inner, "_workers", [])]
        if k in (100, 1000, n // 2, n):
            marks[k] = [rss_anon(p) for p in pids]
    for k, v in marks.items():
        print(f"  after {k:>6,} batches: RssAnon per worker = " + ", ".join(f"{x / 2**20:.1f} MiB" for x in v)
              + f"; main {rss_anon(os.getpid()) / 2**20:.0f} MiB")
    growth = max(b - a for a, b in zip(marks[100], marks[n]))
    print(f"  growth from batch 100 to {n:,}: {growth / 2**20:.2f} MiB per worker (flat = no leak)")
    it.close()


def bench_packing(root: Path):
    print("\n== packing efficiency (real tokens / max_tokens), lognormal sft lengths ==")
    ds = make_sft(root)
    rd = RecordDataset(ds)
    lens = rd.lengths()
    print(f"  {len(lens):,} records, length mean {lens.mean():.0f}, median {np.median(lens):.0f}, max {lens.max()}")
    for output in ("flat", "padded"):
        for pool in (16, 256):
            for strategy in ("prefer_closest", "prefer_first"):
                pk = PackingLoader(rd, max_tokens=8192, pool_size=pool, strategy=strategy, output=output,
                                   long_threshold=8192, shuffle=True, seed=0)
                t = time.perf_counter()
                real, cap, nb = 0, 0, 0
                for b in pk:
                    real += int((b["labels"] != -100).sum()) if output == "padded" else b["input_ids"].shape[1]
                    if output == "padded":
                        real = real  # labels mask is all-trained here; count attention instead
                    cap += 8192
                    nb += 1
                dt = time.perf_counter() - t
                if output == "padded":
                    real = int(lens.sum())
                print(f"  {output:6s} pool {pool:>3}  {strategy:14s}: {nb:5d} batches, efficiency "
                      f"{real / cap:6.1%}, {len(lens) / dt:,.0f} samples/s")


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
    print(f"dataset: {ds} ({args.tokens:,} tokens, uint16, 4 shards; ready in {time.perf_counter() - t:.1f} s); "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
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
