#!/usr/bin/env python3
"""Whole graph vs the seed reference, side by side in one run: wall time, CPU seconds and peak memory (process
tree), the ratio to the reference, and each stage's seconds.

usage: python benchmarks/bench_graph.py [SOURCE_DIR ...] [--poems N] [--runs K] [--skip-reference]
Default source: ../shared/corpora/chinese-poetry; `--poems 355000` builds the ~355k-poem corpus
(benchmarks/poetry_corpus.py) in the work folder and uses it instead. The reference is
../shared/reference/seed_reference.py --bulk (single process); tokenmill runs `tokenmill update` (the source as
its first batch through the whole job) with a throwaway instance, `--runs` times, each on a fresh data root.
Memory is the peak of the summed RSS of the process and all its children, sampled every 0.1 s; CPU seconds are
user + sys of the process and every child it waited for (worker pools included).
Per stage: `stage s` is what the stage recorded in its `_timings.json`; `step s` is the time from the previous
asset's publication to this one's (the stage, its check, its metadata and Dagster's step overhead).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from poetry_corpus import build  # noqa: E402
from proctree import descendants, status_mib  # noqa: E402

from tokenmill.common.io import read_json  # noqa: E402

# the assets of tokenmill_all in graph order, with the file whose publication marks the end of each
STAGES = (
    ("raw_records", "raw_records/{batch}"),
    ("cleaned_jsonl", "cleaned_jsonl/{batch}"),
    ("dedup_report", "dedup_report/{batch}"),
    ("deduped_jsonl", "deduped_jsonl/{batch}"),
    ("tokenizer", "tokenizer"),
    ("tokenized_bins", "tokenized_bins/train/dataset.json"),
    ("funnel_telemetry", "funnel_telemetry"),
)


@dataclass
class Measured:
    seconds: float
    cpu_seconds: float
    peak_mib: float
    process_peak_mib: float  # the largest single process (the 2 GiB bound is per process)
    returncode: int
    started: float  # time.time() at launch


def tree_rss(pid: int) -> tuple[float, float]:
    """(summed, largest) RSS MiB of `pid` and its descendants (reads only their /proc entries: the sampler runs
    beside the measured process on the same cores)."""
    rss = [status_mib(p, "VmRSS") for p in [pid, *descendants(pid)]]
    return sum(rss), max(rss)


def run_measured(cmd: list[str], env: dict, log: Path) -> Measured:
    started, start = time.time(), time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        peak = process_peak = 0
        stop = threading.Event()

        def sample():
            nonlocal peak, process_peak
            while not stop.is_set():
                total, largest = tree_rss(proc.pid)
                peak, process_peak = max(peak, total), max(process_peak, largest)
                time.sleep(0.1)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        _, status, usage = os.wait4(proc.pid, 0)  # usage covers the children the process waited for
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        t.join()
    cpu = usage.ru_utime + usage.ru_stime
    return Measured(time.perf_counter() - start, cpu, peak, process_peak, proc.returncode, started)


def stage_table(data: Path, started: float) -> list[tuple[str, float | None, float | None]]:
    """(asset, stage seconds from its _timings.json, step seconds since the previous publication) in graph order."""
    batch = read_json(data / "_batches.json")["batches"][0]["key"]
    rows, previous = [], started
    for asset, marker in STAGES:
        path = data / marker.format(batch=batch)
        published = path.lstat().st_mtime if os.path.lexists(path) else None
        timings = path / "_timings.json" if path.is_dir() else data / asset / "_timings.json"
        seconds = read_json(timings).get("seconds") if timings.exists() else None
        rows.append((asset, seconds, None if published is None else published - previous))
        previous = published or previous
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="*", default=[str(SHARED / "corpora" / "chinese-poetry")])
    ap.add_argument("--poems", type=int, default=0, help="build a corpus of about this many poems and use it")
    ap.add_argument("--runs", type=int, default=1, help="tokenmill runs (the machine may be shared: measure twice)")
    ap.add_argument("--skip-reference", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tokenmill-bench-"))
    if args.poems:
        print(f"built {build(work / 'poems', args.poems):,} poems in {work / 'poems'}")
        args.sources = [str(work / "poems")]
    results: dict[str, Measured] = {}
    if not args.skip_reference:
        ref_dirs = [str(p) for s in args.sources for p in sorted(Path(s).iterdir()) if p.is_dir()] or args.sources
        script = SHARED / "reference" / "seed_reference.py"
        cmd = [sys.executable, str(script), *ref_dirs, "--out", str(work / "ref"), "--bulk"]
        results["seed reference"] = run_measured(cmd, dict(os.environ), work / "ref.log")
        print((work / "ref.log").read_text()[-2500:])
    source = args.sources[0]
    for run in range(1, args.runs + 1):
        data = work / f"data{run}"
        env = {**os.environ, "TOKENMILL_SOURCE": source, "TOKENMILL_DATA": str(data)}
        env.pop("DAGSTER_HOME", None)
        measured = run_measured([sys.executable, "-m", "tokenmill.cli", "update"], env, work / f"tokenmill{run}.log")
        results[f"tokenmill #{run}"] = measured
        if measured.returncode == 0:
            print(f"tokenmill #{run} per stage:        stage s    step s")
            for asset, seconds, step in stage_table(data, measured.started):
                print(f"  {asset:18s} {seconds or 0:10.1f} {step or 0:9.1f}")
    print(f"source: {source}\nlogs and outputs: {work}")
    for name, m in results.items():
        print(
            f"{name:15s} {m.seconds:8.1f} s  {m.cpu_seconds:8.1f} CPU-s  peak {m.peak_mib:6.0f} MiB "
            f"(largest process {m.process_peak_mib:5.0f} MiB)  rc={m.returncode}"
        )
    if ref := results.get("seed reference"):
        for name, m in results.items():
            if m is not ref:
                print(f"{name}: speed-up {ref.seconds / m.seconds:.2f}x (CPU {ref.cpu_seconds / m.cpu_seconds:.2f}x)")
    check = subprocess.run(
        [sys.executable, str(SHARED / "tools" / "check_contracts.py"), str(work / "data1")],
        capture_output=True,
        text=True,
    )
    print(check.stdout.strip().splitlines()[-1] if check.stdout else check.stderr)


if __name__ == "__main__":
    main()
