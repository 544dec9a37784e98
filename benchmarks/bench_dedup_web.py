#!/usr/bin/env python3
"""Dedup alone on a data root's cleaned records, scored against the exact ground truth: recall, precision, pairs
left and the CPU seconds of build_dedup_report, for one or more code trees and settings side by side (runs taken in
turns, so a machine's load falls on every side alike).

usage: python benchmarks/bench_dedup_web.py DATA [--side LABEL=TREE[:JSON]] ... [--repeat 2] [--workers 2]
                                                 [--truth FILE]

DATA is a data root that `tokenmill update` filled (its cleaned_jsonl/<batch>/ is the input; the web corpus of
docs/profile.md: `web_corpus.py WEB --pages 50000 --pages-per-file 2500 --formats warc`, then
`TOKENMILL_SOURCE=WEB TOKENMILL_DATA=DATA tokenmill update`). A side is a label, a tree holding a `tokenmill`
package (`.` for this checkout; `git archive HEAD tokenmill | tar -x -C /tmp/base` gives the commit before a change)
and optionally dedup_report settings as JSON; the default compares this checkout with itself. Each run is a fresh
process (`--_child`): its CPU seconds are user + sys of that process and its workers, less what it spent before
the stage started (imports). The truth is bench_peers.truth_components (same key, or exact Jaccard >= the threshold
at the pair's shingle code, joined transitively), computed once and kept in --truth (default DATA/truth.npz);
recall, precision and pairs left are bench_peers.score and pairs_left.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_graph import BATCH, REPO  # noqa: E402
from bench_peers import Truth, cleaned_records, pairs_left, score, truth_components  # noqa: E402


def cpu_now(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def child(in_dir: Path, out_dir: Path, settings_json: str, workers: int) -> None:
    """One build_dedup_report in this process (the tree's tokenmill comes first on sys.path); prints its figures."""
    from tokenmill.stages.dedup import DECISION_DIR, DedupSettings, build_dedup_report

    settings = DedupSettings(**json.loads(settings_json))
    started = cpu_now(resource.RUSAGE_SELF) + cpu_now(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    result = build_dedup_report(in_dir, out_dir, settings, workers=workers)
    wall = time.perf_counter() - t0
    removed = [
        x.decode() if isinstance(x, bytes) else str(x)
        for f in sorted((out_dir / DECISION_DIR).glob("*.npz"))
        for x in np.load(f)["id"].tolist()
    ]
    print(
        json.dumps(
            {
                "pre_cpu_s": started,
                "wall_s": wall,
                "candidates": result.candidate_pairs,
                "removed_ids": removed,
                "timings": result.timings,
            }
        )
    )


def run_side(tree: Path, settings_json: str, in_dir: Path, workers: int) -> dict:
    """A fresh process for one run: its figures, with its CPU seconds (the process and its workers)."""
    with tempfile.TemporaryDirectory(prefix="dedup-web-") as tmp:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree.resolve()), str(REPO)])}
        cmd = [sys.executable, __file__, "--_child", str(in_dir), tmp + "/out", settings_json, str(workers)]
        before = cpu_now(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        total = cpu_now(resource.RUSAGE_CHILDREN) - before
    if proc.returncode:
        raise SystemExit(f"dedup run failed ({tree}, {settings_json}):\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["cpu_s"] = total - out.pop("pre_cpu_s")
    return out


def load_truth(data: Path, path: Path, ids: list[str]) -> Truth:
    """The ground truth of the cleaned records, computed once and kept in `path`."""
    if path.exists():
        z = np.load(path)
        return Truth(z["roots"], z["exact_of"], z["near"], {"removable": int(z["removable"])}, ())
    from tokenmill.stages.dedup import DedupSettings

    _, texts, languages = cleaned_records(data)
    t0 = time.perf_counter()
    truth = truth_components(texts, languages, DedupSettings())
    print(f"ground truth: {time.perf_counter() - t0:.1f} s, {truth.counts}", flush=True)
    np.savez(path, roots=truth.roots, exact_of=truth.exact_of, near=truth.near, removable=truth.counts["removable"])
    return truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path, nargs="?")
    ap.add_argument("--side", action="append", default=[], help="LABEL=TREE[:JSON settings] (repeatable)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side, taken in turns")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--truth", type=Path, help="the ground truth's cache (default DATA/truth.npz)")
    ap.add_argument("--_child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        in_dir, out_dir, settings_json, workers = args._child
        child(Path(in_dir), Path(out_dir), settings_json, int(workers))
        return
    in_dir = args.data / "cleaned_jsonl" / BATCH
    ids, _, _ = cleaned_records(args.data)
    truth = load_truth(args.data, args.truth or args.data / "truth.npz", ids)
    position = {x: i for i, x in enumerate(ids)}
    sides = []
    for spec in args.side or ["a=.", "b=."]:
        label, _, rest = spec.partition("=")
        tree, _, settings_json = rest.partition(":")
        sides.append((label, Path(tree), settings_json or "{}"))
    print(f"{len(ids):,} cleaned records, {truth.counts['removable']:,} removable duplicates in the truth")
    print("| side | run | dedup wall s | dedup CPU s | candidates | removed | recall | precision | pairs left |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for run in range(args.repeat):
        for label, tree, settings_json in sides:
            r = run_side(tree, settings_json, in_dir, args.workers)
            removed = np.zeros(len(ids), dtype=bool)
            removed[[position[x] for x in r["removed_ids"]]] = True
            q = score(removed, truth.roots)
            print(
                f"| {label} | {run + 1} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['candidates']:,} | "
                f"{q['removed']:,} | {100 * q['recall']:.2f}% | {100 * q['precision']:.2f}% | "
                f"{pairs_left(removed, truth):,} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
