"""Decontamination and PII masking benchmark: cleaned_jsonl's time with and without a 10,000-item evaluation set
(the budget: at most +20%), the index build, and with PII masking on vs off.

usage: python benchmarks/bench_decontam.py [--items 10000] [--records 100000] [--workers 2] [--repeat 2]
                                           [--skip-poetry] [--skip-generated]

Corpora: ../shared/corpora/chinese-poetry read once with raw_records' ingest (not timed), and bench_clean's
generated corpus (--records; Chinese verse and English prose lines). Evaluation set (JSONL, field `question`): half
English items of 30-60 words, half Chinese items of 60-120 characters, drawn from the same vocabularies as the
generated corpus, plus 100 records of each corpus copied in (so the check finds, drops and reports real hits).
The configurations run in turn, --repeat rounds; each one's best counts. With --workers 1 (the default) the stage
runs in this process and the figures are its CPU seconds (the machine is shared: wall time varies with the other
work on it).
"cold" builds the index (cache emptied first), "warm" reuses it, as every run after the first does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_clean import CJK, POETRY, WORDS, generate  # noqa: E402

from tokenmill.common.io import iter_jsonl, record_shards  # noqa: E402
from tokenmill.stages.clean import CleanResult, CleanSettings, clean_corpus  # noqa: E402
from tokenmill.stages.clean.decontam import CACHE_DIR  # noqa: E402

PLANTED = 100  # corpus records copied into the evaluation set


def eval_set(path: Path, raw: Path, items: int, seed: int = 5) -> None:
    rng = random.Random(seed)
    rows = []
    for i in range(items - PLANTED):
        if i % 2:
            rows.append("".join(rng.choice(CJK) for _ in range(rng.randint(60, 120))))
        else:
            rows.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 60))).capitalize() + "?")
    texts = [r["text"] for shard in record_shards(raw) for r in iter_jsonl(shard)]
    rows += rng.sample([t for t in texts if len(t) >= 60], PLANTED)
    rng.shuffle(rows)
    path.write_text("".join(json.dumps({"question": q}, ensure_ascii=False) + "\n" for q in rows), encoding="utf-8")


def cpu() -> float:
    """CPU seconds of this process (the stage runs in it with --workers 1): steadier than wall time on a shared
    machine, where other work stretches every wall figure."""
    t = os.times()
    return t.user + t.system


def timed(raw: Path, out: Path, settings: CleanSettings, workers: int) -> tuple[float, CleanResult]:
    shutil.rmtree(out, ignore_errors=True)
    t0, c0 = time.perf_counter(), cpu()
    result = clean_corpus(raw, out, settings, workers=workers)
    return (cpu() - c0 if workers == 1 else time.perf_counter() - t0), result


def bench(name: str, raw: Path, tmp: Path, args) -> None:
    evals = tmp / f"{name}-eval.jsonl"
    eval_set(evals, raw, args.items)
    out = tmp / "work" / "out"
    cache = tmp / "work" / CACHE_DIR
    plain = CleanSettings()
    with_eval = CleanSettings(decontaminate=[str(evals)])
    no_pii_settings = CleanSettings(pii_mask=False)
    times: dict[str, list[float]] = {"base": [], "cold": [], "warm": [], "no_pii": []}
    for _ in range(args.repeat):  # interleaved, so a slow spell of the machine hits every configuration
        t, stats = timed(raw, out, plain, args.workers)
        times["base"].append(t)
        shutil.rmtree(cache, ignore_errors=True)
        times["cold"].append(timed(raw, out, with_eval, args.workers)[0])
        t, dstats = timed(raw, out, with_eval, args.workers)
        times["warm"].append(t)
        times["no_pii"].append(timed(raw, out, no_pii_settings, args.workers)[0])
    base, cold, warm, no_pii = (min(times[k]) for k in ("base", "cold", "warm", "no_pii"))
    (report,) = dstats.decontamination["files"]
    unit = "CPU s (in-process)" if args.workers == 1 else "s wall"
    print(f"{name}: {stats.docs_in:,} records, workers={args.workers}, best of {args.repeat}, in {unit}")
    print(f"  cleaned_jsonl without decontamination: {base:.2f} s")
    print(
        f"  with {report['items']:,} evaluation items ({report['ngrams']:,} n-grams, "
        f"{report['items_too_short']} items too short): warm {warm:.2f} s = {warm / base - 1:+.1%} "
        f"(budget +20%), cold (index built) {cold:.2f} s = {cold / base - 1:+.1%}"
    )
    own = dstats.rule_seconds["decontaminate"]
    print(
        f"    records hit {report['hits']} ({PLANTED} planted); the decontaminate rule's own time {own:.2f} s = "
        f"{own / (sum(dstats.rule_seconds.values()) - own):+.1%} on the stage's other rules (same run)"
    )
    print(
        f"  PII masking: on {base:.2f} s vs off {no_pii:.2f} s = {base / no_pii - 1:+.1%} "
        f"(mask_pii rule {stats.rule_seconds['mask_pii']:.3f} s worker time); masked: email "
        f"{stats.pii['email']}, ip {stats.pii['ip_address']} in {stats.docs_pii_masked} records"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--records", type=int, default=100_000, help="records of the generated corpus")
    ap.add_argument("--workers", type=int, default=1, help="1: in-process, timed in CPU seconds; more: wall time")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-poetry", action="store_true")
    ap.add_argument("--skip-generated", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_decontam-"))
    try:
        if not args.skip_poetry and POETRY.is_dir():
            from tokenmill.stages.raw import ingest

            ingest(POETRY, tmp / "poetry_raw")
            bench("chinese-poetry", tmp / "poetry_raw", tmp, args)
        if not args.skip_generated:
            generate(tmp / "gen_raw", args.records)
            bench("generated", tmp / "gen_raw", tmp, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
