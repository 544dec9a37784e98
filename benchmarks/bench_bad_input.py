#!/usr/bin/env python3
"""What tiny hostile files cost raw_records (issue 46 items 1-2), for this tree and, with --baseline, another one
(e.g. a `git worktree` of an earlier commit) in the same run.

usage: python benchmarks/bench_bad_input.py [--baseline TREE] [--objects N] [--blank-mib M] [--honest-mb MB]

Cases, each read by `tokenmill.stages.raw.ingest` (1 worker) in a fresh process of the tree measured:
- objects: a .jsonl.zst of N lines of `{}` (no text field: every line rejected): quarantine bytes, CPU-s;
- blank: a .jsonl.zst of M MiB of newlines then one record: CPU-s (the record's line number checked);
- honest: a generated JSONL of about MB megabytes of prose records: CPU-s, to show the readers cost the same.
Prints each figure per tree, then baseline / this tree.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from tokenmill.stages.raw import RawSettings, ingest
src, out = Path(sys.argv[1]), Path(sys.argv[2])
t0 = time.perf_counter()
result = ingest(src, out, RawSettings(), workers=1)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
    "wall_s": round(time.perf_counter() - t0, 2),
    "kept": result.docs_out,
    "rejected": result.rejected,
    "quarantine_bytes": (out / "_rejected.jsonl").stat().st_size,
    "source_bytes": sum(p.stat().st_size for p in src.iterdir()),
}))
"""


def write_cases(root: Path, objects: int, blank_mib: int, honest_mb: int) -> dict[str, Path]:
    sys.path.insert(0, str(REPO))
    from tokenmill.common.io import zstd

    cases = {name: root / name for name in ("objects", "blank", "honest")}
    for folder in cases.values():
        folder.mkdir()
    (cases["objects"] / "objects.jsonl.zst").write_bytes(zstd.compress(b"{}\n" * objects))
    blank = zstd.compress(b"\n" * (blank_mib << 20) + b'{"text": "after the blank lines"}\n')
    (cases["blank"] / "blank.jsonl.zst").write_bytes(blank)
    rng = random.Random(0)
    words = [w for w in (REPO / "README.md").read_text(encoding="utf-8").split() if w.isalpha()]
    with open(cases["honest"] / "prose.jsonl", "w", encoding="utf-8") as f:
        written = 0
        while written < honest_mb << 20:
            line = json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(50, 800)))}) + "\n"
            f.write(line)
            written += len(line)
    return cases


def measure(tree: Path, src: Path, scratch: Path) -> dict:
    out = Path(tempfile.mkdtemp(dir=scratch))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(out / "raw")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, help="another tokenmill tree to measure beside this one")
    ap.add_argument("--objects", type=int, default=2_000_000)
    ap.add_argument("--blank-mib", type=int, default=100)
    ap.add_argument("--honest-mb", type=int, default=100)
    args = ap.parse_args()
    trees = {"this tree": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        cases = write_cases(scratch, args.objects, args.blank_mib, args.honest_mb)
        figures = {
            (name, case): measure(tree, src, scratch) for name, tree in trees.items() for case, src in cases.items()
        }
    print(f"{'case':<8} {'tree':<10} {'source B':>12} {'kept':>9} {'rejected':>10} {'quarantine B':>14} {'CPU-s':>8}")
    for (name, case), f in figures.items():
        print(
            f"{case:<8} {name:<10} {f['source_bytes']:>12,} {f['kept']:>9,} {f['rejected']:>10,} "
            f"{f['quarantine_bytes']:>14,} {f['cpu_s']:>8.2f}"
        )
    if args.baseline:
        for case in cases:
            base, this = figures[("baseline", case)], figures[("this tree", case)]
            print(
                f"{case}: baseline / this tree: quarantine bytes "
                f"{base['quarantine_bytes'] / max(this['quarantine_bytes'], 1):.1f}x, CPU-s "
                f"{base['cpu_s'] / max(this['cpu_s'], 0.01):.2f}x"
            )
    for case in cases:
        f = figures[("this tree", case)]
        print(f"{case}: quarantine bytes per source byte {f['quarantine_bytes'] / f['source_bytes']:.1f}")


if __name__ == "__main__":
    main()
