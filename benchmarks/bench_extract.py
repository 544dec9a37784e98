"""Web inputs: HTML main-text extraction quality and speed on two benchmarks, and WARC reading speed and
robustness, in one run.

    .venv/bin/pip install -e '.[bench]'      # the other extractors (trafilatura, resiliparse) and warcio
    python benchmarks/bench_extract.py --wcxb WCXB_DIR --benchmark AEB_DIR [--warc FILE.warc.gz]

WCXB_DIR is a checkout of Murrough-Foley/web-content-extraction-benchmark (CC-BY-4.0): 7 kinds of pages with
human-checked main text. Only its dev/ split is read (1,497 pages); test/ is the held-out check of issue 44 and is
never read here. The metric is its evaluate.py's word F1 (bags of lowercased \\w+ words, macro over pages), per
page type. AEB_DIR is a checkout of scrapinghub/article-extraction-benchmark (MIT): 181 article pages scored by its
evaluate.py's shingle F1, as its results table is.

Candidates: tokenmill (our extractor, raw_records' default), trafilatura in the fast mode raw_records offered
before, trafilatura with its readability/jusText fallbacks, and Resiliparse's main content. Each gets the bytes of
a page and does what raw_records does with them (decode by the declared charset, extract); speed is pages per CPU
second of this process, one core, decoding and parsing included. The WARC part writes the article benchmark's
pages as request + response + metadata records into a .warc.gz (one gzip member per record, as crawlers write)
and reads it with warcio and FastWARC; --warc adds a real WARC.gz (e.g. resiliparse's
tests/data/warcfile.warc.gz, a Common Crawl excerpt). Robustness: one gzip member cut in half in the middle of the
file: how many records each library returns, and tokenmill's read_warc (which resyncs).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import io
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from tokenmill.stages.raw.html_text import decode_html, page_text
from tokenmill.stages.raw.read_warc import read_warc
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, Rejected

WARC_ROUNDS = 20  # the WARC files are read this many times over (records/s of a few thousand records)
WCXB_SPLIT = "dev"  # the only split read: test/ is held out
PAGE_TYPES = ("article", "documentation", "service", "listing", "product", "collection", "forum")
BASELINE = "trafilatura fast"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_benchmark(folder: Path):
    evaluate = _module(folder / "evaluate.py", "aeb_evaluate")
    truth = json.loads((folder / "ground-truth.json").read_text(encoding="utf-8"))
    pages = {key: gzip.decompress((folder / "html" / f"{key}.html.gz").read_bytes()) for key in truth}
    return evaluate, truth, pages


def _load_wcxb(folder: Path):
    """WCXB's evaluate.py, and per dev page: its HTML bytes, reference main text and page type."""
    evaluate = _module(folder / "evaluate.py", "wcxb_evaluate")
    split = folder / WCXB_SPLIT
    pages = {}
    for f in sorted((split / "ground-truth").glob("*.json")):
        data = json.loads(f.read_text(encoding="utf-8"))
        truth = data.get("ground_truth")
        if not isinstance(truth, dict):  # evaluate.py leaves such entries out too
            continue
        html = gzip.decompress((split / "html" / f"{f.stem}.html.gz").read_bytes())
        pages[f.stem] = (html, truth.get("main_content") or "", evaluate.get_page_type(data))
    return evaluate, pages


def _through_raw_records(extractor: str) -> Callable[[bytes], str]:
    settings = RawSettings(extractor=extractor)

    def extract(payload: bytes) -> str:
        try:
            return page_text(payload, None, settings).text
        except Rejected:  # extraction_empty and the like: an empty prediction, as the benchmarks score a miss
            return ""

    return extract


def _trafilatura_with_fallbacks(payload: bytes) -> str:
    import trafilatura

    try:
        return trafilatura.extract(decode_html(payload), include_comments=False) or ""
    except Rejected:
        return ""


def _candidates() -> dict[str, Callable[[bytes], str]]:
    found = {"tokenmill": _through_raw_records("tokenmill")}
    for name, extractor in (("trafilatura fast", "trafilatura"), ("resiliparse", "resiliparse")):
        try:
            found[name] = _through_raw_records(extractor)
        except ValueError as e:  # the extractors extra is not installed
            print(f"{name}: skipped ({e})")
    if "trafilatura fast" in found:
        found["trafilatura with fallbacks"] = _trafilatura_with_fallbacks
    return found


def _timed(extract: Callable[[bytes], str], pages: dict[str, bytes]) -> tuple[dict[str, str], float]:
    """Each page's text and the pages per CPU second."""
    t0 = time.process_time()
    texts = {key: extract(payload) for key, payload in pages.items()}
    return texts, len(pages) / (time.process_time() - t0)


def bench_wcxb(folder: Path, candidates: dict) -> None:
    evaluate, pages = _load_wcxb(folder)
    counts = {t: sum(p[2] == t for p in pages.values()) for t in PAGE_TYPES}
    print(f"WCXB {WCXB_SPLIT} split: {len(pages)} pages ({', '.join(f'{t} {n}' for t, n in counts.items())});")
    print("word F1 of its evaluate.py, macro over pages; pages per CPU second (one core, decoding included)")
    print(f"{'candidate':28} {'all':>6} " + " ".join(f"{t[:8]:>8}" for t in PAGE_TYPES) + "  pages/s  speed")
    rows = []
    for name, extract in candidates.items():
        texts, rate = _timed(extract, {key: p[0] for key, p in pages.items()})
        f1: dict[str, list[float]] = defaultdict(list)
        for key, (_, reference, page_type) in pages.items():
            score = evaluate.word_f1(texts[key], reference)[2]
            f1[page_type].append(score)
            f1["all"].append(score)
        rows.append((name, {t: sum(v) / len(v) for t, v in f1.items()}, rate))
    baseline = dict((name, rate) for name, _, rate in rows).get(BASELINE)
    for name, mean, rate in rows:
        ratio = f"{rate / baseline:5.1f}x" if baseline else ""
        cells = " ".join(f"{mean.get(t, 0):8.3f}" for t in PAGE_TYPES)
        print(f"{name:28} {mean['all']:6.3f} {cells} {rate:8.1f} {ratio}")
    if baseline:
        print(f"speed: pages per CPU second against {BASELINE}'s, measured in this run")


def bench_articles(folder: Path, candidates: dict) -> None:
    evaluate, truth, pages = _load_benchmark(folder)
    print(f"article-extraction-benchmark: {len(pages)} pages, the benchmark's evaluate.py metric (shingle F1)")
    print(f"{'candidate':28} {'F1':>6} {'prec':>6} {'recall':>6} {'pages/s':>8}")
    for name, extract in candidates.items():
        texts, rate = _timed(extract, pages)
        m = evaluate.evaluate(truth, {key: {"articleBody": text} for key, text in texts.items()}, n_bootstrap=100)
        print(f"{name:28} {m['f1']:6.3f} {m['precision']:6.3f} {m['recall']:6.3f} {rate:8.1f}")


def write_warc(pages: dict[str, bytes], path: Path) -> int:
    """The pages as request, response and metadata records, one gzip member each; returns the record count."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    with open(path, "wb") as f:
        writer = WARCWriter(f, gzip=True)
        for key, payload in pages.items():
            url = f"https://example.org/{key}"
            http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
            request = StatusAndHeaders("GET / HTTP/1.1", [("Host", "example.org")], is_http_request=True)
            writer.write_record(writer.create_warc_record(url, "request", http_headers=request))
            writer.write_record(
                writer.create_warc_record(url, "response", payload=io.BytesIO(payload), http_headers=http)
            )
            writer.write_record(writer.create_warc_record(url, "metadata", payload=io.BytesIO(b"fetchTimeMs: 1\r\n")))
    return 3 * len(pages)


def _read_warcio(path: Path) -> int:
    from warcio.archiveiterator import ArchiveIterator

    n = 0
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f):
            rec.content_stream().read()
            n += 1
    return n


def _read_fastwarc(path: Path) -> int:
    from fastwarc.warc import ArchiveIterator

    n = 0
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f, parse_http=True):
            rec.reader.read()
            n += 1
    return n


def _count_until_error(read, path: Path) -> str:
    try:
        return f"{read(path)} records, no error"
    except Exception as e:
        return f"stops with {type(e).__name__}"


def bench_warc(warcs: list[Path], folder: Path) -> None:
    readers = {"fastwarc": _read_fastwarc}
    try:
        import warcio  # noqa: F401

        readers["warcio"] = _read_warcio
    except ImportError:
        print("warcio: not installed (pip install -e '.[bench]'), skipped")
    for path in warcs:
        n = readers["fastwarc"](path)
        speed = {}
        for name, read in readers.items():
            t0 = time.perf_counter()
            for _ in range(WARC_ROUNDS):
                read(path)
            speed[name] = n * WARC_ROUNDS / (time.perf_counter() - t0)
        ratio = f" ({speed['fastwarc'] / speed['warcio']:.1f}x warcio)" if "warcio" in speed else ""
        rates = ", ".join(f"{name} {rate:,.0f} records/s" for name, rate in speed.items())
        print(f"{path.name}: {n} records, {path.stat().st_size / 1e6:.1f} MB: {rates}{ratio}")
    # robustness: the middle record's gzip member cut in half
    data = warcs[0].read_bytes()
    starts = [i for i in range(len(data) - 2) if data[i : i + 3] == b"\x1f\x8b\x08"]
    mid = len(starts) // 2
    cut = data[: starts[mid] + (starts[mid + 1] - starts[mid]) // 2] + data[starts[mid + 1] :]
    broken = folder / "truncated-member.warc.gz"
    broken.write_bytes(cut)
    print(f"one gzip member cut in half (record {mid} of about {len(starts)}):")
    for name, read in readers.items():
        print(f"  {name:10} {_count_until_error(read, broken)}")
    items = list(read_warc(str(broken), None, RawSettings()))
    found = sum(isinstance(i, Found) for i in items)
    bad = [i.reason for i in items if isinstance(i, Bad)]
    print(f"  tokenmill  {len(items)} records read past it: {found} documents, rejected {bad}, rest skipped")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wcxb", type=Path, required=True, help="web-content-extraction-benchmark checkout")
    ap.add_argument("--benchmark", type=Path, required=True, help="article-extraction-benchmark checkout")
    ap.add_argument("--warc", type=Path, action="append", default=[], help="a real .warc.gz to time as well")
    args = ap.parse_args(argv)
    candidates = _candidates()
    bench_wcxb(args.wcxb, candidates)
    print()
    bench_articles(args.benchmark, candidates)
    print()
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / "benchmark-pages.warc.gz"
        write_warc(_load_benchmark(args.benchmark)[2], built)
        bench_warc([built, *args.warc], Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
