#!/usr/bin/env python3
"""Whole graph vs the seed reference, side by side in one run: wall time and peak memory (process tree).

usage: python benchmarks/bench_graph.py [SOURCE_DIR ...] [--skip-reference]
Default source: ../shared/corpora/chinese-poetry. The reference is ../shared/reference/seed_reference.py
(single process); tokenmill runs `tokenmill update` (the source as its first batch through the whole job) with a
throwaway instance.
Memory is the peak of the summed RSS of the process and all its children, sampled every 0.1 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def tree_rss(pid: int) -> int:
    """Summed RSS bytes of `pid` and its descendants, read from /proc (Linux)."""
    parent, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, frontier = 0, [pid]
    while frontier:
        p = frontier.pop()
        total += rss.get(p, 0)
        frontier.extend(c for c, pp in parent.items() if pp == p)
    return total


def run_measured(cmd: list[str], env: dict, log: Path) -> tuple[float, float, int]:
    """(seconds, peak MiB of the process tree, returncode)."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        peak = 0
        stop = threading.Event()

        def sample():
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, tree_rss(proc.pid))
                time.sleep(0.1)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        rc = proc.wait()
        stop.set()
        t.join()
    return time.perf_counter() - start, peak / 2**20, rc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="*", default=[str(SHARED / "corpora" / "chinese-poetry")])
    ap.add_argument("--skip-reference", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tokenmill-bench-"))
    results = {}
    if not args.skip_reference:
        ref_dirs = [str(p) for s in args.sources for p in sorted(Path(s).iterdir()) if p.is_dir()] or args.sources
        cmd = [sys.executable, str(SHARED / "reference" / "seed_reference.py"), *ref_dirs, "--out", str(work / "ref")]
        results["seed reference"] = run_measured(cmd, dict(os.environ), work / "ref.log")
        print((work / "ref.log").read_text()[-2500:])
    source = args.sources[0]
    env = {**os.environ, "TOKENMILL_SOURCE": source, "TOKENMILL_DATA": str(work / "data")}
    env.pop("DAGSTER_HOME", None)
    cmd = [sys.executable, "-m", "tokenmill.cli", "update"]
    results["tokenmill"] = run_measured(cmd, env, work / "tokenmill.log")
    print(f"source: {source}\nlogs and outputs: {work}")
    for name, (secs, mib, rc) in results.items():
        print(f"{name:15s} {secs:8.1f} s  peak {mib:8.0f} MiB  rc={rc}")
    if "seed reference" in results:
        ref, tm = results["seed reference"], results["tokenmill"]
        print(f"speed-up {ref[0] / tm[0]:.2f}x   memory ratio {tm[1] / ref[1]:.2f}")
    check = subprocess.run(
        [sys.executable, str(SHARED / "tools" / "check_contracts.py"), str(work / "data")],
        capture_output=True,
        text=True,
    )
    print(check.stdout.strip().splitlines()[-1] if check.stdout else check.stderr)


if __name__ == "__main__":
    main()
