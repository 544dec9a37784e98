"""Web inputs: HTML main-text extraction quality and speed, and WARC reading speed and robustness, in one run.

    .venv/bin/pip install -e '.[bench]'      # warcio, resiliparse (the candidates not chosen)
    python benchmarks/bench_extract.py --benchmark DIR [--warc FILE.warc.gz]

DIR is a checkout of scrapinghub/article-extraction-benchmark (MIT): html/*.html.gz, ground-truth.json and its
evaluate.py, whose shingle F1 (4-grams of \\w+ tokens, per-page normalized, precision and recall averaged over
pages) scores every candidate exactly as the benchmark's own results table does. Speed is pages per CPU second
of this process (one core). The WARC part writes the benchmark's pages as request + response + metadata records
into a .warc.gz (one gzip member per record, as crawlers write) and reads it with warcio and FastWARC; --warc
adds a real WARC.gz (e.g. resiliparse's tests/data/warcfile.warc.gz, a Common Crawl excerpt). Robustness: one
gzip member cut in half in the middle of the file: how many records each library returns, and tokenmill's
read_warc (which resyncs).
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
from pathlib import Path

import trafilatura

from tokenmill.stages.raw.html_text import page_text
from tokenmill.stages.raw.read_warc import read_warc
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found

WARC_ROUNDS = 20  # the WARC files are read this many times over (records/s of a few thousand records)


def _load_benchmark(folder: Path):
    spec = importlib.util.spec_from_file_location("aeb_evaluate", folder / "evaluate.py")
    evaluate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate)
    truth = json.loads((folder / "ground-truth.json").read_text(encoding="utf-8"))
    pages = {key: gzip.decompress((folder / "html" / f"{key}.html.gz").read_bytes()) for key in truth}
    return evaluate, truth, pages


def _tokenmill(payload: bytes) -> str:
    settings = RawSettings()
    try:
        return page_text(payload, None, settings.html_max_bytes, settings.html_max_tags).text
    except Exception:  # an extraction_empty page: an empty prediction, as the benchmark scores a miss
        return ""


def _candidates() -> dict:
    found = {
        "tokenmill (trafilatura fast)": _tokenmill,
        "trafilatura with fallbacks": lambda b: trafilatura.extract(b.decode("utf-8"), include_comments=False) or "",
        "trafilatura favor_precision": lambda b: (
            trafilatura.extract(b.decode("utf-8"), include_comments=False, favor_precision=True) or ""
        ),
    }
    try:
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.html import HTMLTree

        found["resiliparse main_content"] = lambda b: extract_plain_text(HTMLTree.parse(b.decode()), main_content=True)
    except ImportError:
        print("resiliparse: not installed (pip install -e '.[bench]'), skipped")
    return found


def bench_extraction(folder: Path) -> None:
    evaluate, truth, pages = _load_benchmark(folder)
    print(f"article-extraction-benchmark: {len(pages)} pages, the benchmark's evaluate.py metric")
    print(f"{'candidate':34} {'F1':>6} {'prec':>6} {'recall':>6} {'pages/s/core':>13}")
    for name, extract in _candidates().items():
        t0 = time.process_time()
        prediction = {key: {"articleBody": extract(payload)} for key, payload in pages.items()}
        seconds = time.process_time() - t0
        m = evaluate.evaluate(truth, prediction, n_bootstrap=100)
        print(f"{name:34} {m['f1']:6.3f} {m['precision']:6.3f} {m['recall']:6.3f} {len(pages) / seconds:13.1f}")


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
    ap.add_argument("--benchmark", type=Path, required=True, help="article-extraction-benchmark checkout")
    ap.add_argument("--warc", type=Path, action="append", default=[], help="a real .warc.gz to time as well")
    args = ap.parse_args(argv)
    bench_extraction(args.benchmark)
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / "benchmark-pages.warc.gz"
        write_warc(_load_benchmark(args.benchmark)[2], built)
        bench_warc([built, *args.warc], Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
