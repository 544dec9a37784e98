"""Dedup benchmark: accuracy against brute-force exact Jaccard, and speed and memory against datasketch.

usage: python benchmarks/bench_dedup.py [--poetry-sample 20000] [--docs 100000] [--skip-demo] [--workers 2]

1. Accuracy. On the demo corpus (demo_corpus/source if present, read with tokenmill.stages.raw.ingest) and on a
   sample of ../shared/corpora/chinese-poetry (Tang poems and ci sharing a title or (author, tune), all of
   宋词三百首: enriched with real cross-file duplicates), the ground truth is every pair of distinct keys with
   exact Jaccard >= threshold at the pair's shingle code (size, and words or characters: DedupSettings.shingles,
   pair_codes), computed brute force (sparse shingle-incidence products, all pairs of keys in the same unit).
   Reported: precision and recall of the stage's verified near-duplicate pairs, and of datasketch's LSH candidates
   (MinHash.bulk + MinHashLSH with its default bands for the threshold) on the same documents, each shingled at its
   own code.
2. Speed, on synthetic ~200-character documents (random CJK, 10% near copies, 2% exact copies), each side in a
   fresh process: datasketch as a user would (shingle sets of bytes, MinHash.bulk, MinHashLSH with
   insertion_session, a query per document for candidate pairs, one process) against (a) the engine on the
   same keys (shingle hashes, signatures and band hashes in `workers` processes, then banding) and (b) the
   whole stage from JSONL (parse, key, signatures, candidates; build_dedup_report's timings). Ratio, docs/s.
3. Memory: peak RSS of each side's process (and of the stage's worker processes), per million documents,
   extrapolated linearly from --docs (the stage's per-document state is arrays of fixed width, so it is linear).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from proctree import TreeSampler, status_mib  # noqa: E402

from tokenmill.common.io import iter_jsonl, record_id, record_shards  # noqa: E402
from tokenmill.common.parallel import map_ordered  # noqa: E402
from tokenmill.stages.dedup import CLUSTERS_FILE, DedupSettings, build_dedup_report  # noqa: E402
from tokenmill.stages.dedup import minhash as mh  # noqa: E402
from tokenmill.stages.dedup.keys import exact_key  # noqa: E402
from tokenmill.stages.dedup.signatures import shingle_keys  # noqa: E402

POETRY = REPO.parent / "shared" / "corpora" / "chinese-poetry"
DEMO = REPO / "demo_corpus"


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (the pool's workers)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def peak_mib() -> float:
    """Peak RSS of this process (VmHWM: unlike ru_maxrss it is not inherited from the parent at fork/exec)."""
    return status_mib("self", "VmHWM")


def tree_rss() -> TreeSampler:
    """Peak summed RSS of this process plus its worker processes, every 50 ms: the figure a memory budget
    applies to."""
    return TreeSampler(lambda pids: sum(status_mib(p, "VmRSS") for p in [os.getpid(), *pids]), 0.05)


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------


def poetry_sample(limit: int, seed: int = 0) -> list[dict]:
    """Records from chinese-poetry enriched for duplicates by metadata only (never by text): Tang poems whose
    title occurs more than once, ci whose (author, tune) occurs more than once or that are in 宋词三百首."""
    rng = random.Random(seed)
    tang, song = [], []
    for path in sorted((POETRY / "全唐诗").glob("poet.tang.*.json"), key=lambda p: mh.natural_key(p.name)):
        for i, obj in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            tang.append((f"全唐诗/{path.name}", i, obj))
    for path in sorted((POETRY / "宋词").glob("*.json"), key=lambda p: mh.natural_key(p.name)):
        for i, obj in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            song.append((f"宋词/{path.name}", i, obj))

    def text(obj):
        body = obj.get("paragraphs") or obj.get("content") or []
        return "\n".join(body) if isinstance(body, list) else str(body)

    by_title = defaultdict(list)
    for t in tang:
        by_title[t[2].get("title", "")].append(t)
    by_tune = defaultdict(list)
    for s in song:
        by_tune[(s[2].get("author", ""), s[2].get("rhythmic", ""))].append(s)
    anthology = {(s[2].get("author", ""), s[2].get("rhythmic", "")) for s in song if "三百首" in s[0]}
    other_tunes = [g for k, g in sorted(by_tune.items()) if len(g) > 1 and k not in anthology]
    song_groups = [g for k, g in sorted(by_tune.items()) if k in anthology]
    song_groups += rng.sample(other_tunes, k=len(other_tunes))
    tang_groups = [g for _, g in sorted(by_title.items()) if len(g) > 1]
    rng.shuffle(tang_groups)
    chosen = []
    for groups, budget in ((song_groups, int(limit * 0.4)), (tang_groups, limit)):
        for g in groups:
            if len(chosen) >= budget:
                break
            chosen.extend(g[:40])  # cap very common titles (送人, 浣溪沙)
    recs = []
    for path, i, obj in sorted(chosen[:limit], key=lambda t: (mh.natural_key(t[0]), t[1])):
        meta = {k: obj[k] for k in ("title", "rhythmic", "author") if obj.get(k)}
        body = text(obj)
        if body.strip():
            recs.append(
                {"id": record_id(path, index=i), "text": body, "meta": meta, "source": {"path": path, "index": i}}
            )
    return recs


def demo_records(tmp: Path) -> list[dict] | None:
    if not (DEMO / "source").exists():
        return None
    try:
        from tokenmill.stages.raw import ingest
    except ImportError:
        return None
    ingest(DEMO / "source", tmp / "demo_raw")
    return [r for f in record_shards(tmp / "demo_raw") for r in iter_jsonl(f)]


def write_records(folder: Path, recs: list[dict], per_shard: int = 50_000) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(0, len(recs), per_shard):
        with open(folder / f"part-{s // per_shard:05d}.jsonl", "w", encoding="utf-8") as f:
            for r in recs[s : s + per_shard]:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return folder


def synthetic_texts(n: int, seed: int = 0) -> list[str]:
    """~200-character documents of random common CJK characters; 10% near copies (1-4 substitutions of an
    earlier document), 2% exact copies, with punctuation so the key differs from the text."""
    rng = np.random.default_rng(seed)
    alphabet = np.arange(0x4E00, 0x4E00 + 3000, dtype=np.uint32)
    lengths = np.clip(rng.normal(200, 20, n).astype(int), 150, 250)
    texts = []
    for i in range(n):
        u = rng.random()
        if i > 10 and u < 0.10:
            src = list(texts[rng.integers(0, i)])
            for _ in range(int(rng.integers(1, 5))):
                src[int(rng.integers(0, len(src)))] = chr(int(alphabet[rng.integers(0, len(alphabet))]))
            texts.append("".join(src))
        elif i > 10 and u < 0.12:
            texts.append(texts[rng.integers(0, i)])
        else:
            chars = alphabet[rng.integers(0, len(alphabet), lengths[i])]
            body = chars.astype("<u4").tobytes().decode("utf-32-le")
            texts.append("，".join(body[j : j + 7] for j in range(0, len(body), 7)) + "。")
    return texts


# ------------------------------------------------------------------------------------------------
# Accuracy
# ------------------------------------------------------------------------------------------------


def own_codes(units: np.ndarray, by_word: np.ndarray, settings: DedupSettings) -> np.ndarray:
    """Each key's shingle code (minhash.shingle_code) at its own length in its own unit: the code of the pair of it
    with itself, what a user of datasketch would shingle it with."""
    return settings.pair_codes(np.stack([units, units], axis=1), np.stack([by_word, by_word], axis=1))


def key_shingles(key: str, code: int) -> list[str]:
    """The shingles of a key (as shingle_keys returns it) for a shingle code: word or character n-grams."""
    n, by_word = mh.shingle_kind(code)
    return mh.word_shingles(key, n) if by_word else mh.shingles(key, n)


def brute_force_pairs(keys: list[str], units: np.ndarray, by_word: np.ndarray, settings: DedupSettings) -> dict:
    """{(i, j): jaccard} for every pair of the given distinct keys (shingle_keys: keys, their units, whether by
    words) with exact Jaccard >= threshold at the pair's shingle code (its longer key's, DedupSettings.pair_codes),
    by sparse incidence products over all pairs of keys shingled in the same unit."""
    import scipy.sparse as sp

    out = {}
    for code in sorted(set(own_codes(units, by_word, settings)[units > 0].tolist())):
        members = np.flatnonzero((units > 0) & (by_word == mh.shingle_kind(code)[1]))
        vocab: dict[str, int] = {}
        rows, cols = [], []
        sets = [set(key_shingles(keys[d], code)) for d in members.tolist()]
        for i, s in enumerate(sets):
            for g in s:
                rows.append(i)
                cols.append(vocab.setdefault(g, len(vocab)))
        x = sp.csr_matrix((np.ones(len(rows), dtype=np.int32), (rows, cols)), shape=(len(members), len(vocab)))
        size = np.asarray([len(s) for s in sets])
        xt = x.T.tocsr()
        for lo in range(0, len(members), 2000):
            block = (x[lo : lo + 2000] @ xt).tocoo()
            i, j, inter = block.row + lo, block.col, block.data
            m = i < j
            i, j, inter = i[m], j[m], inter[m]
            jac = inter / (size[i] + size[j] - inter)
            m = jac >= settings.threshold - 1e-12
            pairs = np.stack([members[i[m]], members[j[m]]], axis=1)
            at_code = settings.pair_codes(units[pairs], by_word[pairs]) == code
            for (a, b), s in zip(pairs[at_code].tolist(), jac[m][at_code].tolist()):
                out[(a, b)] = s
    return out


def datasketch_candidates(keys: list[str], codes: np.ndarray, settings: DedupSettings) -> tuple[set, float, tuple]:
    """LSH candidate pairs of datasketch for the keys, each shingled at its own code (`codes`, see own_codes)."""
    from datasketch import MinHash, MinHashLSH

    t0 = time.perf_counter()
    sh = [[s.encode("utf-8") for s in set(key_shingles(k, c))] for k, c in zip(keys, codes.tolist())]
    ms = MinHash.bulk(sh, num_perm=settings.num_perm)
    lsh = MinHashLSH(threshold=settings.threshold, num_perm=settings.num_perm)
    with lsh.insertion_session() as session:
        for i, m in enumerate(ms):
            session.insert(i, m)
    pairs = set()
    for i, m in enumerate(ms):
        for j in lsh.query(m):
            if j != i:
                pairs.add((min(i, j), max(i, j)))
    return pairs, time.perf_counter() - t0, (lsh.b, lsh.r)


def accuracy(name: str, recs: list[dict], tmp: Path, settings: DedupSettings, workers: int) -> dict:
    folder = write_records(tmp / f"{name}_in", recs)
    t0 = time.perf_counter()
    result = build_dedup_report(folder, tmp / f"{name}_rep", settings, workers=workers)
    stage_s = time.perf_counter() - t0
    languages = [r["meta"].get("language") if isinstance(r.get("meta"), dict) else None for r in recs]
    keys_all, units_all, by_word_all = shingle_keys([r["text"] for r in recs], settings, languages)
    first: dict[str, int] = {}
    for i, k in enumerate(keys_all):
        if k:
            first.setdefault(exact_key(k), i)
    reps = sorted(first.values())
    pos = {recs[i]["id"]: p for p, i in enumerate(reps)}
    keys = [keys_all[i] for i in reps]
    units, by_word = units_all[reps], by_word_all[reps]
    t0 = time.perf_counter()
    truth = brute_force_pairs(keys, units, by_word, settings)
    truth_s = time.perf_counter() - t0
    found = set()
    for c in iter_jsonl(tmp / f"{name}_rep" / CLUSTERS_FILE):
        for a, b, _ in c["verified_pairs"] + c["linked_pairs"]:
            i, j = pos[a], pos[b]
            found.add((min(i, j), max(i, j)))
    ds_pairs, ds_s, ds_params = datasketch_candidates(keys, own_codes(units, by_word, settings), settings)
    tp = len(found & truth.keys())
    ds_tp = len(ds_pairs & truth.keys())
    return {
        "set": name,
        "records": len(recs),
        "distinct_keys": len(keys),
        "true_pairs": len(truth),
        "tokenmill": {
            "found": len(found),
            "precision": tp / len(found) if found else 1.0,
            "recall": tp / len(truth) if truth else 1.0,
            "candidates": result.candidate_pairs,
            "rejected_candidates": result.rejected_candidates,
            "exact_removed": result.dropped["exact_duplicate"],
            "near_removed": result.dropped["near_duplicate"],
            "seconds": round(stage_s, 2),
        },
        "datasketch": {
            "bands_rows": ds_params,
            "candidates": len(ds_pairs),
            "precision": ds_tp / len(ds_pairs) if ds_pairs else 1.0,
            "recall": ds_tp / len(truth) if truth else 1.0,
            "seconds": round(ds_s, 2),
        },
        "brute_force_seconds": round(truth_s, 2),
    }


# ------------------------------------------------------------------------------------------------
# Speed and memory (each side in a fresh process)
# ------------------------------------------------------------------------------------------------


def _engine_task(task):
    keys, units, by_word, settings, bands, rows = task
    doc, code = settings.items(units, by_word)
    sig = np.empty((len(doc), settings.num_perm), dtype=np.uint32)
    for c in np.unique(code).tolist():
        sel = np.flatnonzero(code == c)
        h, off = mh.coded_shingle_hashes([keys[d] for d in doc[sel].tolist()], c, settings.shingle_hash)
        sig[sel] = mh.signatures(h, off, settings.num_perm, settings.seed)
    return doc, mh.band_hashes(sig, bands, rows, salt=code.astype(np.uint64))


def child(mode: str, n_docs: int, workers: int, folder: str) -> dict:
    settings = DedupSettings()
    folder = Path(folder)
    if mode == "gen":  # inputs for the measured processes, so their memory is theirs alone
        texts = synthetic_texts(n_docs)
        write_records(
            folder / "in",
            [
                {"id": f"{i:016x}", "text": t, "meta": {}, "source": {"path": "synthetic.jsonl", "line": i + 1}}
                for i, t in enumerate(texts)
            ],
        )
        keys, units, by_word = shingle_keys(texts, settings)
        first: dict[str, int] = {}
        for i, k in enumerate(keys):  # exact level first, as the stage does
            if k:
                first.setdefault(exact_key(k), i)
        reps = sorted(first.values())
        (folder / "keys.txt").write_text("".join(keys[i] + "\n" for i in reps), encoding="utf-8")
        np.savez(folder / "keys.npz", units=units[reps], by_word=by_word[reps])
        return {"mode": mode, "docs": n_docs, "distinct": len(reps)}
    rss0 = rss_mib()
    if mode == "stagemem":  # live Python/numpy allocations of the main process (tracemalloc), not timed
        import tracemalloc

        tracemalloc.start()
        build_dedup_report(folder / "in", folder / f"rep-{time.time_ns()}", settings, workers=workers)
        return {"mode": mode, "docs": n_docs, "traced_peak_mib": tracemalloc.get_traced_memory()[1] / 2**20}
    if mode == "stage":
        t0, c0 = time.perf_counter(), cpu_seconds()
        with tree_rss() as tree:
            result = build_dedup_report(folder / "in", folder / f"rep-{time.time_ns()}", settings, workers=workers)
        total = time.perf_counter() - t0
        tm = result.timings
        return {
            "mode": mode,
            "docs": n_docs,
            "seconds": tm["signatures"] + tm["exact"] + tm["buckets"],
            "total_seconds": total,
            "cpu_seconds_total": cpu_seconds() - c0,
            "candidates": result.candidate_pairs,
            "rss_start_mib": rss0,
            "peak_mib": peak_mib(),
            "tree_peak_mib": tree.peak,
        }
    uniq = (folder / "keys.txt").read_text(encoding="utf-8").split("\n")[:-1]
    with np.load(folder / "keys.npz") as shape:
        units, by_word = shape["units"], shape["by_word"]
    rss0 = rss_mib()
    t0, c0 = time.perf_counter(), cpu_seconds()
    tree = tree_rss().__enter__()
    if mode == "engine":
        bands, rows = settings.band_shape()
        step = (len(uniq) + 2 * workers - 1) // (2 * workers)
        tasks = [
            (uniq[i : i + step], units[i : i + step], by_word[i : i + step], settings, bands, rows)
            for i in range(0, len(uniq), step)
        ]
        docs, bh, base = [], [], 0
        for t, (d, b) in zip(tasks, map_ordered(_engine_task, tasks, workers)):
            docs.append(d + base)
            bh.append(b)
            base += len(t[0])
        members = np.concatenate(docs)
        pairs = [
            mh.bucket_pairs(
                np.concatenate([b[i] for b in bh]), members, settings.max_bucket, settings.bucket_neighbours
            )[0]
            for i in range(bands)
        ]
        n_pairs = len(mh.unique_pairs(np.concatenate(pairs)))
    else:
        pairs, _, _ = datasketch_candidates(uniq, own_codes(units, by_word, settings), settings)
        n_pairs = len(pairs)
    seconds = time.perf_counter() - t0
    tree.__exit__()
    return {
        "mode": mode,
        "docs": len(uniq),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds() - c0,
        "candidates": n_pairs,
        "rss_start_mib": rss0,
        "peak_mib": peak_mib(),
        "tree_peak_mib": tree.peak,
    }


def run_child(mode: str, n_docs: int, workers: int, folder: Path) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--_child",
            mode,
            "--docs",
            str(n_docs),
            "--workers",
            str(workers),
            "--_dir",
            str(folder),
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"{mode} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--poetry-sample", type=int, default=20000)
    ap.add_argument("--docs", type=int, default=100_000, help="synthetic documents for speed and memory")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--_child")
    ap.add_argument("--_dir")
    args = ap.parse_args()
    if args._child:
        print(json.dumps(child(args._child, args.docs, args.workers, args._dir)))
        return

    settings = DedupSettings()
    print(
        f"threshold {settings.threshold}, {settings.num_perm} permutations, bands x rows {settings.band_shape()}, "
        f"workers {args.workers}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sets = []
        if not args.skip_demo:
            demo = demo_records(tmp)
            if demo is not None:
                sets.append(("demo_corpus", demo))
            else:
                print("demo corpus: not present (python -m devtools.demo demo_corpus), skipped")
        if POETRY.exists() and args.poetry_sample > 0:
            sets.append(("chinese-poetry", poetry_sample(args.poetry_sample)))
        print("\n== accuracy: near-duplicate pairs vs brute-force exact Jaccard ==")
        for name, recs in sets:
            r = accuracy(name, recs, tmp, settings, args.workers)
            t, d = r["tokenmill"], r["datasketch"]
            print(
                f"{name}: {r['records']} records, {r['distinct_keys']} distinct keys, {r['true_pairs']} true pairs "
                f"(brute force {r['brute_force_seconds']} s)"
            )
            print(
                f"  tokenmill : precision {t['precision']:.4f} recall {t['recall']:.4f} ({t['found']} pairs; "
                f"{t['candidates']} candidates, {t['rejected_candidates']} rejected by verification; removed "
                f"{t['exact_removed']} exact + {t['near_removed']} near; {t['seconds']} s)"
            )
            print(
                f"  datasketch: precision {d['precision']:.4f} recall {d['recall']:.4f} ({d['candidates']} LSH "
                f"candidates, bands x rows {d['bands_rows']}, unverified; {d['seconds']} s)"
            )
    if args.skip_speed:
        return
    print(f"\n== speed and memory: {args.docs:,} synthetic ~200-character documents, each side in a fresh process ==")
    with tempfile.TemporaryDirectory() as tmp:
        gen = run_child("gen", args.docs, 1, Path(tmp))
        ds = run_child("datasketch", args.docs, 1, Path(tmp))
        en = run_child("engine", args.docs, args.workers, Path(tmp))
        st = run_child("stage", args.docs, args.workers, Path(tmp))
        sm = run_child("stagemem", args.docs, args.workers, Path(tmp))
    print(
        f"{gen['docs']:,} documents, {gen['distinct']:,} distinct keys (signatures and candidates are computed for "
        f"distinct keys on both sides; docs/s below counts all documents)"
    )
    for r in (ds, en):
        r["docs"] = args.docs
    per_m = 1e6 / args.docs
    for r, label in (
        (ds, "datasketch (MinHash.bulk + MinHashLSH insertion_session + query), 1 process"),
        (en, f"tokenmill engine from keys, {args.workers} workers"),
        (st, f"tokenmill stage from JSONL (parse + key + signatures + candidates), {args.workers} workers"),
    ):
        grown = r["peak_mib"] - r["rss_start_mib"]
        print(
            f"{label}:\n  {r['seconds']:.2f} s, {r['docs'] / r['seconds']:,.0f} docs/s, {r['candidates']:,} "
            f"candidate "
            f"pairs; main process peak RSS {r['peak_mib']:.0f} MiB (+{grown:.0f} MiB over its start: "
            f"~{grown * per_m / 1024:.2f} GiB per million docs); main + workers peak {r['tree_peak_mib']:.0f} MiB"
        )
    print(
        f"stage main process, live allocations (tracemalloc) peak: {sm['traced_peak_mib']:.0f} MiB "
        f"(~{sm['traced_peak_mib'] * per_m / 1024:.2f} GiB per million docs, linear extrapolation; the ~30 MiB of "
        f"one input chunk read in the main process does not grow with the corpus)"
    )
    print(
        f"\nspeed-up, signatures + candidate pairs (wall clock): engine {ds['seconds'] / en['seconds']:.1f}x, "
        f"whole stage step {ds['seconds'] / st['seconds']:.1f}x (datasketch {ds['seconds']:.1f} s)"
    )
    print(
        f"CPU time (all processes; robust to other load on the machine): datasketch {ds['cpu_seconds']:.1f} s, "
        f"engine {en['cpu_seconds']:.1f} s -> {ds['cpu_seconds'] / en['cpu_seconds']:.1f}x less CPU"
    )
    print(
        f"stage build_dedup_report total (incl. verification, clusters, report): {st['total_seconds']:.1f} s wall, "
        f"{st['cpu_seconds_total']:.1f} s CPU; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
