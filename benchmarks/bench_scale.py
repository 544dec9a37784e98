"""Scale benchmark (issue 28 item 2): generated corpora of 1M and 10M documents through the whole graph with
`tokenmill update`, measured in one run: CPU-seconds per document at the largest size within 1.15x of the smallest,
every process <= 2 GiB, the run process <= 1 GiB, and bytes written per input byte per stage.

usage: python benchmarks/bench_scale.py [--sizes 1000000,10000000] [--data /tmp/tokenmill_scale] [--workers 2]
                                        [--seed 0] [--out scale.json] [--keep] [--interval 0.2]

Per size: the corpus of benchmarks/scale_corpus.py (cached under --data, reused by later runs), then
`python -m cli update` (what the `tokenmill` entry point runs) in its own process with a fresh TOKENMILL_DATA and
DAGSTER_HOME (the repository's dagster.yaml) under --data/run-<size>/, TOKENMILL_WORKERS=--workers. Measured:
- wall seconds of the process;
- CPU seconds of the process tree: user + sys from os.wait4 on the run process, which includes every descendant
  it waited for (the worker pool is shut down and joined before exit). Cross-checked against the sum of the
  per-process utime + stime sampled from /proc every --interval seconds ("sampled"): rusage >= sampled shows the
  workers are counted;
- peak RSS (VmHWM, sampled) of the run process and of every other process in the tree (the largest is reported;
  ru_maxrss of the tree from wait4 is an upper bound: Linux carries a parent's figure over fork and exec);
- per stage: `seconds` from its `_timings.json` (per-batch stages: `<stage>/<batch>/_timings.json`), the Dagster
  step's wall seconds and CPU seconds of the tree between the step's start and success events (the sampled
  CPU curve: CPU share per step), records in/out from funnel_telemetry/funnel.json or the stage's `_stats.json`,
  bytes on disk under the stage's folder (symlinked versions followed, each file counted once, `_timings.json`
  left out) per input byte, and the largest sampled RSS of the run process and of any other process during the step;
- GB of input per core-hour (input bytes / CPU hours of the tree), and how many of the planted near and exact
  copies dedup removed (the copy or its source in deduped_jsonl/removed.jsonl).
Prints a table per size and the ratios: CPU-s per document at the largest size over the smallest (target <= 1.15,
also per step), then pass/fail per target; --out saves every figure as JSON, with each run's sampled timeline (run
process and largest other RSS, CPU seconds of the tree). The run outputs are removed after each size unless --keep.
Disk: a data root takes several bytes per input byte, so the 10M run needs tens of GB free under --data besides its
~4 GB corpus (docs/profile.md: run 6 under 'Run 4 (2026-12-04, 74f3dff): no serial part left in the run process',
and 'Disk per input byte, first cuts' for what issue 45 removed since).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from proctree import Periodic, descendants, status_mib
from scale_corpus import DOCS_PER_FILE, corpus

from tokenmill.common.disk import STAGES  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
GIB = 1024.0  # MiB
RUN_LIMIT_MIB, PROCESS_LIMIT_MIB, CPU_RATIO_LIMIT = 1 * GIB, 2 * GIB, 1.15
# the per-batch assets, each keeping `<stage>/<batch>/_timings.json`
PER_BATCH = {"raw_records", "cleaned_jsonl", "dedup_report", "dedup_index", "deduped_jsonl"}
EVENTS = """
import json, dagster as dg
with dg.DagsterInstance.get() as instance:
    out = []
    for run in instance.get_runs():
        for e in instance.all_logs(run.run_id):
            kind = e.dagster_event.event_type_value if e.is_dagster_event else None
            if kind in ("STEP_START", "STEP_SUCCESS", "STEP_FAILURE"):
                out.append([e.step_key, kind, e.timestamp])
print(json.dumps(out))
"""


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process from /proc/<pid>/stat (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        text = " ".join(a.decode(errors="replace") for a in args if a)
        return text if len(text) <= 90 else text[:87] + "..."
    except OSError:
        return "?"


class Sampler(Periodic):
    """Samples every process of the tree under `pid` each `interval` seconds: peak VmHWM and last CPU seconds per
    process, and the tree's CPU seconds over time (the sum of every process's last value)."""

    def __init__(self, pid: int, interval: float):
        super().__init__(interval)
        self.pid = pid
        self.hwm: dict[int, float] = {}
        self.cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.curve: list[tuple[float, float]] = []  # (time, CPU seconds of the tree)
        self.rss: list[tuple[float, float, float]] = []  # (time, run process VmRSS, largest other VmRSS)
        self.tree_rss_peak = 0.0

    def sample(self) -> None:
        pids = [self.pid, *descendants(self.pid)]
        rss = {}
        for p in pids:
            c = cpu_seconds(p)
            if c is None:
                continue
            if p not in self.names:
                self.names[p] = process_name(p)
            self.cpu[p] = c
            self.hwm[p] = max(self.hwm.get(p, 0.0), status_mib(p, "VmHWM"))
            rss[p] = status_mib(p, "VmRSS")
        now = time.time()
        self.tree_rss_peak = max(self.tree_rss_peak, sum(rss.values()))
        self.curve.append((now, sum(self.cpu.values())))
        others = [m for p, m in rss.items() if p != self.pid]
        self.rss.append((now, rss.get(self.pid, 0.0), max(others, default=0.0)))

    def cpu_at(self, t: float) -> float:
        if not self.curve:
            return 0.0
        times, values = zip(*self.curve)
        return float(np.interp(t, times, values))

    def rss_during(self, start: float, end: float) -> tuple[float | None, float | None]:
        """The largest sampled VmRSS of the run process and of any other process between start and end (None: no
        sample fell inside, a step shorter than the interval)."""
        inside = [(run, other) for t, run, other in self.rss if start <= t <= end]
        if not inside:
            return None, None
        return max(r for r, _ in inside), max(o for _, o in inside)


def run_update(env: dict, log: Path, interval: float, config: Path | None = None) -> dict:
    """One `tokenmill update` (with a run config YAML if given) in its own process: wall, CPU of the tree (rusage)
    and the sampler's figures."""
    started, t0 = time.time(), time.perf_counter()
    command = [sys.executable, "-m", "cli", "update", *(["--config", str(config)] if config else [])]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        with Sampler(proc.pid, interval) as sampler:
            _, status, usage = os.wait4(proc.pid, 0)  # usage covers every descendant the process waited for
    wall = time.perf_counter() - t0
    others = {p: m for p, m in sampler.hwm.items() if p != proc.pid}
    largest = max(others, key=others.__getitem__) if others else None
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "started": started,
        "ended": started + wall,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "cpu_sampled_s": sum(sampler.cpu.values()),
        "cpu_sampled_run_s": sampler.cpu.get(proc.pid, 0.0),
        "run_rss_mib": sampler.hwm.get(proc.pid, 0.0),
        "largest_other_rss_mib": others.get(largest, 0.0) if largest else 0.0,
        "largest_other": sampler.names.get(largest, "") if largest else "",
        "tree_maxrss_mib": usage.ru_maxrss / 1024,  # upper bound of the largest process
        "tree_rss_peak_mib": sampler.tree_rss_peak,
        "processes": [
            {"pid": p, "name": sampler.names.get(p, "?"), "peak_rss_mib": sampler.hwm[p], "cpu_s": sampler.cpu[p]}
            for p in sampler.hwm
        ],
        "_sampler": sampler,
    }


def step_intervals(env: dict) -> dict[str, tuple[float, float]]:
    """{step key: (start, end)} from the instance's events (a child process: this one stays free of Dagster)."""
    done = subprocess.run([sys.executable, "-c", EVENTS], env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        print(f"  (step events unreadable: {done.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
        return {}
    starts, ends = {}, {}
    for key, kind, at in json.loads(done.stdout.strip().splitlines()[-1]):
        (starts if kind == "STEP_START" else ends)[key] = at
    return {k: (starts[k], ends[k]) for k in starts if k in ends}


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def stage_files(data: Path, stage: str, batches: list[str], name: str) -> list[Path]:
    """A stage's `name` files: one per batch for per-batch stages (`<stage>/<batch>/<name>`), else one."""
    return [data / stage / b / name for b in batches] if stage in PER_BATCH else [data / stage / name]


def stage_seconds(data: Path, stage: str, batches: list[str]) -> float | None:
    """The stage's own `seconds` (its `_timings.json`), summed over batches for per-batch stages."""
    paths = stage_files(data, stage, batches, "_timings.json")
    found = [read_json(p).get("seconds") for p in paths if p.exists()]
    found = [s for s in found if s is not None]
    return sum(found) if found else None


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under folder, symlinks followed, each file once, `_timings.json` left out."""
    seen, total = set(), 0
    for root, _dirs, files in os.walk(folder, followlinks=True):
        for name in files:
            if name == "_timings.json":
                continue
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def records(data: Path, batches: list[str]) -> dict[str, dict]:
    """{stage: {in, out, dropped: {reason: n}}} from the funnel, else from the stages' `_stats.json`."""
    out: dict[str, dict] = {}
    funnel = read_json(data / "funnel_telemetry" / "funnel.json")
    for s in funnel.get("stages", []):
        out[s["stage"]] = {"in": s.get("docs_in"), "out": s.get("docs_out")}
    for stage in ("raw_records", "cleaned_jsonl", "dedup_report", "deduped_jsonl", "tokenized_bins"):
        stats = [read_json(p) for p in stage_files(data, stage, batches, "_stats.json") if p.exists()]
        if not stats:
            continue
        row = out.setdefault(stage, {})
        row.setdefault("in", sum(s.get("docs_in", 0) for s in stats))
        row.setdefault("out", sum(s.get("docs_out", 0) for s in stats))
        dropped: dict[str, int] = {}
        for s in stats:
            for k, v in s.items():
                if k.startswith("dropped_") and isinstance(v, int) and v:
                    dropped[k.removeprefix("dropped_")] = dropped.get(k.removeprefix("dropped_"), 0) + v
        row["dropped"] = dropped
    return out


def planted_found(corpus_dir: Path, data: Path) -> dict:
    """How many planted near/exact copies dedup removed: the copy or its source listed in removed.jsonl."""
    planted = np.load(corpus_dir / "planted.npz")
    removed = set()
    path = data / "deduped_jsonl" / "removed.jsonl"
    if path.exists():
        with open(path, "rb") as f:
            for line in f:
                src = json.loads(line).get("source", {})
                if "line" in src:
                    removed.add((src["path"], src["line"]))

    def key(i: int) -> tuple[str, int]:
        return f"part-{i // DOCS_PER_FILE:05d}.jsonl", i % DOCS_PER_FILE + 1

    hit = np.array(
        [key(c) in removed or key(s) in removed for c, s in zip(planted["copy"].tolist(), planted["source"].tolist())],
        dtype=bool,
    )
    near = planted["near"]
    return {
        "near_planted": int(near.sum()),
        "near_found": int(hit[near].sum()),
        "exact_planted": int((~near).sum()),
        "exact_found": int(hit[~near].sum()),
        "removed": len(removed),
    }


def measure(n: int, args) -> dict:
    t0 = time.perf_counter()
    corpus_dir = corpus(Path(args.data), n, args.seed)
    gen = read_json(corpus_dir / "corpus.json")
    if time.perf_counter() - t0 > 1:
        print(f"  corpus of {n:,} generated in {gen['seconds']:.0f} s ({n / gen['seconds']:,.0f} docs/s)", flush=True)
    run_dir = Path(args.data) / f"run-{n}"
    shutil.rmtree(run_dir, ignore_errors=True)
    home = run_dir / "home"
    home.mkdir(parents=True)
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    data = run_dir / "data"
    env = {
        **os.environ,
        "TOKENMILL_SOURCE": str(corpus_dir / "source"),
        "TOKENMILL_DATA": str(data),
        "DAGSTER_HOME": str(home),
        "TOKENMILL_WORKERS": str(args.workers),
    }
    r = run_update(env, run_dir / "update.log", args.interval)
    sampler = r.pop("_sampler")
    # for a look at where memory grows: (seconds since start, run process MiB, largest other MiB, tree CPU-s)
    r["timeline"] = [
        [round(t - r["started"], 2), round(run, 1), round(other, 1), round(cpu, 2)]
        for (t, run, other), (_, cpu) in zip(sampler.rss, sampler.curve)
    ]
    r["log_tail"] = (run_dir / "update.log").read_text()[-3000:]
    r.update(docs=n, input_bytes=gen["bytes"], corpus=gen)
    if r["returncode"]:
        print(f"  tokenmill update failed (rc {r['returncode']}):\n{r['log_tail']}", file=sys.stderr)
        return r
    batches = [b["key"] for b in read_json(data / "_batches.json").get("batches", [])]
    steps = step_intervals(env)
    counts = records(data, batches)
    r["steps"] = steps
    r["stages"] = {}
    for stage in STAGES:
        span = steps.get(stage)
        row = {
            "stage_s": stage_seconds(data, stage, batches),
            "step_s": span[1] - span[0] if span else None,
            "cpu_s": sampler.cpu_at(span[1]) - sampler.cpu_at(span[0]) if span else None,
            "run_rss_mib": sampler.rss_during(*span)[0] if span else None,
            "other_rss_mib": sampler.rss_during(*span)[1] if span else None,
            "bytes": folder_bytes(data / stage),
            **counts.get(stage, {}),
        }
        row["bytes_per_input_byte"] = row["bytes"] / r["input_bytes"]
        r["stages"][stage] = row
    in_steps = sum(s["cpu_s"] or 0 for s in r["stages"].values())
    r["cpu_outside_steps_s"] = r["cpu_sampled_s"] - in_steps
    r["data_bytes"] = folder_bytes(data)
    r["dagster_home_bytes"] = folder_bytes(home)
    r["cpu_us_per_doc"] = 1e6 * r["cpu_s"] / n
    r["gb_per_core_hour"] = r["input_bytes"] / 1e9 / (r["cpu_s"] / 3600)
    r["planted"] = planted_found(corpus_dir, data)
    if not args.keep:
        shutil.rmtree(data, ignore_errors=True)
    return r


def show_size(r: dict) -> None:
    n = r["docs"]
    print(
        f"\n{n:,} documents, {r['input_bytes'] / 1e6:,.0f} MB: wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s "
        f"(rusage of the tree; sampled per process {r['cpu_sampled_s']:.1f} s, run process "
        f"{r['cpu_sampled_run_s']:.1f} s), {r['cpu_us_per_doc']:.1f} CPU-us/doc, "
        f"{r['gb_per_core_hour']:.2f} GB/core-hour"
    )
    print(
        f"  peak RSS: run process {r['run_rss_mib']:.0f} MiB, largest other {r['largest_other_rss_mib']:.0f} MiB "
        f"({r['largest_other']}); tree sum {r['tree_rss_peak_mib']:.0f} MiB; "
        f"wait4 ru_maxrss {r['tree_maxrss_mib']:.0f} MiB"
    )
    for p in sorted(r["processes"], key=lambda p: -p["peak_rss_mib"]):
        print(f"    pid {p['pid']:>7}  {p['peak_rss_mib']:7.0f} MiB  {p['cpu_s']:8.1f} CPU-s  {p['name']}")
    print(
        f"  {'stage':17s} {'stage s':>8s} {'step s':>8s} {'CPU-s':>8s} {'CPU %':>6s} {'in':>11s} {'out':>11s} "
        f"{'dropped':>8s} {'B/B in':>7s} {'run MiB':>7s} {'other':>6s}"
    )
    total = r["cpu_sampled_s"] or 1

    def fmt(value, spec: str) -> str:
        width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
        return format(value, spec) if value is not None else "-".rjust(width)

    for stage, s in r["stages"].items():
        drop = 1 - s["out"] / s["in"] if s.get("in") else None
        share = 100 * s["cpu_s"] / total if s["cpu_s"] is not None else None
        note = "  (in dedup_report's step)" if stage == "dedup_index" and s["step_s"] is None else ""
        print(
            f"  {stage:17s} {fmt(s['stage_s'], '8.1f')} {fmt(s['step_s'], '8.1f')} {fmt(s['cpu_s'], '8.1f')} "
            f"{fmt(share, '6.1f')} {fmt(s.get('in'), '11,')} {fmt(s.get('out'), '11,')} "
            f"{fmt(drop and 100 * drop, '7.2f')}{'%' if drop is not None else ' '} "
            f"{s['bytes_per_input_byte']:7.3f} {fmt(s['run_rss_mib'], '7.0f')} {fmt(s['other_rss_mib'], '6.0f')}{note}"
        )
        if s.get("dropped"):
            print(f"  {'':17s} dropped: {', '.join(f'{k} {v:,}' for k, v in s['dropped'].items())}")
    print(
        f"  {'outside steps':17s} {'':8s} {'':8s} {r['cpu_outside_steps_s']:8.1f} "
        f"{100 * r['cpu_outside_steps_s'] / total:6.1f}   (start-up, planning, exit)"
    )
    print(
        f"  disk: data root {r['data_bytes'] / r['input_bytes']:.3f} B per input byte "
        f"({r['data_bytes'] / 1e6:,.0f} MB), DAGSTER_HOME {r['dagster_home_bytes'] / 1e6:,.1f} MB"
    )
    p = r["planted"]
    print(
        f"  planted copies removed by dedup: near {p['near_found']:,} of {p['near_planted']:,} "
        f"({100 * p['near_found'] / max(1, p['near_planted']):.1f}%), exact {p['exact_found']:,} of "
        f"{p['exact_planted']:,}; spam planted {r['corpus']['spam']:,}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,10000000", help="documents per run, comma-separated")
    ap.add_argument("--data", default="/tmp/tokenmill_scale", help="cached corpora and run folders")
    ap.add_argument("--workers", type=int, default=2, help="TOKENMILL_WORKERS of the runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep each run's data root")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between /proc samples")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    print(
        f"bench_scale: sizes {', '.join(f'{n:,}' for n in sizes)}; workers {args.workers}; data {args.data}; "
        f"commit {commit.stdout.strip()}; {datetime.date.today()}",
        flush=True,
    )
    results = []
    for n in sizes:
        r = measure(n, args)
        results.append(r)
        if r["returncode"] == 0:
            show_size(r)
        sys.stdout.flush()
    ok = [r for r in results if r["returncode"] == 0]
    print(
        f"\n{'docs':>11s} {'MB in':>8s} {'wall s':>8s} {'CPU-s':>9s} {'CPU-us/doc':>10s} {'run MiB':>8s} "
        f"{'other MiB':>9s} {'GB/core-h':>9s} {'docs/s':>9s}"
    )
    for r in ok:
        print(
            f"{r['docs']:>11,} {r['input_bytes'] / 1e6:>8,.0f} {r['wall_s']:>8.1f} {r['cpu_s']:>9.1f} "
            f"{r['cpu_us_per_doc']:>10.1f} {r['run_rss_mib']:>8.0f} {r['largest_other_rss_mib']:>9.0f} "
            f"{r['gb_per_core_hour']:>9.2f} {r['docs'] / r['wall_s']:>9,.0f}"
        )
    verdicts = {}
    if len(ok) >= 2:
        small, large = ok[0], ok[-1]
        ratio = large["cpu_us_per_doc"] / small["cpu_us_per_doc"]
        verdicts["cpu_per_doc_ratio"] = ratio
        print(
            f"\nCPU-s per document, {large['docs']:,} / {small['docs']:,}: {ratio:.3f} "
            f"(target <= {CPU_RATIO_LIMIT}): {'PASS' if ratio <= CPU_RATIO_LIMIT else 'FAIL'}"
        )
        per_step = []
        for stage in STAGES:
            a, b = small["stages"][stage]["cpu_s"], large["stages"][stage]["cpu_s"]
            if a and b:
                per_step.append(f"{stage} {(b / large['docs']) / (a / small['docs']):.2f}")
        print(f"  per step (CPU-s per document, same ratio): {', '.join(per_step)}")
    for r in ok:
        run_ok = r["run_rss_mib"] <= RUN_LIMIT_MIB
        every_ok = max(r["run_rss_mib"], r["largest_other_rss_mib"]) <= PROCESS_LIMIT_MIB
        verdicts[f"{r['docs']}_run_process_le_1gib"] = run_ok
        verdicts[f"{r['docs']}_every_process_le_2gib"] = every_ok
        print(
            f"{r['docs']:,}: run process {r['run_rss_mib']:.0f} MiB <= 1 GiB: {'PASS' if run_ok else 'FAIL'}; "
            f"every process <= 2 GiB (largest {max(r['run_rss_mib'], r['largest_other_rss_mib']):.0f} MiB): "
            f"{'PASS' if every_ok else 'FAIL'}"
        )
    for r in results:
        if r["returncode"]:
            log = Path(args.data) / f"run-{r['docs']}" / "update.log"
            print(f"{r['docs']:,}: tokenmill update FAILED (rc {r['returncode']}); its log: {log}")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"commit": commit.stdout.strip(), "results": results, "verdicts": verdicts}, indent=1) + "\n"
        )
    sys.exit(1 if len(ok) < len(results) else 0)


if __name__ == "__main__":
    main()
