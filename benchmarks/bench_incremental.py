#!/usr/bin/env python3
"""Incremental update vs full rebuild, in one run: one new Tang file (~1,000 poems) added to a ~355k-poem corpus.

usage: python benchmarks/bench_incremental.py [--poems 355000] [--workers N]
Steps, each `tokenmill update` in its own process (a throwaway Dagster instance): the first build, the update
after one file was added (only that batch is processed), then `--rebuild` (everything again, as a full build of the
grown corpus). Prints wall seconds and peak memory of each and the update/rebuild ratio (target <= 10%).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from poetry_corpus import TANG, build, write_copy
from proctree import TreeSampler, status_mib

REPO = Path(__file__).resolve().parent.parent


def update(env: dict, *args: str) -> tuple[float, float, str]:
    """(seconds, peak MiB of the process tree, last lines of its output) of one `tokenmill update`."""
    start = time.perf_counter()
    with TreeSampler(lambda pids: sum(status_mib(p, "VmRSS") for p in pids), 0.1) as mem:
        done = subprocess.run(
            [sys.executable, "-m", "cli", "update", *args], env=env, cwd=REPO, capture_output=True, text=True
        )
    if done.returncode:
        sys.exit(f"tokenmill update {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start, mem.peak, done.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--poems", type=int, default=355_000)
    ap.add_argument("--workers", type=int, default=0, help="TOKENMILL_WORKERS (0: the usable cores)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tokenmill-incremental-"))
    source = work / "source"
    poems = build(source, args.poems)
    env = {**os.environ, "TOKENMILL_SOURCE": str(source), "TOKENMILL_DATA": str(work / "data")}
    env.pop("DAGSTER_HOME", None)
    if args.workers:
        env["TOKENMILL_WORKERS"] = str(args.workers)
    print(f"corpus: {poems:,} poems in {source}")
    results = {"first build": update(env)}
    added = write_copy(TANG[0], source / "added.poet.tang.json", seed=10_000)
    results[f"update (+{added:,} poems)"] = update(env)
    results["full rebuild"] = update(env, "--rebuild")
    for name, (secs, mib, _) in results.items():
        print(f"{name:24s} {secs:7.1f} s   peak {mib:6.0f} MiB")
    update_s, rebuild_s = results[f"update (+{added:,} poems)"][0], results["full rebuild"][0]
    print(f"update / full rebuild: {100 * update_s / rebuild_s:.1f}%  (target <= 10%)")
    print(results["full rebuild"][2].splitlines()[-1])
    print(f"outputs: {work}")


if __name__ == "__main__":
    main()
