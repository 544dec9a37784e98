#!/usr/bin/env python3
"""tokenmill against datatrove, side by side in one run: read, exact + near dedup, tokenize; wall and CPU seconds of
each process tree, GB of input per core-hour, peak memory, records out, and near-duplicate removal against an exact
ground truth.

usage: python benchmarks/bench_peers.py [--docs N] [--source DIR] [--workers 2]
                                        [--dt-ngrams 2] [--dt-buckets 20] [--dt-hashes 5] [--dt-words] [--dt-extract]
                                        [--dt-filters]
                                        [--tm-bands B --tm-rows R] [--tm-clusters star] [--skip-truth]
The input is a chinese-poetry corpus of about --docs poems (benchmarks/poetry_corpus.py builds it: the Tang and Song
files, then renamed Tang copies; below the ~79k poems of those files, a spread of whole files), or --source.
- tokenmill: `tokenmill update` on a fresh data root (read, clean, exact + near dedup with its defaults, BPE training,
  tokenization; its Dagster start-up included), one process tree.
- datatrove: its four MinHash steps (signatures, buckets, clusters, filter) and DocumentTokenizer, in a process of its
  own (LocalPipelineExecutor, --workers processes), reading tokenmill's cleaned_jsonl (the same cleaned records:
  datatrove does neither the raw read nor the cleaning, so its side of the work is the smaller) and tokenizing with
  the tokenizer.json tokenmill trained. Its shingles are characters ("words" of a custom WordTokenizer: datatrove's
  zh tokenizer needs jieba, and word n-grams of poems miss most character-level near copies), --dt-ngrams long.
  The default, 2-character shingles in 20 buckets of 5 hashes, had the best recall of the seven shapes tried on the
  80k-poem corpus (each shape's recall and precision: docs/profile.md, 'Run of 2026-12-02 at 2271b04').
A web source (WARC files): with --dt-words datatrove shingles English words (its spaCy tokenizer; the character
shingles are for poems), and with --dt-extract it also reads the WARC files and extracts their text (WarcReader +
Trafilatura, output unused), the work of tokenmill's raw_records there, so "the same work" stays the same. With
--dt-filters the extracted text also goes through FineWeb's four quality filters (datatrove's Gopher repetition,
Gopher quality, C4 and FineWeb filters, as benchmarks/bench_quality.py builds them; output unused), and the
same-work line adds tokenmill's whole cleaned_jsonl to its side (which does more: repairs, language identification,
boilerplate, PII, decontamination).
Both sides' CPU seconds are user + sys of the process and every descendant it waited for; memory is sampled every
0.1 s (bench_graph.run_measured). GB per core-hour divides the source corpus's bytes by both sides' CPU hours.
Ground truth: every pair of cleaned records with the same exact key, or with exact Jaccard >= tokenmill's threshold
of their shingle sets at the pair's shingle code (tokenmill's definition: character 2/3/5-grams by the longer key's
length), found by an exact prefix-filter join; its connected components C each hold |C| - 1 removable duplicates.
A side's removals R are scored keeper-agnostically: correct = sum over C of min(|R & C|, |C| - 1);
recall = correct / sum(|C| - 1), precision = correct / |R|. "Pairs left" counts the truth's direct pairs (same key,
or Jaccard >= the threshold) whose two records are both kept: the near duplicates still in the output. A component
can be fully resolved with more than one record kept (a chain A ~ B ~ C, A and C below the threshold: removing B
leaves no pair), which recall counts as a miss and pairs left does not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_graph import BATCH, REPO, Measured, run_measured, stage_table  # noqa: E402
from bench_quality import datatrove_filters  # noqa: E402
from bench_scale import run_update, step_intervals  # noqa: E402
from poetry_corpus import SONG, TANG, build  # noqa: E402

from tokenmill.common import disk  # noqa: E402
from tokenmill.common.io import iter_jsonl, read_json  # noqa: E402
from tokenmill.stages.dedup import DedupSettings  # noqa: E402
from tokenmill.stages.dedup import minhash as mh  # noqa: E402
from tokenmill.stages.dedup.keys import exact_key  # noqa: E402
from tokenmill.stages.dedup.signatures import shingle_keys  # noqa: E402

# tokenmill's steps that do what datatrove's pipeline does here (read, exact + near dedup, tokenize): not clean (it
# reads tokenmill's cleaned records), BPE training, the funnel or Dagster's start-up; tokenized_bins' checks stay in
SAME_WORK_STEPS = ("raw_records", "dedup_report", "deduped_jsonl", "tokenized_bins")
JOIN_PAIRS = 20_000_000  # candidate pairs generated at once by the ground truth's join (two int64 arrays)
VERIFY_SHINGLES = 20_000_000  # shingles of the candidate pairs gathered at once for their exact intersections

# ------------------------------------------------------------------------------------------------
# Input
# ------------------------------------------------------------------------------------------------


def corpus(folder: Path, docs: int) -> int:
    """About `docs` poems in `folder`: build() at or above the Tang + Song files' size, else whole Tang and Song files
    taken at an even stride (both collections, and Tang's cross-file duplicates, stay represented)."""
    files = TANG + SONG
    sizes = [len(json.loads(f.read_text(encoding="utf-8"))) for f in files]
    if docs >= sum(sizes):
        return build(folder, docs)
    folder.mkdir(parents=True, exist_ok=True)
    share = max(1, round(len(files) * docs / sum(sizes)))
    count = 0
    for i in np.linspace(0, len(files) - 1, share).round().astype(int).tolist():
        (folder / files[i].name).write_bytes(files[i].read_bytes())
        count += sizes[i]
    return count


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------------
# datatrove (run in a child process of its own: `--_datatrove CONFIG.json`)
# ------------------------------------------------------------------------------------------------


def run_datatrove(cfg: dict) -> None:
    """datatrove's four MinHash steps, then its DocumentTokenizer on the records kept, as its examples chain them."""
    import xxhash
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig
    from datatrove.utils.word_tokenizers import WordTokenizer

    class CharTokenizer(WordTokenizer):
        """Every non-space character a word: n-grams of it are character n-grams."""

        def word_tokenize(self, text: str) -> list[str]:
            return [c for c in text if not c.isspace()]

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    work, tasks, workers = Path(cfg["work"]), cfg["tasks"], cfg["workers"]
    config = MinhashConfig(
        n_grams=cfg["ngrams"],
        num_buckets=cfg["buckets"],
        hashes_per_bucket=cfg["hashes"],
        hash_config=HashConfig(precision=64),
    )

    def reader():
        return JsonlReader(cfg["input"], glob_pattern="part-*.jsonl", compression=None)

    def execute(pipeline, name, n_tasks):
        # fork, not datatrove's default forkserver: the pool's workers are then this process's children, waited for,
        # so their CPU seconds reach the rusage the benchmark reads
        LocalPipelineExecutor(
            pipeline=pipeline,
            tasks=n_tasks,
            workers=min(workers, n_tasks),
            logging_dir=str(work / "logs" / name),
            start_method="fork",
        ).run()

    if cfg["extract"]:  # the web read tokenmill's raw_records does: WARC records -> main text (not used further)
        from datatrove.pipeline.extractors import Trafilatura
        from datatrove.pipeline.readers import WarcReader

        warc = WarcReader(cfg["extract"], glob_pattern="**/*.warc.gz", recursive=True)
        filters = list(datatrove_filters().values()) if cfg["filters"] else []
        execute(
            [warc, Trafilatura(), *filters, JsonlWriter(str(work / "extracted"), compression=None)], "extract", tasks
        )
    # words: datatrove's own English word tokenizer (spaCy), for web text; else characters, for poems
    signature = MinhashDedupSignature(str(work / "sigs"), config, language="en" if cfg["words"] else CharTokenizer())
    # datatrove 0.10 hashes shingles as str, which xxhash 4 (in this venv for datasets) refuses; xxhash 3, which
    # datatrove pins, encoded them as UTF-8 itself: the same here
    signature._hash_func = lambda shingle: xxhash.xxh64_intdigest(shingle.encode("utf-8"))
    execute([reader(), signature], "sigs", tasks)
    execute(
        [MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=config)], "buckets", config.num_buckets
    )
    execute([MinhashDedupCluster(str(work / "buckets"), str(work / "remove_ids"), config=config)], "clusters", 1)
    execute(
        [
            reader(),
            MinhashDedupFilter(
                str(work / "remove_ids"), exclusion_writer=JsonlWriter(str(work / "removed"), compression=None)
            ),
            # shuffle_documents=False: tokenmill's shards keep record order too (its loader shuffles)
            DocumentTokenizer(str(work / "tokens"), cfg["tokenizer"], eos_token=cfg["eos"], shuffle_documents=False),
        ],
        "filter_tokenize",
        tasks,
    )


def datatrove_outputs(work: Path) -> tuple[set[str], int]:
    """(ids datatrove removed, tokens it wrote: the count on the second line of each token file's .metadata)."""
    removed = {r["id"] for f in sorted((work / "removed").glob("*.jsonl")) for r in iter_jsonl(f)}
    tokens = sum(int(f.read_text().split("\n")[1]) for f in (work / "tokens").rglob("*.ds.metadata"))
    return removed, tokens


def datatrove_steps(work: Path) -> list[str]:
    """Each datatrove step's seconds summed over its tasks (its stats.json; wall inside the tasks, so on a loaded
    machine above the CPU seconds they used)."""
    lines = []
    for run in ("extract", "sigs", "buckets", "clusters", "filter_tokenize"):
        stats = work / "logs" / run / "stats.json"
        for step in json.loads(stats.read_text()) if stats.exists() else []:
            total = (step.get("time_stats") or {}).get("total", 0.0)
            name = " ".join(step["name"].encode("ascii", "ignore").decode().split()).lstrip("- ")  # no emoji
            lines.append(f"  {run:16s} {name:26s} {total:7.1f}")
    return lines


# ------------------------------------------------------------------------------------------------
# Ground truth
# ------------------------------------------------------------------------------------------------


def token_ids(sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, offsets): each set's shingles as dense integer ids (the same shingle, the same id), concatenated."""
    lengths = np.fromiter((len(s) for s in sets), dtype=np.int64, count=len(sets))
    offsets = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    _, ids = np.unique(np.concatenate(sets) if sets else np.empty(0), return_inverse=True)
    return ids.astype(np.int64), offsets


def numeric_sets(sets: list[np.ndarray]) -> list[np.ndarray]:
    """Word shingle sets (str arrays) as int64 ids, one per distinct shingle, exactly. Concatenated, str arrays take
    the width of the longest shingle of all for every shingle: tens of GB on 50,000 web pages (docs/profile.md,
    'Runs of 2026-12-04 (third session): recall at the default, a second look, web quality measured')."""
    if not any(x.dtype.kind == "U" for x in sets):
        return sets
    vocab: dict[str, int] = {}
    return [np.fromiter((vocab.setdefault(w, len(vocab)) for w in x.tolist()), np.int64, len(x)) for x in sets]


def similar_pairs(sets: list[np.ndarray], threshold: float) -> np.ndarray:
    """Every pair (i < j) of the shingle sets with exact Jaccard >= threshold: a prefix-filter join (shingles ordered
    rarest first; two sets at the threshold share one of their first |x| - ceil(t |x|) + 1), then exact
    intersections of the candidates."""
    import scipy.sparse as sp

    ids, offsets = token_ids(sets)
    n, size = len(sets), np.diff(offsets)
    doc = np.repeat(np.arange(n), size)
    rank = np.argsort(np.argsort(np.bincount(ids), kind="stable"), kind="stable")  # rarest first, then by id
    order = np.lexsort((rank[ids], doc))
    ranked, position = rank[ids][order], np.arange(len(ids)) - np.repeat(offsets[:-1], size)
    prefix = size - np.ceil(threshold * size - 1e-9).astype(np.int64) + 1
    keep = position < np.repeat(prefix, size)
    tok, pdoc = ranked[keep], doc[keep]
    by_tok = np.lexsort((pdoc, tok))
    tok, pdoc = tok[by_tok], pdoc[by_tok]
    group_end = np.searchsorted(tok, tok, side="right")  # each entry pairs with the later entries of its token
    partners = group_end - np.arange(len(tok)) - 1
    rows = sp.csr_matrix((np.ones(len(ids), dtype=np.int32), ids, offsets), shape=(n, int(ids.max(initial=-1)) + 1))
    found, start = [], 0
    ends = np.cumsum(partners)
    while start < len(tok):
        stop = max(int(np.searchsorted(ends, (ends[start - 1] if start else 0) + JOIN_PAIRS, side="right")), start + 1)
        entry = np.arange(start, stop)
        count = partners[start:stop]
        first = np.repeat(entry, count)
        second = first + 1 + np.arange(len(first)) - np.repeat(np.cumsum(count) - count, count)
        a, b = pdoc[first], pdoc[second]
        pairs = np.unique(np.minimum(a, b) * n + np.maximum(a, b))
        a, b = pairs // n, pairs % n
        big, small = np.maximum(size[a], size[b]), np.minimum(size[a], size[b])
        fits = small >= threshold * big - 1e-9
        a, b = a[fits], b[fits]
        # batches of bounded shingles, not pairs: web pages hold thousands of shingles each
        spent = np.cumsum(size[a] + size[b])
        cuts = np.searchsorted(spent, np.arange(VERIFY_SHINGLES, spent[-1] if len(spent) else 0, VERIFY_SHINGLES))
        for x, y in zip(np.split(a, cuts), np.split(b, cuts)):
            inter = np.asarray(rows[x].multiply(rows[y]).sum(axis=1)).ravel()
            ok = inter >= threshold * (size[x] + size[y] - inter) - 1e-9
            found.append(np.stack([x[ok], y[ok]], axis=1))
        start = stop
    out = np.concatenate(found) if found else np.empty((0, 2), dtype=np.int64)
    return np.unique(out, axis=0) if len(out) else out


class Truth(NamedTuple):
    roots: np.ndarray  # each record's component: exact and near duplicates joined transitively
    exact_of: np.ndarray  # each record's first record with the same exact key (itself when first or keyless)
    near: np.ndarray  # (pairs, 2) first records of two exact keys at Jaccard >= the threshold
    counts: dict
    shingles: tuple  # (keys, units, by_word) of every record


def truth_components(texts: list[str], languages: list, settings: DedupSettings) -> Truth:
    """Records with the same exact key, or whose keys reach the threshold at the pair's shingle code, joined
    transitively; records with an empty key stand alone."""
    keys, units, by_word = shingle_keys(texts, settings, languages)
    uf = mh.UnionFind(len(texts))
    first: dict[str, int] = {}
    exact_of = np.arange(len(texts))
    for i, k in enumerate(keys):
        if k:
            exact_of[i] = first.setdefault(exact_key(k), i)
            uf.union(exact_of[i], i)
    reps = np.asarray(sorted(first.values()), dtype=np.int64)
    doc, code = settings.items(units[reps], by_word[reps])
    near = []
    for c in np.unique(code).tolist():
        members = reps[doc[code == c]]
        sets = numeric_sets([mh.coded_shingle_set(keys[i], c) for i in members.tolist()])
        pairs = members[similar_pairs(sets, settings.threshold)]
        at_code = settings.pair_codes(units[pairs], by_word[pairs]) == c
        uf.union_pairs(pairs[at_code].tolist())
        near.append(pairs[at_code])
    roots = uf.roots()
    sizes = np.bincount(roots, minlength=len(texts))
    near_pairs = np.concatenate(near) if near else np.empty((0, 2), dtype=np.int64)
    counts = {"near_pairs": len(near_pairs), "removable": int((sizes[sizes > 1] - 1).sum())}
    return Truth(roots, exact_of, near_pairs, counts, (keys, units, by_word))


def missed_kinds(roots: np.ndarray, removed: np.ndarray, shingles: tuple, settings: DedupSettings) -> dict[str, int]:
    """A side's missed removals (records kept beyond one per truth component), by component: "direct" where two
    kept records reach the threshold themselves (a pair the side never found), "chain" where they are joined only
    through other records (A ~ B ~ C with A, C below the threshold). A component counts whole: in one of a thousand
    records keeping a hundred, a single kept pair makes all 99 surplus records "direct"."""
    keys, units, by_word = shingles
    kept = ~removed
    kept_in = np.bincount(roots[kept], minlength=len(roots))
    out = {"direct": 0, "chain": 0}
    for root in np.flatnonzero(kept_in > 1).tolist():
        members = np.flatnonzero((roots == root) & kept)
        pairs = np.array([(a, b) for i, a in enumerate(members) for b in members[i + 1 :]], dtype=np.int64)
        codes = settings.pair_codes(units[pairs], by_word[pairs])
        direct = any(
            mh.jaccard(mh.coded_shingle_set(keys[a], c), mh.coded_shingle_set(keys[b], c)) >= settings.threshold
            for (a, b), c in zip(pairs.tolist(), codes.tolist())
            if c
        )
        out["direct" if direct else "chain"] += len(members) - 1
    return out


def pairs_left(removed: np.ndarray, truth: Truth) -> int:
    """The truth's direct pairs both of whose records were kept: same exact key, or a near pair of two keys."""
    kept = np.bincount(truth.exact_of[~removed], minlength=len(removed))
    return int((kept * (kept - 1) // 2).sum() + (kept[truth.near[:, 0]] * kept[truth.near[:, 1]]).sum())


def score(removed: np.ndarray, roots: np.ndarray) -> dict:
    """Recall and precision of a removal mask against the truth components (see the module's docstring)."""
    sizes = np.bincount(roots, minlength=len(roots))
    hit = np.bincount(roots[removed], minlength=len(roots))
    correct = int(np.minimum(hit, np.maximum(sizes - 1, 0)).sum())
    should = int((sizes[sizes > 1] - 1).sum())
    return {
        "removed": int(removed.sum()),
        "correct": correct,
        "recall": correct / should if should else 1.0,
        "precision": correct / int(removed.sum()) if removed.any() else 1.0,
    }


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def cleaned_records(data: Path) -> tuple[list[str], list[str], list]:
    ids, texts, languages = [], [], []
    for f in sorted((data / "cleaned_jsonl" / BATCH).glob("part-*.jsonl")):
        for r in iter_jsonl(f):
            ids.append(r["id"])
            texts.append(r["text"])
            languages.append((r.get("meta") or {}).get("language"))
    return ids, texts, languages


def tokenmill_outputs(data: Path) -> tuple[set[str], int, int]:
    """(ids tokenmill kept, records out, tokens out)."""
    kept = {r["id"] for f in sorted((data / "deduped_jsonl" / BATCH).glob("part-*.jsonl")) for r in iter_jsonl(f)}
    stats = read_json(data / "tokenized_bins" / "_stats.json")
    return kept, stats["docs_out"], stats["tokens"] if "tokens" in stats else stats["batches"][BATCH]["tokens"]


def stage_profile(data: Path, started: float, step_cpu: dict[str, float]) -> list[str]:
    """Each tokenmill stage's wall seconds (its _timings.json), step seconds and CPU seconds of the process tree
    during its step, with the passes inside it."""
    lines = [f"  {'stage':18s} {'stage s':>8s} {'step s':>8s} {'CPU s':>8s}  inside"]
    details = {
        "cleaned_jsonl": lambda t: t.get("pass_seconds", {}),
        "dedup_report": lambda t: t.get("timings", {}),
        "tokenizer": lambda t: {k: v for k, v in t.items() if k.endswith("_seconds")},
    }
    for asset, seconds, step in stage_table(data, started):
        timings = data / asset / (BATCH if (data / asset / BATCH).is_dir() else "") / "_timings.json"
        inside = details.get(asset, lambda t: {})(read_json(timings) if timings.exists() else {})
        parts = ", ".join(f"{k} {v:.1f}" for k, v in inside.items())
        cpu = f"{step_cpu[asset]:8.1f}" if asset in step_cpu else f"{'-':>8s}"
        lines.append(f"  {asset:18s} {seconds or 0:8.1f} {step:8.1f} {cpu}  {parts}")
    return lines


def run_tokenmill(env: dict, work: Path, dedup: dict) -> tuple[Measured, dict[str, float]]:
    """`tokenmill update` with a Dagster instance of the repo's dagster.yaml (its events time the steps): the
    measured figures and each step's CPU seconds of the process tree (the sampled CPU curve between the step's start
    and success events). dedup: dedup_report settings instead of the defaults (a run config)."""
    config = None
    if dedup:
        config = work / "tokenmill.yaml"
        config.write_text(json.dumps({"ops": {"dedup_report": {"config": dedup}}}))
    home = work / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster_home" / "dagster.yaml").read_text())
    env = {**env, "DAGSTER_HOME": str(home)}
    r = run_update(env, work / "tokenmill.log", 0.1, config)
    sampler = r.pop("_sampler")
    measured = Measured(
        r["wall_s"],
        r["cpu_s"],
        r["tree_rss_peak_mib"],
        max(r["run_rss_mib"], r["largest_other_rss_mib"]),
        r["returncode"],
        r["started"],
    )
    steps = step_intervals(env) if not r["returncode"] else {}
    return measured, {k: sampler.cpu_at(end) - sampler.cpu_at(start) for k, (start, end) in steps.items()}


HEADER = (
    "| tool      |  wall s |   CPU s | GB/core-h | largest MiB | tree MiB | records out |  tokens out |  recall "
    "| precision | pairs left |\n|-----------|--------:|--------:|----------:|------------:|---------:|------------:"
    "|------------:|--------:|----------:|-----------:|"
)


def row(name: str, m: Measured, input_bytes: int, records: int, tokens: int, quality: dict | None) -> str:
    """A markdown row of HEADER: GB/core-h is the source's bytes over the side's CPU hours."""
    rate = input_bytes / 1e9 / (m.cpu_seconds / 3600)
    acc = (
        f"{quality['recall']:7.2%} | {quality['precision']:9.2%} | {quality['pairs_left']:10,d}"
        if quality
        else f"{'-':>7s} | {'-':>9s} | {'-':>10s}"
    )
    return (
        f"| {name:9s} | {m.seconds:7.1f} | {m.cpu_seconds:7.1f} | {rate:9.2f} | {m.process_peak_mib:11.0f} | "
        f"{m.peak_mib:8.0f} | {records:11,d} | {tokens:11,d} | {acc} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=80_000, help="poems in the built corpus (355000: the full corpus)")
    ap.add_argument("--source", type=Path, help="a source folder instead of the built corpus")
    ap.add_argument("--workers", type=int, default=2, help="datatrove's worker processes")
    ap.add_argument("--dt-ngrams", type=int, default=2, help="datatrove shingle size (characters)")
    ap.add_argument("--dt-buckets", type=int, default=20, help="datatrove LSH buckets (bands)")
    ap.add_argument("--dt-hashes", type=int, default=5, help="datatrove hashes per bucket (rows)")
    ap.add_argument(
        "--dt-words", action="store_true", help="datatrove shingles of English words (spaCy) instead of characters"
    )
    ap.add_argument(
        "--dt-extract",
        action="store_true",
        help="web sources: datatrove also reads the WARC files and extracts their text (WarcReader + Trafilatura), "
        "the work of tokenmill's raw_records there",
    )
    ap.add_argument(
        "--dt-filters",
        action="store_true",
        help="with --dt-extract: the extracted text also goes through FineWeb's four quality filters (datatrove's)",
    )
    ap.add_argument("--tm-bands", type=int, default=0, help="tokenmill LSH bands (0: its default, with rows)")
    ap.add_argument("--tm-rows", type=int, default=0, help="tokenmill LSH rows per band (0: its default)")
    ap.add_argument(
        "--tm-clusters", choices=("components", "star"), help="tokenmill's dedup clusters (default: its default)"
    )
    ap.add_argument("--skip-truth", action="store_true", help="no ground truth (speed and memory only)")
    ap.add_argument("--_datatrove", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dt_filters and not args.dt_extract:
        ap.error("--dt-filters filters the text --dt-extract extracts: give both")
    if args._datatrove:
        run_datatrove(json.loads(args._datatrove.read_text()))
        return

    work = Path(tempfile.mkdtemp(prefix="tokenmill-peers-"))
    source = args.source or work / "poems"
    if not args.source:
        print(f"built {corpus(source, args.docs):,} poems in {source}")
    input_bytes = tree_bytes(source)
    data = work / "data"
    env = {**os.environ, "TOKENMILL_SOURCE": str(source), "TOKENMILL_DATA": str(data)}
    dedup = {"bands": args.tm_bands, "rows": args.tm_rows} if args.tm_bands or args.tm_rows else {}
    tm, step_cpu = run_tokenmill(env, work, {**dedup, **({"clusters": args.tm_clusters} if args.tm_clusters else {})})
    if tm.returncode:
        sys.exit(f"tokenmill failed (rc {tm.returncode}): see {work / 'tokenmill.log'}")

    tokenizer = data / "tokenizer" / "tokenizer.json"
    eos = json.loads((data / "tokenizer" / "special_tokens_map.json").read_text())["eos_token"]
    eos = eos["content"] if isinstance(eos, dict) else eos
    cleaned = data / "cleaned_jsonl" / BATCH
    cfg = {
        "work": str(work / "dt"),
        "input": str(cleaned),
        "tokenizer": str(tokenizer),
        "eos": eos,
        "tasks": max(args.workers, len(list(cleaned.glob("part-*.jsonl")))),
        "workers": args.workers,
        "ngrams": args.dt_ngrams,
        "buckets": args.dt_buckets,
        "hashes": args.dt_hashes,
        "words": args.dt_words,
        "extract": str(source) if args.dt_extract else "",
        "filters": args.dt_filters,
    }
    (work / "dt.json").write_text(json.dumps(cfg))
    dt = run_measured(
        [sys.executable, __file__, "--_datatrove", str(work / "dt.json")], dict(os.environ), work / "dt.log"
    )
    if dt.returncode:
        sys.exit(f"datatrove failed (rc {dt.returncode}): see {work / 'dt.log'}")

    ids, texts, languages = cleaned_records(data)
    kept, tm_records, tm_tokens = tokenmill_outputs(data)
    dt_removed, dt_tokens = datatrove_outputs(work / "dt")
    tm_quality = dt_quality = None
    tm_missed: dict[str, int] = {}
    if not args.skip_truth:
        truth = truth_components(texts, languages, DedupSettings())
        tm_removed = np.asarray([i not in kept for i in ids])
        dt_removed_mask = np.asarray([i in dt_removed for i in ids])
        tm_quality = {**score(tm_removed, truth.roots), "pairs_left": pairs_left(tm_removed, truth)}
        tm_missed = missed_kinds(truth.roots, tm_removed, truth.shingles, DedupSettings())
        dt_quality = {**score(dt_removed_mask, truth.roots), "pairs_left": pairs_left(dt_removed_mask, truth)}
        print(
            f"ground truth: {len(ids):,} cleaned records, {truth.counts['near_pairs']:,} near pairs at Jaccard >= "
            f"{DedupSettings().threshold}, {truth.counts['removable']:,} removable duplicates (exact + near)"
        )
    print(f"source: {source} ({input_bytes / 1e6:.1f} MB); logs and outputs: {work}")
    print(
        f"datatrove {cfg['buckets']} buckets x {cfg['hashes']} hashes, {cfg['ngrams']}-"
        f"{'word' if cfg['words'] else 'character'} shingles, "
        f"{cfg['tasks']} tasks on {cfg['workers']} workers; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores (shared machine: figures are noisy)"
    )
    print(HEADER)
    print(row("tokenmill", tm, input_bytes, tm_records, tm_tokens, tm_quality))
    print(row("datatrove", dt, input_bytes, len(ids) - len(dt_removed), dt_tokens, dt_quality))
    if tm_quality:
        print(
            f"tokenmill's missed removals, by truth component: {tm_missed['direct']} in components where two kept "
            f"records are near duplicates themselves (a pair never found; 'pairs left' counts those pairs), "
            f"{tm_missed['chain']} in components whose kept records are joined only through others (clusters "
            f"'star' removes a record only if it is near its cluster's kept one; the truth joins transitively)"
        )
    print(f"tokenmill / datatrove, GB per core-hour: {dt.cpu_seconds / tm.cpu_seconds:.2f}x (target >= 4x)")
    same = sum(step_cpu.get(k, 0.0) for k in SAME_WORK_STEPS)
    if same and not args.dt_filters:  # with them, datatrove's CPU includes filtering: only the line below compares
        print(
            f"on the work datatrove does ({', '.join(SAME_WORK_STEPS)}: no clean, BPE training, funnel or start-up): "
            f"tokenmill {same:.1f} CPU-s, {input_bytes / 1e9 / (same / 3600):.2f} GB/core-h, "
            f"{dt.cpu_seconds / same:.2f}x datatrove"
        )
    if same and args.dt_filters:
        with_clean = same + step_cpu.get("cleaned_jsonl", 0.0)
        print(
            f"with FineWeb's quality filters on datatrove's side and all of cleaned_jsonl on tokenmill's: tokenmill "
            f"{with_clean:.1f} CPU-s, {input_bytes / 1e9 / (with_clean / 3600):.2f} GB/core-h, "
            f"{dt.cpu_seconds / with_clean:.2f}x datatrove"
        )
    tm_disk, dt_disk = disk.tree_bytes(data), disk.tree_bytes(work / "dt")
    print(
        f"disk per input byte: tokenmill's data root {disk.per_input(tm_disk, input_bytes):.2f} "
        f"({disk.human(tm_disk)}); datatrove's folders {disk.per_input(dt_disk, input_bytes):.2f} "
        f"({disk.human(dt_disk)}: it reads tokenmill's cleaned_jsonl, "
        f"{disk.per_input(disk.tree_bytes(data / 'cleaned_jsonl'), input_bytes):.2f}, and writes neither raw records "
        "nor an index kept for later batches)"
    )
    print("tokenmill per stage:")
    print("\n".join(stage_profile(data, tm.started, step_cpu)))
    print("datatrove per step (task seconds, summed over its tasks):")
    print("\n".join(datatrove_steps(work / "dt")))


if __name__ == "__main__":
    main()
