#!/usr/bin/env python3
"""Whole graph vs the seed reference, side by side in one run: wall time, CPU seconds and peak memory (process
tree), the ratio to the reference, and each stage's seconds.

usage: python benchmarks/bench_graph.py [SOURCE_DIR ...] [--poems N] [--runs K] [--launch job|materialize|both]
                                        [--skip-reference]
Default source: ../shared/corpora/chinese-poetry; `--poems 355000` builds the ~355k-poem corpus
(benchmarks/poetry_corpus.py) in the work folder and uses it instead. The reference is
../shared/reference/seed_reference.py --bulk (single process). tokenmill runs, `--runs` times each on a fresh data
root and a throwaway instance, through each launch path asked for: `job` is `tokenmill update` (the source as its
first batch through the tokenmill_all job); `materialize` is `dagster asset materialize -m definitions --select '*'
--partition <batch>` (every asset, the exports included), after the batch was registered (not timed).
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

BATCH = "g1-b000001"  # the first batch of a fresh data root
# every asset with the file whose publication marks its end (the exports only under `materialize`)
STAGES = (
    ("raw_records", "raw_records/{batch}"),
    ("cleaned_jsonl", "cleaned_jsonl/{batch}"),
    ("dedup_report", "dedup_report/{batch}"),
    ("deduped_jsonl", "deduped_jsonl/{batch}"),
    ("tokenizer", "tokenizer"),
    ("tokenized_bins", "tokenized_bins/train/dataset.json"),
    ("funnel_telemetry", "funnel_telemetry"),
    ("hf_parquet", "hf_parquet"),
    ("megatron_indexed", "megatron_indexed"),
    ("nanogpt_bins", "nanogpt_bins"),
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


def stage_table(data: Path, started: float) -> list[tuple[str, float | None, float]]:
    """(asset, stage seconds from its _timings.json, step seconds since the previous publication) for the assets
    the run published, in publication order."""
    published = []
    for asset, marker in STAGES:
        path = data / marker.format(batch=BATCH)
        if os.path.lexists(path):
            timings = path / "_timings.json" if path.is_dir() else data / asset / "_timings.json"
            seconds = read_json(timings).get("seconds") if timings.exists() else None
            published.append((path.lstat().st_mtime, asset, seconds))
    rows, previous = [], started
    for at, asset, seconds in sorted(published):
        rows.append((asset, seconds, at - previous))
        previous = at
    return rows


def registered_instance(home: Path, env: dict) -> Path:
    """A fresh Dagster instance folder (the repo's dagster.yaml) with the source registered as the first batch,
    as the sensor or `tokenmill update` would before a launch."""
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    register = (
        "import dagster as dg; from pathlib import Path; from resources import data_root_from_env, source_from_env; "
        "from assets.batches import register_batches; "
        "pending, _ = register_batches(dg.DagsterInstance.get(), data_root_from_env().path(''), "
        "source_from_env().resolved()); print(pending)"
    )
    out = subprocess.run(
        [sys.executable, "-c", register],
        env={**env, "DAGSTER_HOME": str(home)},
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0 or BATCH not in out.stdout:
        sys.exit(f"registering the source failed: {out.stdout}{out.stderr}")
    return home


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="*", default=[str(SHARED / "corpora" / "chinese-poetry")])
    ap.add_argument("--poems", type=int, default=0, help="build a corpus of about this many poems and use it")
    ap.add_argument("--runs", type=int, default=1, help="tokenmill runs (the machine may be shared: measure twice)")
    ap.add_argument("--launch", choices=("job", "materialize", "both"), default="both")
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
    launches = ("job", "materialize") if args.launch == "both" else (args.launch,)
    for run in range(1, args.runs + 1):
        for launch in launches:
            name = f"{launch} #{run}"
            data = work / f"data-{launch}{run}"
            env = {**os.environ, "TOKENMILL_SOURCE": source, "TOKENMILL_DATA": str(data)}
            env.pop("DAGSTER_HOME", None)
            if launch == "job":
                cmd = [sys.executable, "-m", "cli", "update"]
            else:
                env["DAGSTER_HOME"] = str(registered_instance(work / f"home-{launch}{run}", env))
                dagster = str(Path(sys.executable).with_name("dagster"))
                cmd = [dagster, "asset", "materialize", "-m", "definitions", "--select", "*", "--partition", BATCH]
            measured = run_measured(cmd, env, work / f"{launch}{run}.log")
            results[name] = measured
            if measured.returncode == 0:
                print(f"{name} per stage:        stage s    step s")
                for asset, seconds, step in stage_table(data, measured.started):
                    print(f"  {asset:18s} {seconds or 0:10.1f} {step:9.1f}")
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
        [sys.executable, str(SHARED / "tools" / "check_contracts.py"), str(work / f"data-{launches[0]}1")],
        capture_output=True,
        text=True,
    )
    print(check.stdout.strip().splitlines()[-1] if check.stdout else check.stderr)


if __name__ == "__main__":
    main()
