#!/usr/bin/env python3
"""The whole graph on a web crawl: a seeded WARC.gz corpus (benchmarks/web_corpus.py: real text in site layouts and
real pages repeated with changes, 50,000 pages by default) through `tokenmill update`, with each stage's records/s
and GB of input per core-hour, and the share of records dropped per reason.

usage: python benchmarks/bench_web.py [--pages 50000] [--seed 0] [--pages-per-file 2500] [--html DIR] [--work DIR]

--html: folder of real .html(.gz) pages (default tests/fixtures/web/pages; a checkout of scrapinghub's
article-extraction-benchmark html/ gives 181 real pages). The run uses a fresh data root, source folder and
DAGSTER_HOME under --work (default a new temporary folder, kept for inspection).

Per stage: `stage s` is what the stage recorded in its `_timings.json`; `step s` runs from the previous asset's
publication to this one's; `CPU s` is the CPU the process tree spent in that step (user + sys of every process, and
of the children each reaped, sampled from /proc every SAMPLE_S); `rec/s` is the stage's records in over its stage
seconds; `GB/core-h` is the source's WARC.gz bytes over the step's CPU hours (the stage's share of the whole run's
cost, in the unit peers quote). The machine may be shared: wall figures are noisy, CPU seconds less so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from bench_graph import BATCH, stage_table  # noqa: E402
from proctree import descendants  # noqa: E402
from web_corpus import REAL_PAGES, SENTENCES, build  # noqa: E402

from tokenmill.common.io import read_json  # noqa: E402

SAMPLE_S = 0.5
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# FineWeb's published shares of TOKENS removed by the filters ours mirror (Penedo et al. 2024, "The FineWeb Datasets",
# arXiv 2406.17557, sections 3.5-3.6, CC-MAIN-2019-18 after extraction, language and Gopher filtering and dedup);
# ours are shares of records, on a synthetic crawl: a sanity check of the order of magnitude, not a comparison
FINEWEB_TOKENS_REMOVED = {
    "fineweb_punct_lines": "10.14% (lines ending in punctuation <= 0.12)",
    "fineweb_dup_line_chars": "12.47% (characters in duplicated lines >= 0.1)",
    "fineweb_short_lines": "3.73% (lines under 30 characters >= 0.67)",
    "c4_no_terminal_punct": "~30% (C4 terminal punctuation; the other C4 rules together ~7%)",
}


def tree_cpu_seconds(pid: int) -> float:
    """User + sys seconds of `pid` and its descendants, each with the children it has reaped (/proc/<pid>/stat
    fields 14-17): a worker that exited counts through its parent."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime (stat fields 14-17)
    return total / CLOCK_TICKS


def run_update(env: dict, log: Path) -> tuple[float, float, float, list[tuple[float, float]]]:
    """`tokenmill update`: (started time.time(), wall s, CPU s of the tree, [(time.time(), cumulative CPU s)])."""
    started, t0 = time.time(), time.perf_counter()
    samples: list[tuple[float, float]] = []
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "update"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO
        )
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                samples.append((time.time(), tree_cpu_seconds(proc.pid)))
                stop.wait(SAMPLE_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        stop.set()
        sampler.join()
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"tokenmill update failed: see {log}")
    cpu = usage.ru_utime + usage.ru_stime
    samples.append((time.time(), cpu))
    return started, time.perf_counter() - t0, cpu, samples


def cpu_at(samples: list[tuple[float, float]], at: float) -> float:
    """The tree's cumulative CPU seconds at time `at` (the last sample at or before it)."""
    return max((cpu for t, cpu in samples if t <= at), default=0.0)


def stage_stats(data: Path, asset: str) -> dict:
    folder = data / asset / BATCH if (data / asset / BATCH).is_dir() else data / asset
    return read_json(folder / "_stats.json") if (folder / "_stats.json").exists() else {}


def stage_rows(data: Path, started: float, samples, source_bytes: int) -> list[str]:
    lines = [
        f"| {'stage':18s} | {'records in':>10s} | {'stage s':>8s} | {'step s':>7s} | {'CPU s':>7s} | {'rec/s':>7s} "
        f"| {'GB/core-h':>9s} |",
        f"|{'-' * 20}|{'-' * 11}:|{'-' * 9}:|{'-' * 8}:|{'-' * 8}:|{'-' * 8}:|{'-' * 10}:|",
    ]
    previous = started
    for asset, seconds, step in stage_table(data, started):
        at = previous + step
        cpu = cpu_at(samples, at) - cpu_at(samples, previous)
        previous = at
        docs_in = stage_stats(data, asset).get("docs_in")
        rate = f"{docs_in / seconds:7.0f}" if docs_in and seconds else f"{'-':>7s}"
        gb = f"{source_bytes / 1e9 / (cpu / 3600):9.2f}" if cpu > 0 else f"{'-':>9s}"
        records = f"{docs_in:10,d}" if docs_in is not None else f"{'-':>10s}"
        lines.append(f"| {asset:18s} | {records} | {seconds or 0:8.1f} | {step:7.1f} | {cpu:7.1f} | {rate} | {gb} |")
    return lines


def drop_rows(data: Path) -> list[str]:
    """Records each stage dropped, per reason, as a share of the stage's records in (FineWeb's token share beside
    the filters it published), and what raw_records skipped as not a document."""
    lines = [
        f"| {'stage':13s} | {'reason':28s} | {'records':>8s} | {'share':>7s} | FineWeb, tokens removed |",
        f"|{'-' * 15}|{'-' * 30}|{'-' * 9}:|{'-' * 8}:|{'-' * 25}|",
    ]
    for asset in ("raw_records", "cleaned_jsonl", "deduped_jsonl"):
        stats = stage_stats(data, asset)
        for key in sorted(k for k, v in stats.items() if k.startswith("dropped_") and isinstance(v, int) and v):
            reason = key.removeprefix("dropped_")
            share = stats[key] / stats["docs_in"]
            cited = FINEWEB_TOKENS_REMOVED.get(reason, "")
            lines.append(f"| {asset:13s} | {reason:28s} | {stats[key]:8,d} | {share:7.2%} | {cited:23s} |")
    skipped: dict[str, int] = {}
    for file in stage_stats(data, "raw_records").get("files", []):
        for reason, n in file.get("skipped_by_reason", {}).items():
            skipped[reason] = skipped.get(reason, 0) + n
    lines.append(f"raw_records skipped (WARC records that are not documents): {json.dumps(skipped, sort_keys=True)}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pages-per-file", type=int, default=2500)
    ap.add_argument("--html", type=Path, default=REAL_PAGES, help="folder of real .html(.gz) pages")
    ap.add_argument("--work", type=Path, help="work folder (default: a new temporary folder)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tokenmill-web-"))
    source, data, home = work / "source", work / "data", work / "dagster_home"
    for folder in (source, data, home):
        if folder.exists():
            shutil.rmtree(folder)
    home.mkdir(parents=True)
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")

    corpus = build(source / "web", args.pages, args.seed, args.pages_per_file, ["warc"], SENTENCES, args.html)
    source_bytes = corpus["bytes_on_disk"]
    print(
        f"corpus: {args.pages:,} pages in {corpus['files']} WARC.gz files, {source_bytes / 1e6:.1f} MB, "
        f"{len(corpus['languages'])} languages, built in {corpus['seconds']} s (seed {args.seed}, real pages from "
        f"{args.html})"
    )
    env = {**os.environ, "TOKENMILL_SOURCE": str(source), "TOKENMILL_DATA": str(data), "DAGSTER_HOME": str(home)}
    started, wall, cpu, samples = run_update(env, work / "update.log")
    load = os.getloadavg()[0]
    print(
        f"tokenmill update: {wall:.1f} s wall, {cpu:.1f} CPU s (process tree), {os.cpu_count()} cores, load average "
        f"{load:.1f} at the end (shared machine: wall figures are noisy)"
    )
    rate = source_bytes / 1e9 / (cpu / 3600)
    print(f"whole graph: {args.pages / wall:.1f} pages/s, {rate:.3f} GB of WARC.gz per core-hour")
    print("\n".join(stage_rows(data, started, samples, source_bytes)))
    print("records dropped, per stage and reason (share of the stage's records in):")
    print("\n".join(drop_rows(data)))
    tokens = stage_stats(data, "tokenized_bins")
    print(f"out: {tokens.get('docs_out', '?')} records, {tokens.get('tokens', '?')} tokens; work folder {work}")
    print(json.dumps({"languages_built": corpus["languages"]}, ensure_ascii=False)[:2000])


if __name__ == "__main__":
    main()
