#!/usr/bin/env python3
"""Bytes on disk per stage of one `tokenmill update` of a source, and per byte of input (issue 45 section 1).

usage: python benchmarks/bench_disk.py [SOURCE] [--data DIR] [--parts] [--json FILE]

Runs `tokenmill update` once on a fresh data root (a temporary folder, or --data, which must not exist) with an
ephemeral Dagster instance, then prints each stage's bytes on disk, its bytes per input byte and the data root's
total. Every real file is counted once (tokenmill.common.disk: stage folders are symlinks to hidden version
folders, and hard links share one copy); the input is what raw_records read of the source (`bytes_read`: the
source files' bytes as they are, compressed or not). --parts breaks each stage down by what its batch folders hold
(dedup_index: signatures/, lsh/, keys/, docs/, ...). Target: the data root <= 2 bytes per input byte.
Default SOURCE: demo_corpus/source; ../shared/corpora/tinyshakespeare and ../shared/corpora/chinese-poetry are the
other curated corpora.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tokenmill.common import disk  # noqa: E402

TARGET = 2.0


def parts(stage_dir: Path, seen: set) -> dict[str, int]:
    """A stage's bytes by the first name inside its version folders (a folder such as signatures/, or a file
    kind such as *.jsonl), each file once."""
    out: dict[str, int] = {}
    root = Path(os.path.realpath(stage_dir))
    versions = [root] if stage_dir.is_symlink() else [p for p in root.iterdir() if not p.is_symlink()]
    for v in versions:
        entries = sorted(v.iterdir()) if v.is_dir() else [v]
        for e in entries:
            if e.is_symlink():
                continue
            name = (
                e.name + "/"
                if e.is_dir()
                else ("*" + "".join(e.suffixes[-1:]) if e.name.startswith("part-") else e.name)
            )
            out[name] = out.get(name, 0) + disk.tree_bytes(e, seen)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", nargs="?", default=str(REPO / "demo_corpus" / "source"))
    ap.add_argument("--data", help="the data root to build (must not exist; kept); default: a temporary one")
    ap.add_argument("--parts", action="store_true", help="each stage's bytes by what its folders hold")
    ap.add_argument("--json", help="write the figures to this file as JSON")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_disk-"))
    data = Path(args.data) if args.data else work / "data"
    if data.exists():
        sys.exit(f"{data}: exists; name a new folder")
    env = {**os.environ, "TOKENMILL_SOURCE": str(Path(args.source).resolve()), "TOKENMILL_DATA": str(data)}
    env.pop("DAGSTER_HOME", None)  # an ephemeral instance: nothing of an earlier run is reused
    try:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "cli", "update"], env=env, cwd=REPO, capture_output=True, text=True
        )
        wall = time.perf_counter() - start
        if done.returncode:
            sys.exit(f"tokenmill update failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        source = disk.input_bytes(data)
        stages = disk.stage_bytes(data)
        total = disk.tree_bytes(data)
        print(f"source {args.source}: {source:,} input bytes; tokenmill update {wall:.1f} s")
        print(f"{'stage':<18} {'bytes':>13} {'B/input B':>10}")
        seen: set = set()
        breakdown = {}
        for k, n in stages.items():
            print(f"{k:<18} {n:>13,} {disk.per_input(n, source):>10.3f}")
            if args.parts:
                breakdown[k] = parts(data / k, seen)
                for name, b in breakdown[k].items():
                    print(f"  {name:<34} {b:>13,} {disk.per_input(b, source):>10.3f}")
        other = total - sum(stages.values())
        print(f"{'(other files)':<18} {other:>13,} {disk.per_input(other, source):>10.3f}")
        ratio = disk.per_input(total, source)
        print(f"{'data root':<18} {total:>13,} {ratio:>10.3f}  (target <= {TARGET:g})")
        if args.json:
            figures = {
                "source": args.source,
                "input_bytes": source,
                "stages": stages,
                "parts": breakdown,
                "total": total,
                "bytes_per_input_byte": ratio,
                "seconds": round(wall, 1),
            }
            Path(args.json).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
