"""Web quality rules vs datatrove: keep/drop agreement per filter, drop shares, seconds, and cleaned_jsonl's rate.

usage: python benchmarks/bench_quality.py [--input FILE.jsonl[.gz] ...] [--windows 6000] [--repeat 200]
                                          [--skip-stage]

Needs the `bench` extra (datatrove, spacy). Documents: `text` of every JSON line of --input (default: the 20 Common
Crawl documents of ../shared/corpora/commoncrawl-sample). --windows N adds documents cut from those real pages
(runs of consecutive lines, every start and length, round-robin over the pages) until there are N: real web
lines in every mix, so each rule meets documents on both sides of its threshold.

1. Agreement: each of FineWeb's four filters (datatrove's GopherRepetitionFilter, GopherQualityFilter,
   C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter, default thresholds) and tokenmill's
   rules of the same family, on the same English text: share of documents with the same keep/drop decision,
   the drop share of each, and seconds. datatrove (0.10) cuts English words and sentences with spaCy's blank
   English pipeline and its sentencizer (rules shipped in the spacy package, no model); tokenmill with its own
   regex (quality/text.py).
2. The whole chain per document, single process: datatrove's four filters in order vs `web_verdict`.
3. cleaned_jsonl (clean_corpus, 1 worker, language identification on) on the Common Crawl sample repeated
   --repeat times, under quality=web and quality=curated: records/s per core.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tokenmill.stages.clean.quality import QualitySettings, web_verdict  # noqa: E402
from tokenmill.stages.clean.quality import rules as R  # noqa: E402
from tokenmill.stages.clean.quality.apply import (  # noqa: E402
    FINEWEB_RULES,
    GOPHER_QUALITY_RULES,
    REPETITION_RULES,
)
from tokenmill.stages.clean.quality.text import Doc  # noqa: E402

CC_SAMPLE = REPO.parent / "shared" / "corpora" / "commoncrawl-sample"
MAX_WINDOW_LINES = 40  # longest run of lines cut from a page for --windows


def read_texts(paths: list[Path]) -> list[str]:
    texts = []
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def line_windows(pages: list[str], wanted: int) -> list[str]:
    """Documents cut from the pages: for each length 1..MAX_WINDOW_LINES and each start, the run of lines,
    taken round-robin over the pages (each page's windows in order) until `wanted` documents."""
    per_page = []
    for page in pages:
        lines = page.split("\n")
        per_page.append(
            ["\n".join(lines[i : i + n]) for n in range(1, MAX_WINDOW_LINES + 1) for i in range(len(lines) - n + 1)]
        )
    out, k = [], 0
    while len(out) < wanted and any(k < len(w) for w in per_page):
        out += [w[k] for w in per_page if k < len(w) and w[k].strip()]
        k += 1
    return out[:wanted]


def datatrove_filters():
    """FineWeb's four filters as datatrove builds them (default thresholds; C4 without its terminal punctuation
    rule, as FineWeb runs it)."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    return {
        "gopher_repetition": GopherRepetitionFilter(),
        "gopher_quality": GopherQualityFilter(),
        "c4": C4QualityFilter(filter_no_terminal_punct=False),
        "fineweb": FineWebQualityFilter(),
    }


def _family(rules):
    def check(text: str, s: QualitySettings):
        doc = Doc(text, "en")
        for _, rule in rules:
            bad = rule(doc, s)
            if bad is not None:
                return bad
        return None

    return check


OURS = {
    "gopher_repetition": _family(REPETITION_RULES),
    "gopher_quality": _family(GOPHER_QUALITY_RULES),
    "c4": lambda text, s: R.c4_filter(Doc(text, "en"), s).reject,
    "fineweb": _family(FINEWEB_RULES),
}


def datatrove_keeps(flt, text: str) -> bool:
    from datatrove.data import Document

    verdict = flt.filter(Document(text=text, id="0"))
    return verdict is True or (isinstance(verdict, bool) and verdict)


def agreement(texts: list[str], filters: dict, s: QualitySettings) -> list[dict]:
    """Per filter: documents, agreement, each side's drop share and seconds, and the first disagreements."""
    rows = []
    for name, flt in filters.items():
        t0 = time.perf_counter()
        theirs = [datatrove_keeps(flt, t) for t in texts]
        t1 = time.perf_counter()
        ours = [OURS[name](t, s) is None for t in texts]
        t2 = time.perf_counter()
        differ = [i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b]
        rows.append(
            {
                "filter": name,
                "docs": len(texts),
                "agreement": 1 - len(differ) / len(texts),
                "drop_datatrove": theirs.count(False) / len(texts),
                "drop_tokenmill": ours.count(False) / len(texts),
                "seconds_datatrove": t1 - t0,
                "seconds_tokenmill": t2 - t1,
                "differ": differ[:5],
            }
        )
    return rows


def chain_seconds(texts: list[str], filters: dict, s: QualitySettings) -> tuple[float, float, int, int]:
    """The four filters in FineWeb's order on each document (datatrove: C4 rewrites the text it passes on)."""
    from datatrove.data import Document

    t0 = time.perf_counter()
    kept_theirs = 0
    for text in texts:
        doc = Document(text=text, id="0")
        kept_theirs += all(f.filter(doc) is True for f in filters.values())
    t1 = time.perf_counter()
    kept_ours = sum(web_verdict(text, {}, s, "en")[1] is None for text in texts)
    return t1 - t0, time.perf_counter() - t1, kept_theirs, kept_ours


def stage_rate(repeat: int) -> dict:
    """clean_corpus records/s on one worker over the Common Crawl sample repeated `repeat` times (ids made unique)."""
    from tokenmill.stages.clean import CleanSettings, clean_corpus
    from tokenmill.stages.raw import ingest

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        pages = [json.loads(line) for p in sorted(CC_SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]
        with open(src / "cc.jsonl", "w", encoding="utf-8") as f:
            for k in range(repeat):
                for page in pages:
                    f.write(json.dumps({**page, "id": f"{page['id']}#{k}"}) + "\n")
        ingest(src, Path(tmp) / "raw", workers=1)
        for profile in ("web", "curated"):
            t0 = time.perf_counter()
            result = clean_corpus(Path(tmp) / "raw", Path(tmp) / profile, CleanSettings(quality=profile), workers=1)
            seconds = time.perf_counter() - t0
            out[profile] = {
                "records": result.docs_in,
                "kept": result.docs_out,
                "seconds": round(seconds, 2),
                "records_per_s": round(result.docs_in / seconds),
                "web_quality_seconds": result.rule_seconds.get("web_quality"),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=Path, nargs="*", default=sorted(CC_SAMPLE.glob("*.jsonl")))
    ap.add_argument("--windows", type=int, default=6000, help="add line windows of the pages up to this many docs")
    ap.add_argument("--repeat", type=int, default=200, help="Common Crawl sample copies for the stage rate")
    ap.add_argument("--skip-stage", action="store_true")
    args = ap.parse_args()
    pages = read_texts(args.input)
    texts = pages + line_windows(pages, args.windows - len(pages)) if args.windows > len(pages) else pages
    print(f"{len(pages)} real web pages from {len(args.input)} files; {len(texts)} documents with line windows")
    s, filters = QualitySettings(), datatrove_filters()
    rows = agreement(texts, filters, s)
    print(f"{'filter':18} {'docs':>6} {'agree':>8} {'drop dt':>8} {'drop tm':>8} {'s dt':>7} {'s tm':>7} {'x':>6}")
    for r in rows:
        speed = r["seconds_datatrove"] / max(r["seconds_tokenmill"], 1e-9)
        print(
            f"{r['filter']:18} {r['docs']:6} {r['agreement']:8.2%}"
            f" {r['drop_datatrove']:8.2%} {r['drop_tokenmill']:8.2%} {r['seconds_datatrove']:7.2f}"
            f" {r['seconds_tokenmill']:7.2f} {speed:5.1f}x  differ: {r['differ']}"
        )
    theirs, ours, kept_theirs, kept_ours = chain_seconds(texts, filters, s)
    print(
        f"chain (4 filters, 1 process): datatrove {theirs:.2f} s ({len(texts) / theirs:.0f} docs/s, kept {kept_theirs})"
        f", tokenmill {ours:.2f} s ({len(texts) / ours:.0f} docs/s, kept {kept_ours}): {theirs / ours:.1f}x"
    )
    if not args.skip_stage:
        for profile, r in stage_rate(args.repeat).items():
            print(f"cleaned_jsonl quality={profile}: {r}")


if __name__ == "__main__":
    main()
