#!/usr/bin/env python3
"""One-file incremental update of the demo corpus: what `tokenmill update` costs when almost nothing is new.

usage: python benchmarks/bench_startup.py [--rounds 5]
The demo corpus is built once (the template: data root + Dagster instance); each round copies the template, adds one
small JSONL file to the source and times `tokenmill update` in its own process, with the template's instance
(DAGSTER_HOME) and with none (an ephemeral instance). Prints the median wall seconds, CPU seconds of the process tree
and, from the run's events, where the wall time went: before the first step (imports, instance, batch registration,
planning), the steps, and after the last event (exit). Target (issue 28 item 4): <= 3 s wall.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 3.0
NEW_FILE = '{"id": "added-1", "text": "A record added after the first build, with words enough to pass every rule."}\n'


def update(env: dict) -> tuple[float, float]:
    """(wall s, CPU s of the process tree) of one `tokenmill update`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cli", "update"], env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"tokenmill update failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def phases(home: Path, started: float, ended: float) -> dict[str, float]:
    """Wall seconds before the first step, in the steps (the funnel's on its own) and after the last event, from the
    events of the instance's latest run."""
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(home)
    with dg.DagsterInstance.get() as instance:
        run = instance.get_runs(limit=1)[0]
        events = [e for e in instance.all_logs(run.run_id) if e.is_dagster_event]
    starts = {e.step_key: e.timestamp for e in events if e.dagster_event.event_type_value == "STEP_START"}
    ends = {e.step_key: e.timestamp for e in events if e.dagster_event.event_type_value == "STEP_SUCCESS"}
    first, last = min(starts.values()), events[-1].timestamp
    funnel = ends["funnel_telemetry"] - starts["funnel_telemetry"]
    return {
        "before first step": first - started,
        "steps but funnel": max(ends.values()) - first - funnel,
        "funnel_telemetry": funnel,
        "after last event": ended - last,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tokenmill-startup-"))
    template = work / "template"
    shutil.copytree(REPO / "demo_corpus", template / "source")
    (template / "home").mkdir()
    base = {
        **os.environ,
        "TOKENMILL_SOURCE": str(work / "round" / "source"),
        "TOKENMILL_DATA": str(work / "round" / "data"),
    }
    base.pop("DAGSTER_HOME", None)
    shutil.copytree(template, work / "round")
    update({**base, "DAGSTER_HOME": str(work / "round" / "home")})  # the first build
    shutil.rmtree(template)
    (work / "round").rename(template)
    print(f"demo corpus built in {template}; {args.rounds} rounds of a one-file update each")
    for label, with_home in (("with DAGSTER_HOME", True), ("ephemeral instance", False)):
        walls, cpus, splits = [], [], []
        for _ in range(args.rounds):
            shutil.rmtree(work / "round", ignore_errors=True)
            shutil.copytree(template, work / "round")
            (work / "round" / "source" / "added.jsonl").write_text(NEW_FILE, encoding="utf-8")
            env = {**base, "DAGSTER_HOME": str(work / "round" / "home")} if with_home else base
            started = time.time()
            wall, cpu = update(env)
            walls.append(wall)
            cpus.append(cpu)
            if with_home:
                splits.append(phases(work / "round" / "home", started, time.time()))
        wall = statistics.median(walls)
        print(
            f"{label:20s} wall median {wall:5.2f} s (min {min(walls):.2f}, max {max(walls):.2f})   "
            f"CPU of the tree median {statistics.median(cpus):5.2f} s   target {TARGET_S:.1f} s: "
            f"{'met' if wall <= TARGET_S else 'NOT met'} ({wall / TARGET_S:.2f}x)"
        )
        for name in splits[0] if splits else ():
            print(f"    {name:20s} {statistics.median(s[name] for s in splits):5.2f} s")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
