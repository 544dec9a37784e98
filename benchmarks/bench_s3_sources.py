#!/usr/bin/env python3
"""Reading a source from object storage against reading the same files locally: a generated corpus (JSONL, JSONL.zst
and Parquet, --mb of each) in a local folder and in a bucket of the real S3 server on loopback (SeaweedFS,
devtools/s3_server.py), each read twice per format: every byte through the readers' opener (`stream.open_regular`:
ranged GETs of remote.READ_BLOCK bytes for the bucket) and the whole raw stage (`ingest`, one worker, in this
process).

usage: python benchmarks/bench_s3_sources.py [--mb 64] [--work DIR] [--repeat 3]

Per row: `MB/s` is source bytes over wall seconds; `MB/CPU-s` is source bytes over this process's CPU seconds (user +
sys: the bytes read per second per core, the figure the issue asks for); `server CPU-s` is what the SeaweedFS
process spent serving them (on a real store that is the provider's, not yours). Best of --repeat runs each. The machine
may be shared: wall figures are noisy, CPU seconds less so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from devtools.s3_server import s3_server  # noqa: E402
from tokenmill.common.io import zstd  # noqa: E402
from tokenmill.common.remote import RETRIES  # noqa: E402
from tokenmill.stages.raw import RawSettings, ingest  # noqa: E402
from tokenmill.stages.raw.stream import open_regular  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
WORDS = "the of and to in is was for on that with by as at from his her an which be this are were or had".split()
FILE_MB = 16  # the corpus in files of this size: several objects per format, as a real prefix holds


def documents(rng: random.Random, n_bytes: int) -> list[str]:
    out, total = [], 0
    while total < n_bytes:
        text = " ".join(rng.choices(WORDS, k=rng.randint(80, 400)))
        out.append(text)
        total += len(text) + 20
    return out


def build(folder: Path, mb: int, seed: int = 0) -> dict[str, list[Path]]:
    """--mb of each format, in FILE_MB files: {format: files}."""
    rng, files = random.Random(seed), {"jsonl": [], "jsonl.zst": [], "parquet": []}
    for i in range(max(1, mb // FILE_MB)):
        docs = documents(rng, FILE_MB << 20)
        lines = "".join(json.dumps({"text": t, "n": j}) + "\n" for j, t in enumerate(docs)).encode()
        (plain := folder / f"jsonl/part-{i:03d}.jsonl").parent.mkdir(parents=True, exist_ok=True)
        plain.write_bytes(lines)
        (packed := folder / f"jsonl.zst/part-{i:03d}.jsonl.zst").parent.mkdir(parents=True, exist_ok=True)
        packed.write_bytes(zstd.compress(lines))
        (table := folder / f"parquet/part-{i:03d}.parquet").parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), table, row_group_size=2000)
        files["jsonl"].append(plain)
        files["jsonl.zst"].append(packed)
        files["parquet"].append(table)
    return files


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / CLOCK_TICKS


def measure(work: Callable[[], object], server_pid: int, repeat: int) -> tuple[float, float, float]:
    """(wall s, CPU s of this process, CPU s of the server): the best of `repeat` runs by CPU."""
    best = (float("inf"), float("inf"), 0.0)
    for _ in range(repeat):
        server0, cpu0, t0 = process_cpu(server_pid), time.process_time(), time.perf_counter()
        work()
        run = (time.perf_counter() - t0, time.process_time() - cpu0, process_cpu(server_pid) - server0)
        best = min(best, run, key=lambda r: r[1])
    return best


def read_all(locations: list[str]) -> None:
    for location in locations:
        with open_regular(location) as f:
            while f.read(1 << 20):
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=64, help="MB of each format (in 16 MB files)")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-s3-"))
    local = work / "source"
    files = build(local, args.mb)
    with s3_server(work / "server") as server:
        os.environ.update(server.env)
        bucket = server.make_bucket("bench")
        client = server.client()
        for paths in files.values():
            for path in paths:
                client.put_object(Bucket=bucket, Key=path.relative_to(local).as_posix(), Body=path.read_bytes())
        print(f"{args.mb} MB of each format in {FILE_MB} MB files; server {server.endpoint}; best of {args.repeat}")
        print(f"{'format':<10} {'what':<8} {'where':<6} {'MB':>6} {'wall s':>7} {'MB/s':>7} {'CPU s':>6} "
              f"{'MB/CPU-s':>9} {'server CPU-s':>13}")  # fmt: skip
        for kind, paths in files.items():
            size = sum(p.stat().st_size for p in paths) / 1e6
            urls = [f"s3://{bucket}/{p.relative_to(local).as_posix()}" for p in paths]
            local_files = [str(p) for p in paths]
            cases = (
                ("read", "local", partial(read_all, local_files)),
                ("read", "s3", partial(read_all, urls)),
                ("ingest", "local", partial(ingest, local / kind, work / "out-local", RawSettings(), workers=1)),
                ("ingest", "s3", partial(ingest, f"s3://{bucket}/{kind}/", work / "out-s3", RawSettings(), workers=1)),
            )
            for what, where, run in cases:
                wall, cpu, served = measure(run, server.process.pid, args.repeat)
                print(f"{kind:<10} {what:<8} {where:<6} {size:>6.0f} {wall:>7.2f} {size / wall:>7.1f} "
                      f"{cpu:>6.2f} {size / cpu:>9.1f} {served:>13.2f}")  # fmt: skip
        print(f"transient errors retried: {RETRIES.retried}")


if __name__ == "__main__":
    main()
