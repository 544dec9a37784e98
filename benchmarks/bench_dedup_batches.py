"""Per-batch dedup benchmark: a corpus added in batches (dedup_batch + write_deduped per batch, each in a fresh
process), wall time and peak RSS of the run process and of the largest worker per batch, as the index grows.

usage: python benchmarks/bench_dedup_batches.py [--batches 3] [--batch-docs 100000] [--kind zipf] [--workers 2]
                                                [--data /tmp/dedup_batches] [--one-shot]

The corpus is bench_dedup_memory's (~200-character documents, 5% near copies of earlier documents, so later batches
hold copies of earlier ones), one shard per batch. --one-shot also runs one build over every batch with
keep=first_seen and checks that it keeps the same records.

The figures of a run (per batch and step, peak RSS, index size) are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench_dedup_memory import generate, worker_peaks
from proctree import status_mib

REPO = Path(__file__).resolve().parent.parent


def child(cleaned: str, index_dirs: list[str] | None, out: str, workers: int) -> dict:
    """One batch in this (fresh) process after the index segments `index_dirs`; None: one build instead."""
    from tokenmill.common.io import record_shards
    from tokenmill.stages.dedup import DedupSettings, build_dedup_report, dedup_batch, write_deduped

    out_dir, settings = Path(out), DedupSettings(keep="first_seen")
    shutil.rmtree(out_dir / "report", ignore_errors=True)
    t0 = time.perf_counter()
    with worker_peaks() as peaks:
        if index_dirs is None:
            result = build_dedup_report(Path(cleaned), out_dir / "report", settings, workers=workers)
        else:
            result = dedup_batch(
                Path(cleaned), [Path(p) for p in index_dirs], out_dir / "report", out_dir / "index", settings, workers
            )
        write_deduped(Path(cleaned), out_dir / "report", out_dir / "deduped", workers=workers)
    return {
        "seconds": time.perf_counter() - t0,
        "docs_in": result.docs_in,
        "docs_out": result.docs_out,
        "incremental": result.incremental or {},  # the batch's split and the index's figures; {} for one build
        "kept": sum(1 for f in record_shards(out_dir / "deduped") for _ in open(f, "rb")),
        "parent_mib": status_mib("self", "VmHWM"),
        "worker_mib": peaks.peak,
    }


def run(cleaned: Path, index_dirs: list[Path] | None, out: Path, workers: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", str(cleaned), "--_out", str(out)]
    cmd += ["--workers", str(workers), "--_index", json.dumps(index_dirs and [str(p) for p in index_dirs])]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{out.name}: {p.stderr.strip()}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--batch-docs", type=int, default=100_000)
    ap.add_argument("--kind", default="zipf", choices=["zipf", "syllables"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data", default="/tmp/dedup_batches")
    ap.add_argument("--one-shot", action="store_true")
    ap.add_argument("--_child")
    ap.add_argument("--_out")
    ap.add_argument("--_index", default="[]")
    args = ap.parse_args()
    if args._child:
        print(json.dumps(child(args._child, json.loads(args._index), args._out, args.workers)))
        return
    data = Path(args.data)
    corpus = data / f"{args.kind}-{args.batches}x{args.batch_docs}"
    if not (corpus / ".done").exists():
        shutil.rmtree(corpus, ignore_errors=True)
        generate(args.kind, args.batches * args.batch_docs, corpus, shard_docs=args.batch_docs)
        (corpus / ".done").touch()
    shutil.rmtree(data / "run", ignore_errors=True)
    segments, kept = [], 0
    print(f"{args.batches} batches of {args.batch_docs:,} {args.kind} documents, workers {args.workers}", flush=True)
    for b, shard in enumerate(sorted(corpus.glob("part-*.jsonl"))):
        key = f"g1-b{b + 1:04d}"
        cleaned = data / "run" / "cleaned" / key
        cleaned.mkdir(parents=True)
        (cleaned / "part-00000.jsonl").symlink_to(shard)
        r = run(cleaned, segments, data / "run" / key, args.workers)
        s = r["incremental"]
        segments.append(data / "run" / key / "index")
        kept += r["kept"]
        print(
            f"{key}: {r['docs_in']:,} in, {r['docs_out']:,} kept, exact {s['dropped_exact_cross_batch']:,} cross + "
            f"{s['dropped_exact_within_batch']:,} within, near {s['dropped_near_cross_batch']:,} cross + "
            f"{s['dropped_near_within_batch']:,} within; index before {s['index_records']:,} records "
            f"({s['index_kept']:,} kept), segment {s['index_bytes_added'] / 2**20:.0f} MiB; {r['seconds']:.1f} s; "
            f"peak RSS parent {r['parent_mib']:.0f} MiB, largest worker {r['worker_mib']:.0f} MiB",
            flush=True,
        )
    if args.one_shot:
        r = run(corpus, None, data / "run" / "one-shot", args.workers)
        same = "same" if r["kept"] == kept else f"DIFFERENT ({kept:,} batch by batch)"
        print(
            f"one build (first_seen): {r['docs_in']:,} in, {r['kept']:,} kept ({same}); "
            f"{r['seconds']:.1f} s; peak RSS parent {r['parent_mib']:.0f} MiB, largest worker "
            f"{r['worker_mib']:.0f} MiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
