"""Kill harness: SIGKILL the run (the run process alone, or its whole process group) at named points in every
stage, including between the steps of a folder swap; the rerun succeeds, its outputs are byte-identical to a
clean run, nothing is left behind and no process of the killed run survives."""

import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from support import published_files

from tokenmill.common.failpoints import ENV as FAILPOINT_ENV
from tokenmill.common.lock import LOCK_FILE

REPO = Path(__file__).resolve().parents[1]
STAGES = [
    "raw_records",
    "cleaned_jsonl",
    "dedup_report",
    "deduped_jsonl",
    "tokenizer",
    "tokenized_bins",
    "funnel_telemetry",
]
# one publish step per stage, rotating (tokenized_bins publishes versions: its own two points), then whole-process-
# group kills: 11 points across every stage
SWAPPED = [stage for stage in STAGES if stage != "tokenized_bins"]
POINTS = [f"{stage}:{step}" for stage, step in zip(SWAPPED, itertools.cycle(["staged", "versioned", "pointed"]))]
POINTS += ["tokenized_bins:version_written", "tokenized_bins:split_published"]
POINTS += ["cleaned_jsonl:versioned@group", "dedup_report:pointed@group", "tokenized_bins:version_written@group"]
# The frozen tokenizer and the append-only dataset write nothing when their batch is run again: their points are
# reached by a first build (tests/test_versions.py kills an append with an earlier version in place).
FIRST_BUILD_ONLY = {"tokenizer", "tokenized_bins"}

RUN_GRAPH = """
import sys
from pathlib import Path
import dagster as dg
from definitions import build_defs
from resources import CorpusSource, DataRoot
from assets.batches import register_batches
from runs import run_batches
defs = build_defs(CorpusSource(path=sys.argv[1]), DataRoot(root=sys.argv[2]))
with dg.instance_for_test() as instance:
    pending = register_batches(instance, Path(sys.argv[2]), Path(sys.argv[1]).resolve())[0] or ["g1-b000001"]
    results = [r for _, r in run_batches(defs.resolve_job_def("tokenmill_all"), instance, pending)]
sys.exit(0 if all(r.success for r in results) else 1)
"""


def run_graph(source, data, marker, failpoint=None) -> int:
    env = {**os.environ, "TOKENMILL_WORKERS": "2", "TOKENMILL_HARNESS": marker}
    env.pop(FAILPOINT_ENV, None)
    if failpoint:
        env[FAILPOINT_ENV] = failpoint
    # its own session: a process-group kill must not reach pytest
    proc = subprocess.run(
        [sys.executable, "-c", RUN_GRAPH, str(source), str(data)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        start_new_session=True,
        timeout=600,
    )
    return proc.returncode if proc.returncode != 1 else proc.stderr[-3000:]


def snapshot(data: Path) -> dict[str, bytes]:
    """Every data file of every stage, through the published links (not the run's `_timings.json`)."""
    return {name: data for name, data in published_files(data).items() if name.split("/")[0] in STAGES}


def leftovers(data: Path) -> list[str]:
    """Hidden entries of the data root and its stage folders that no published link names (unfinished work)."""
    found = []
    for folder in [data, *(p for p in data.iterdir() if p.is_dir() and not p.name.startswith("."))]:
        published = {os.readlink(p) for p in folder.iterdir() if p.is_symlink()}
        found += [
            f"{folder.name}/{p.name}"
            for p in folder.iterdir()
            if p.name.startswith(".") and p.name not in published and p.name not in (LOCK_FILE, ".batches.lock")
        ]
    return sorted(found)


def survivors(marker: str, grace_seconds: float = 10.0) -> list[int]:
    """Processes of the harness's runs still alive after `grace_seconds` (a worker notices its run's death within
    a second; multiprocessing's resource tracker exits shortly after the run process)."""
    deadline = time.monotonic() + grace_seconds
    while (pids := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids


def _marked(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if f"TOKENMILL_HARNESS={marker}".encode() in (proc / "environ").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def test_rerun_after_a_kill_at_any_point_matches_a_clean_run(tmp_path, demo_source):
    marker = uuid.uuid4().hex
    assert run_graph(demo_source, tmp_path / "clean", marker) == 0
    clean = snapshot(tmp_path / "clean")
    data = tmp_path / "data"
    assert run_graph(demo_source, data, marker) == 0  # the good output each killed run is replacing
    problems = []
    for n, point in enumerate(POINTS):  # each rerun is the next kill's earlier good output
        if point.split(":")[0] in FIRST_BUILD_ONLY:
            data = tmp_path / f"first-build-{n}"
        killed = run_graph(demo_source, data, marker, failpoint=point)
        rerun = run_graph(demo_source, data, marker)
        after = snapshot(data)
        left = leftovers(data)
        orphans = survivors(marker)
        for pid in orphans:
            os.kill(pid, signal.SIGKILL)
        differing = sorted(name for name in after.keys() | clean.keys() if after.get(name) != clean.get(name))
        checks = [
            (f"not killed ({killed})", killed != -signal.SIGKILL),
            (f"rerun failed ({rerun})", rerun != 0),
            (f"differs from a clean run: {differing}", bool(differing)),
            (f"left behind: {left}", bool(left)),
            (f"orphan processes: {orphans}", bool(orphans)),
        ]
        problems += [f"{point}: {problem}" for problem, failed in checks if failed]
    print(f"kill harness: {len(POINTS)} kills, {len(problems)} problems")
    assert problems == []
