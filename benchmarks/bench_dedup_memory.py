"""Dedup memory benchmark: peak RSS of the largest process as the corpus grows, on natural and low-entropy text.

usage: python benchmarks/bench_dedup_memory.py [--sizes 300000,1500000] [--kinds zipf,syllables] [--workers 2]
                                               [--base /tmp/base_dedup --base-sizes 300000] [--data /tmp/dedup_mem]

Generates corpora of ~200-character documents (5% planted near duplicates: a copy of an earlier document with
one or two words replaced) of two kinds, cached under --data:
- zipf: words of 2-9 letters over a 26-letter alphabet, drawn Zipf-distributed from a 50,000-word vocabulary;
- syllables: words of 1-4 syllables out of 16, so the text is low-entropy, the MinHash minima of unrelated
  documents collide and LSH buckets grow huge (logs, code, tables and templated pages look like that).
Runs build_dedup_report + write_deduped on each in a fresh process and prints docs/s, the peak RSS (VmHWM) of
the run (parent) process and of the largest worker (sampled from /proc every 0.1 s; ru_maxrss would not do:
Linux carries it over fork and exec, so a child's figure starts at its parent's) and the 1.5M/300k ratio of the
largest process per kind (target <= 1.3). With --base, the same runs with the code of
another checkout (e.g. `git worktree add /tmp/base_dedup <commit>`) for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from proctree import TreeSampler, status_mib

REPO = Path(__file__).resolve().parent.parent
SYLLABLES = ["ka", "to", "ri", "ne", "su", "mo", "la", "pi", "do", "ve", "shi", "gu", "ba", "ze", "fo", "hu"]
NEAR_FRACTION = 0.05


def _zipf_vocab(rng: np.random.Generator, size: int = 50_000) -> list[str]:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    lengths = rng.integers(2, 10, size)
    return [letters[rng.integers(0, 26, n)].tobytes().decode() for n in lengths]


def _syllable_vocab(rng: np.random.Generator, size: int = 2_000) -> list[str]:
    return ["".join(SYLLABLES[s] for s in rng.integers(0, len(SYLLABLES), rng.integers(1, 5))) for _ in range(size)]


def generate(kind: str, n_docs: int, folder: Path, seed: int = 0, shard_docs: int = 250_000) -> None:
    """Writes record shards of n_docs documents of `kind` to folder (5% near copies of earlier documents)."""
    rng = np.random.default_rng(seed)
    vocab = _zipf_vocab(rng) if kind == "zipf" else _syllable_vocab(rng)
    if kind == "zipf":
        weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    else:
        weights = np.ones(len(vocab))
    cdf = np.cumsum(weights / weights.sum())
    draw = lambda shape: np.minimum(np.searchsorted(cdf, rng.random(shape)), len(vocab) - 1)  # noqa: E731
    words_per_doc = 200 // (sum(len(w) for w in vocab[:1000]) // 1000 + 1)
    folder.mkdir(parents=True, exist_ok=True)
    docs = draw((n_docs, words_per_doc))
    near = np.flatnonzero(rng.random(n_docs) < NEAR_FRACTION)
    near = near[near > 10]
    # a near copy: an earlier document with one or two words replaced
    docs[near] = docs[(rng.random(len(near)) * near).astype(np.int64)]
    for k in range(2):
        hit = near[rng.random(len(near)) < (1.0 if k == 0 else 0.5)]
        docs[hit, rng.integers(0, words_per_doc, len(hit))] = draw(len(hit))
    for s in range(0, n_docs, shard_docs):
        with open(folder / f"part-{s // shard_docs:05d}.jsonl", "w", encoding="utf-8") as f:
            for i in range(s, min(n_docs, s + shard_docs)):
                text = " ".join([vocab[w] for w in docs[i].tolist()])
                f.write(
                    json.dumps(
                        {
                            "id": f"{kind}-{i:09d}",
                            "text": text,
                            "meta": {},
                            "source": {"path": f"{kind}.jsonl", "line": i + 1},
                        }
                    )
                    + "\n"
                )


def corpus(data: Path, kind: str, n_docs: int) -> Path:
    folder = data / f"{kind}-{n_docs}"
    if not (folder / ".done").exists():
        shutil.rmtree(folder, ignore_errors=True)
        generate(kind, n_docs, folder)
        (folder / ".done").touch()
    return folder


def worker_peaks() -> TreeSampler:
    """The largest VmHWM among this process's descendants (the stage's workers), sampled every 0.1 s."""
    return TreeSampler(lambda pids: max((status_mib(p, "VmHWM") for p in pids), default=0.0), 0.1)


def child(in_dir: str, out_dir: str, workers: int) -> dict:
    """One run of the stage in this (fresh) process: timings and peak RSS of this process and its workers."""
    from tokenmill.common.io import record_shards

    try:
        from tokenmill.stages.dedup import DedupSettings, build_dedup_report, write_deduped
    except ImportError:  # an older checkout
        from tokenmill.dedup import DedupSettings, build_dedup_report, write_deduped
    out = Path(out_dir)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    with worker_peaks() as peaks:
        result = build_dedup_report(Path(in_dir), out / "report", DedupSettings(), workers=workers)
        write_deduped(Path(in_dir), out / "report", out / "deduped", workers=workers)
    seconds = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    # a DedupResult; an older checkout (--base) returns its stats dict, with the same names
    stats = result if isinstance(result, dict) else dataclasses.asdict(result)
    return {
        "docs": stats["docs_in"],
        "removed": stats["docs_in"] - stats["docs_out"],
        "seconds": seconds,
        "candidates": stats["candidate_pairs"],
        "oversized_buckets": stats["oversized_buckets"],
        "parent_mib": status_mib("self", "VmHWM"),
        "worker_mib": peaks.peak,
        "shards": len(record_shards(Path(in_dir))),
    }


def run(code: Path, in_dir: Path, out_dir: Path, workers: int, timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    try:
        p = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--_child",
                str(in_dir),
                "--_out",
                str(out_dir),
                "--workers",
                str(workers),
            ],
            cwd=code,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def show(label: str, r: dict) -> str:
    if "error" in r:
        return f"{label}: {r['error']}"
    largest = max(r["parent_mib"], r["worker_mib"])
    return (
        f"{label}: {r['docs']:,} docs in {r['seconds']:.1f} s = {r['docs'] / r['seconds']:,.0f} docs/s; "
        f"removed {r['removed']:,}; {r['candidates']:,} candidate pairs, {r['oversized_buckets']:,} oversized "
        f"buckets; peak RSS parent {r['parent_mib']:.0f} MiB, largest worker {r['worker_mib']:.0f} MiB, "
        f"largest process {largest:.0f} MiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="300000,1500000", help="corpus sizes, comma-separated")
    ap.add_argument("--kinds", default="zipf,syllables")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data", default="/tmp/dedup_mem", help="generated corpora and run outputs")
    ap.add_argument("--base", help="another checkout to compare with (its tokenmill on PYTHONPATH)")
    ap.add_argument("--base-sizes", default="300000", help="sizes to run with --base")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    ap.add_argument("--_child")
    ap.add_argument("--_out")
    args = ap.parse_args()
    if args._child:
        print(json.dumps(child(args._child, args._out, args.workers)))
        return
    data = Path(args.data)
    sizes = [int(s) for s in args.sizes.split(",")]
    base_sizes = [int(s) for s in args.base_sizes.split(",")] if args.base else []
    print(f"workers {args.workers}; corpora under {data}", flush=True)
    for kind in args.kinds.split(","):
        largest = {}
        for n in sizes:
            in_dir = corpus(data, kind, n)
            r = run(REPO, in_dir, data / "run", args.workers, args.timeout)
            print(show(f"{kind} {n:,} (this checkout)", r), flush=True)
            if "error" not in r:
                largest[n] = max(r["parent_mib"], r["worker_mib"])
            if n in base_sizes:
                print(
                    show(
                        f"{kind} {n:,} (base {args.base})",
                        run(Path(args.base), in_dir, data / "run", args.workers, args.timeout),
                    ),
                    flush=True,
                )
        if len(largest) >= 2:
            lo, hi = min(largest), max(largest)
            print(
                f"{kind}: peak RSS of the largest process, {hi:,} / {lo:,} docs: "
                f"{largest[hi] / largest[lo]:.2f} (target <= 1.3)",
                flush=True,
            )


if __name__ == "__main__":
    main()
