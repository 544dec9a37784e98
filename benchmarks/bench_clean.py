"""Cleaning benchmark: records/s, MB/s and each rule's share of the time, against the reference's 01_clean.

usage: python benchmarks/bench_clean.py [--records 300000] [--workers 1 2] [--skip-poetry] [--skip-generated]
                                        [--contracts]

1. ../shared/corpora/chinese-poetry, read once with tokenmill.stages.raw.ingest (not timed), then clean_corpus with
   each worker count. Baseline measured in the same run: the reference's stage 1 (seed_reference.stage_clean: NFKC,
   control characters, annotations, bad-character and length filters, title/author), single process, on the same
   folders. The reference does no mojibake repair, no boilerplate detection, no repetition filter.
2. A generated corpus (--records, ~650 bytes each: Chinese verse and English prose lines drawn from a pool of
   100k lines, so thousands of lines recur across documents at random positions and the boilerplate detector has
   real candidates; 2% planted header/footer boilerplate, 0.5% mojibake, 0.5% garbage), written straight as
   raw_records shards of 50k records.
3. --contracts: materializes raw_records + cleaned_jsonl on chinese-poetry with Dagster into a temporary data
   root and runs ../shared/tools/check_contracts.py on it (records in = out + rejected).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tokenmill.common.io import dumps, record_id, record_shards  # noqa: E402
from tokenmill.stages.clean import CleanResult, CleanSettings, clean_corpus  # noqa: E402

SHARED = REPO.parent / "shared"
POETRY = SHARED / "corpora" / "chinese-poetry"
REFERENCE = SHARED / "reference" / "seed_reference.py"
PER_SHARD = 50_000


def cpu() -> float:
    """CPU seconds of this process and its finished children: steadier than wall time on a shared machine."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def shard_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in record_shards(folder))


def report(name: str, result: CleanResult, seconds: float, mb: float, cpu_s: float) -> None:
    n = result.docs_in
    print(
        f"  {name}: {n:,} records in {seconds:.2f} s = {n / seconds:,.0f} records/s, {mb / seconds:.1f} MB/s "
        f"(CPU {cpu_s:.2f} s = {cpu_s / n * 1e6:.0f} us/record); "
        f"out {result.docs_out:,}, rejected {result.rejected_by_reason}, "
        f"boilerplate lines stripped {result.boilerplate['lines_stripped']:,} "
        f"({result.boilerplate['candidates']:,} candidates)"
    )
    print(f"    wall per pass: {result.pass_seconds}")
    shares = sorted(result.rule_time_share.items(), key=lambda kv: -kv[1])
    print("    time per rule: " + ", ".join(f"{k} {v:.0%}" for k, v in shares if v >= 0.005))


def run_clean(raw: Path, tmp: Path, workers: list[int], name: str) -> dict:
    mb = shard_bytes(raw) / 1e6
    times = {}
    for w in workers:
        out = tmp / f"clean-{name}-{w}"
        shutil.rmtree(out, ignore_errors=True)
        t0, c0 = time.perf_counter(), cpu()
        result = clean_corpus(raw, out, CleanSettings(), workers=w)
        times[w] = time.perf_counter() - t0
        report(f"workers={w}", result, times[w], mb, cpu() - c0)
        assert result.docs_in == result.docs_out + result.rejected
    return times


def reference_clean(tmp: Path) -> float | None:
    if not REFERENCE.exists():
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("seed_reference", REFERENCE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    dirs = [str(p) for p in sorted(POETRY.iterdir()) if p.is_dir()]
    t0, c0 = time.perf_counter(), cpu()
    s = mod.stage_clean(dirs, tmp / "ref_01_cleaned.jsonl")
    sec, cpu_s = time.perf_counter() - t0, cpu() - c0
    print(
        f"  reference 01_clean: {s['raw']:,} records in {sec:.2f} s = {s['raw'] / sec:,.0f} records/s "
        f"(CPU {cpu_s:.2f} s = {cpu_s / s['raw'] * 1e6:.0f} us/record) "
        f"(kept {s['clean']:,}, dropped {s['clean_drop_reasons']})"
    )
    return sec


# ---------------------------------------------------------------------------------------------- generated corpus

CJK = (
    "春花秋月何时了往事知多少小楼昨夜又东风故国不堪回首明中雕栏玉砌应犹在只是朱颜改问君能有几愁恰似一江水向流"
    "山高云淡风轻雪落江南柳绿桃红夜雨孤灯长安古道西风瘦马夕阳天涯断肠人在行舟远帆归雁青松白鹤碧水寒烟"
)
WORDS = (
    "the of and a to in is was he for it with as his on be at by had not are but from or have an they which one "
    "you were her all she there would their we him been has when who will more no if out so said what up its "
    "river moon spring wind mountain Transformer attention cloud lantern bridge willow harbor garden winter "
    "model data training token window cluster village market letter morning evening silver quiet ancient"
).split()
HEADERS = ["Copyright © 2024 Example Press | All rights reserved", "【本文来自网络 | 转载请注明出处】"]
FOOTERS = ["Read more at https://example.com/poems", "更多精彩内容，请关注公众号「诗词日报」"]


def _pool(rng: random.Random, n: int) -> list[str]:
    pool = []
    for i in range(n):
        if i % 2:
            a = "".join(rng.choice(CJK) for _ in range(7))
            b = "".join(rng.choice(CJK) for _ in range(7))
            pool.append(f"{a}，{b}。")
        else:
            words = [rng.choice(WORDS) for _ in range(rng.randint(8, 22))]
            pool.append(" ".join(words).capitalize() + ".")
    return pool


def generate(raw: Path, records: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    pool = _pool(rng, 100_000)
    raw.mkdir(parents=True, exist_ok=True)
    f = None
    for i in range(records):
        if i % PER_SHARD == 0:
            if f:
                f.close()
            f = open(raw / f"part-{i // PER_SHARD:05d}.jsonl", "w", encoding="utf-8")
        lines = rng.sample(pool, rng.randint(3, 9))
        r = rng.random()
        if r < 0.01:
            lines.insert(0, HEADERS[i % 2])
        elif r < 0.02:
            lines.append(FOOTERS[i % 2])
        text = "\n".join(lines)
        r = rng.random()
        if r < 0.005:
            text = text.encode("utf-8").decode("latin-1")
        elif r < 0.01:
            text = rng.choice(["", "\ufffd" * 40, "buy now " * 60, "ok"])
        rid = record_id("generated.jsonl", line=i + 1)
        f.write(
            dumps({"id": rid, "text": text, "meta": {"n": i}, "source": {"path": "generated.jsonl", "line": i + 1}})
        )
        f.write("\n")
    if f:
        f.close()


# ---------------------------------------------------------------------------------------------- contracts


def contracts(tmp: Path) -> None:
    data = tmp / "data"
    code = (
        "import dagster as dg\n"
        "from assets.raw import raw_records\nfrom assets.clean import cleaned_jsonl\n"
        "from resources import Compute, CorpusSource, DataRoot\n"
        "r = dg.materialize([raw_records, cleaned_jsonl], resources={'compute': Compute(), "
        f"'source': CorpusSource(path={str(POETRY)!r}), 'data_root': DataRoot(root={str(data)!r})}})\n"
        "print('materialize success:', r.success)\n"
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    print(f"  materialized raw_records + cleaned_jsonl in {time.perf_counter() - t0:.1f} s (incl. Dagster start)")
    stats = json.loads((data / "cleaned_jsonl" / "_stats.json").read_text(encoding="utf-8"))
    print(f"  cleaned_jsonl: in {stats['docs_in']:,} = out {stats['docs_out']:,} + rejected {stats['rejected']:,}")
    subprocess.run([sys.executable, str(SHARED / "tools" / "check_contracts.py"), str(data)], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000, help="records of the generated corpus")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--skip-poetry", action="store_true")
    ap.add_argument("--skip-generated", action="store_true")
    ap.add_argument("--contracts", action="store_true", help="also materialize with Dagster and run check_contracts.py")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_clean-"))
    try:
        if not args.skip_poetry and POETRY.is_dir():
            from tokenmill.stages.raw import ingest

            print(f"chinese-poetry ({POETRY})")
            ingest(POETRY, tmp / "poetry_raw")
            ref = reference_clean(tmp)
            times = run_clean(tmp / "poetry_raw", tmp, args.workers, "poetry")
            if ref:
                print("  vs reference 01_clean: " + ", ".join(f"workers={w} {ref / t:.1f}x" for w, t in times.items()))
        if not args.skip_generated:
            t0 = time.perf_counter()
            generate(tmp / "gen_raw", args.records)
            print(
                f"generated corpus: {args.records:,} records, {shard_bytes(tmp / 'gen_raw') / 1e6:.0f} MB "
                f"(written in {time.perf_counter() - t0:.1f} s)"
            )
            run_clean(tmp / "gen_raw", tmp, args.workers, "generated")
        if args.contracts and POETRY.is_dir():
            print("contracts on chinese-poetry")
            contracts(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import resource

    print(
        f"peak RSS: this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, "
        f"largest worker {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB"
    )
    print(
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: other work on the machine slows "
        "every figure)"
    )


if __name__ == "__main__":
    main()
