"""A web-scale benchmark corpus (50,000 pages and more) built from the real text reachable here, written in the
layouts web corpora ship: Parquet (FineWeb / Hugging Face datasets columns), multi-frame .jsonl.zst (Dolma,
RedPajama) and crawl WARC.gz (Common Crawl). For benchmarks, never tests: nothing is downloaded, and the same --seed
gives byte-identical files.

usage: python benchmarks/web_corpus.py OUT [--pages 50000] [--seed 0] [--pages-per-file 5000]
                                           [--formats parquet zst [jsonl] [warc]] [--sentences DIR] [--html DIR]
                                           [--ingest]

Pages are drawn from paragraphs of real text:
  en  the Common Crawl documents of ../shared/corpora/commoncrawl-sample (paragraphs = lines) and
      tinyshakespeare's speeches;
  zh  chinese-poetry Tang poems (the first POETRY_FILES files);
  xx  with --sentences (default benchmarks/data/langid-sentences when it is there: one `<iso code>.txt` of
      sentences per language), paragraphs of 2-6 sentences of one language.
Each page belongs to a site (a seeded domain with its own header and footer lines, as real sites repeat them) and
is one of: a new page (4-12 paragraphs of one language, each kept, its sentences shuffled, one dropped, or ~5% of
its words swapped), a near copy of an earlier page (one paragraph mutated, as syndicated pages are), an exact copy
(another URL), or junk (a link farm, a two-word stub, mojibake). Shares in KINDS.

Files: web-NNNNN.parquet (zstd pages, row groups of ROW_GROUP_ROWS), web-NNNNN.jsonl.zst (a frame every FRAME_LINES
lines) and, when --formats names them, plain web-NNNNN.jsonl (the baseline) and web-NNNNN.warc.gz, taking turns,
--pages-per-file pages each.
In a .warc.gz each page is a request, a response and a metadata record (one gzip member each, after a warcinfo
record), as Common Crawl writes them. The response is HTML: the page's text in a generated site layout (navigation,
the article, related links, footer, cookie banner: what extraction must drop), or, for REAL_PAGE_SHARE of the pages,
a real page of --html (default tests/fixtures/web/pages; scrapinghub's article-extraction-benchmark html/ is a
larger choice) with a change: the page's first paragraph inserted after its first </p>, as mirrors and
syndication change pages. A few responses are not pages (NON_PAGE_SHARES: a 404, a text/plain file).
--ingest then reads each format's files with raw_records (ingest, one worker) and prints records/s and the ratio to
plain .jsonl.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import random
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tokenmill.stages.raw import RawSettings, ingest  # noqa: E402
from tokenmill.stages.raw.html_text import declared_charset  # noqa: E402
from tokenmill.stages.raw.stream import zstd  # noqa: E402

CORPORA = REPO.parent / "shared" / "corpora"
SENTENCES = REPO / "benchmarks" / "data" / "langid-sentences"
REAL_PAGES = REPO / "tests" / "fixtures" / "web" / "pages"
POETRY_FILES = 3  # ~3,000 Tang poems: enough distinct Chinese paragraphs, read in well under a second
ROW_GROUP_ROWS = 1000  # FineWeb's files hold row groups of about this many pages
FRAME_LINES = 1000  # Dolma-style: the .jsonl.zst is a sequence of independent zstd frames
SITES = 2000
COPY_POOL = 5000  # earlier pages a copy is drawn from (a seeded reservoir: memory flat in --pages)
COPIES_AFTER = 100  # new pages before the first copy, so the first pages are not copies of one another
KINDS = {"new": 0.80, "near_copy": 0.08, "exact_copy": 0.07, "junk": 0.05}
LANGUAGE_SHARES = {"en": 0.45, "zh": 0.10}  # of the sites, about as on the web; the other languages share the rest
DUMPS = ("CC-MAIN-2023-50", "CC-MAIN-2024-10", "CC-MAIN-2024-18")
REAL_PAGE_SHARE = 0.25  # of the WARC responses: real pages (with a change) rather than generated layouts
NON_PAGE_SHARES = {"404": 0.01, "text/plain": 0.01}  # responses raw_records skips (http_status_not_ok, non_html)
RELATED_LINKS = 6
_SENTENCE_END = re.compile(r"(?<=[.!?。！？；])\s*")


def load_paragraphs(sentences: Path | None) -> dict[str, list[str]]:
    """language -> paragraphs of real text."""
    pools: dict[str, list[str]] = {"en": [], "zh": []}
    for path in sorted((CORPORA / "commoncrawl-sample").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            pools["en"] += [p for p in json.loads(line)["text"].split("\n") if len(p) > 40]
    shakespeare = CORPORA / "tinyshakespeare" / "input.txt"
    if shakespeare.exists():
        pools["en"] += [
            b.replace("\n", " ") for b in shakespeare.read_text(encoding="utf-8").split("\n\n") if len(b) > 80
        ]
    for path in sorted((CORPORA / "chinese-poetry" / "全唐诗").glob("poet.tang.*.json"))[:POETRY_FILES]:
        pools["zh"] += [
            "".join(p["paragraphs"]) for p in json.loads(path.read_text(encoding="utf-8")) if p["paragraphs"]
        ]
    if sentences is not None and sentences.is_dir():
        for path in sorted(sentences.glob("*.txt")):
            lines = [s.strip() for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]
            rng = random.Random(path.stem)
            paragraphs = []
            while len(lines) >= 2:
                n = rng.randint(2, 6)
                paragraphs.append(" ".join(lines[:n]))
                lines = lines[n:]
            pools.setdefault(path.stem, []).extend(paragraphs)
    pools = {lang: ps for lang, ps in pools.items() if ps}
    if not pools:
        raise SystemExit(f"no text found under {CORPORA}: the shared corpora are needed")
    return pools


def mutate(paragraph: str, rng: random.Random, vocabulary: list[str]) -> str:
    """The paragraph kept, its sentences shuffled, one sentence dropped, or ~5% of its words swapped."""
    choice = rng.random()
    sentences = [s for s in _SENTENCE_END.split(paragraph) if s]
    if choice < 0.4 or (choice < 0.8 and len(sentences) < 2):
        return paragraph
    if choice < 0.6:
        rng.shuffle(sentences)
        return " ".join(sentences)
    if choice < 0.8:
        del sentences[rng.randrange(len(sentences))]
        return " ".join(sentences)
    words = paragraph.split(" ")
    for _ in range(max(1, len(words) // 20)):
        words[rng.randrange(len(words))] = rng.choice(vocabulary)
    return " ".join(words)


class Site:
    def __init__(self, n: int, rng: random.Random, lang: str):
        prefix, tld = rng.choice(["www.", "blog.", "news.", ""]), rng.choice(["com", "org", "net", "de", "cn", "fr"])
        self.domain = f"{prefix}site{n:04d}.{tld}"
        self.lang = lang
        self.header = f"Home | News | About {self.domain} | Contact"
        self.footer = f"© {rng.randint(2005, 2024)} {self.domain}. All rights reserved. Privacy policy | Cookies"


class PageMaker:
    """Seeded pages; every call to page() draws from the one generator, so the corpus depends on seed and count."""

    def __init__(self, pools: dict[str, list[str]], seed: int):
        self.rng = random.Random(seed)
        self.pools, self.langs = pools, sorted(pools)
        self.vocabulary = {
            lang: sorted({w for p in ps[:2000] for w in p.split(" ") if w})[:5000] for lang, ps in pools.items()
        }
        others = [lang for lang in self.langs if lang not in LANGUAGE_SHARES]
        rest = 1 - sum(LANGUAGE_SHARES[lang] for lang in self.langs if lang in LANGUAGE_SHARES)
        weights = [LANGUAGE_SHARES.get(lang, rest / len(others) if others else 0) for lang in self.langs]
        self.sites = [Site(i, self.rng, self.rng.choices(self.langs, weights)[0]) for i in range(SITES)]
        self.made: list[tuple[str, str]] = []  # (text, lang) of up to COPY_POOL earlier new pages, for copies

    def _new_text(self, lang: str) -> str:
        rng, pool = self.rng, self.pools[lang]
        # drawn without replacement: a page never repeats a paragraph (the langid sentences give ~25 per language)
        paragraphs = rng.sample(pool, min(len(pool), rng.randint(4, 12)))
        return "\n".join(mutate(p, rng, self.vocabulary[lang]) for p in paragraphs)

    def _junk(self, site: Site) -> str:
        kind = self.rng.randrange(3)
        if kind == 0:  # a link farm: one line repeated
            return "\n".join([f"Best deals at {site.domain} click here"] * self.rng.randint(20, 60))
        if kind == 1:
            return "Page not found"
        return self._new_text("en").encode("utf-8").decode("latin-1")  # mojibake: UTF-8 read as Latin-1

    def page(self, n: int) -> dict:
        rng = self.rng
        site = rng.choice(self.sites)
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        if kind in ("near_copy", "exact_copy") and len(self.made) >= COPIES_AFTER:
            body, lang = rng.choice(self.made)
            if kind == "near_copy":
                paragraphs = body.split("\n")
                i = rng.randrange(len(paragraphs))
                paragraphs[i] = mutate(paragraphs[i], rng, self.vocabulary[lang]) + " " + rng.choice(self.pools[lang])
                body = "\n".join(paragraphs)
        elif kind == "junk":
            body, lang = self._junk(site), "en"
        else:
            lang = site.lang
            body = self._new_text(lang)
            if len(self.made) < COPY_POOL:
                self.made.append((body, lang))
            else:
                self.made[rng.randrange(COPY_POOL)] = (body, lang)
        dump = rng.choice(DUMPS)
        return {
            "text": f"{site.header}\n{body}\n{site.footer}",
            "id": f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>",
            "url": f"https://{site.domain}/{rng.choice(['article', 'post', 'p', 'news'])}/{n}",
            "dump": dump,
            "date": f"{dump[8:12]}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z",
            "language": lang,
            "language_score": round(rng.uniform(0.65, 1.0), 4),
        }


def write_parquet(path: Path, pages: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(pages), path, row_group_size=ROW_GROUP_ROWS, compression="zstd")


def jsonl(pages: list[dict]) -> bytes:
    return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pages).encode("utf-8")


def write_jsonl_zst(path: Path, pages: list[dict]) -> None:
    with open(path, "wb") as f:
        for i in range(0, len(pages), FRAME_LINES):
            f.write(zstd.compress(jsonl(pages[i : i + FRAME_LINES]), level=3))


def write_jsonl(path: Path, pages: list[dict]) -> None:
    path.write_bytes(jsonl(pages))


def load_real_pages(folder: Path) -> list[bytes]:
    """The HTML of every .html / .html.gz page in `folder`, sorted by name."""
    paths = sorted(p for p in folder.iterdir() if p.name.endswith((".html", ".htm", ".html.gz")))
    if not paths:
        raise SystemExit(f"no .html or .html.gz page in {folder}")
    return [gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes() for p in paths]


def layout_html(page: dict, related: list[str]) -> bytes:
    """The page's text (header line, paragraphs, footer line) in a site layout with the chrome real sites have."""
    lines = page["text"].split("\n")
    header, body, footer = lines[0], lines[1:-1], lines[-1]
    title = " ".join(body[0].split(" ")[:10])[:80] if body else "Untitled"
    e = html.escape
    nav = "".join(f'<li><a href="/{w.lower()}">{e(w)}</a></li>' for w in header.split(" | "))
    links = "".join(
        f'<li><a href="{e(u)}">{e(u.rsplit("/", 2)[-2].title())} {e(u.rsplit("/", 1)[-1])}</a></li>' for u in related
    )
    paragraphs = "".join(f"<p>{e(p)}</p>\n" for p in body)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{e(title)}</title>'
        f'<link rel="stylesheet" href="/style.css"><script>var analytics = {{"id": "{e(page["id"])}"}};</script>'
        f'</head><body><header class="site-header"><nav class="menu"><ul>{nav}</ul></nav></header>\n'
        f'<main><article><h1>{e(title)}</h1><div class="byline">{e(page["date"][:10])}</div>\n{paragraphs}'
        f'</article><aside class="related"><h2>Related</h2><ul>{links}</ul></aside></main>\n'
        f'<footer class="site-footer"><p>{e(footer)}</p></footer>'
        '<div id="cookie-banner" class="cookie-consent"><p>We use cookies to improve your experience.</p>'
        "<button>Accept all</button><button>Settings</button></div></body></html>\n"
    ).encode()


def real_page_html(real: bytes, page: dict) -> bytes:
    """A real page with the generated page's first paragraph inserted after its first </p> (before </body> when it
    has none), in the page's own charset."""
    body = page["text"].split("\n")
    paragraph = body[1] if len(body) > 2 else body[0]
    codec = declared_charset(real, None) or "utf-8"
    inserted = f"<p>{html.escape(paragraph)}</p>".encode(codec, errors="xmlcharrefreplace")
    at = real.find(b"</p>")
    at = at + 4 if at != -1 else real.rfind(b"</body>")
    return real[:at] + inserted + real[at:] if at >= 0 else real + inserted


def warc_member(kind: str, page: dict, record_id: str, block: bytes, content_type: str) -> bytes:
    head = (
        f"WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {page['url']}\r\nWARC-Date: {page['date']}\r\n"
        f"WARC-Record-ID: {record_id}\r\nContent-Type: {content_type}\r\nContent-Length: {len(block)}\r\n\r\n"
    )
    return gzip.compress(head.encode() + block + b"\r\n\r\n", mtime=0)


class WarcWriter:
    """Writes pages as crawl WARC.gz; its own generator (seeded by --seed) picks the layout, so the pages
    themselves are the same in every format."""

    def __init__(self, seed: int, real_pages: list[bytes]):
        self.rng, self.real_pages = random.Random(f"warc-{seed}"), real_pages

    def _record_id(self) -> str:
        return f"<urn:uuid:{uuid.UUID(int=self.rng.getrandbits(128), version=4)}>"

    def _response(self, page: dict, related: list[str]) -> bytes:
        draw = self.rng.random()
        if draw < NON_PAGE_SHARES["404"]:
            return b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\n\r\n<html><body>Not found</body></html>"
        if draw < sum(NON_PAGE_SHARES.values()):
            return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + page["text"].encode("utf-8")
        if draw < sum(NON_PAGE_SHARES.values()) + REAL_PAGE_SHARE:
            body, content_type = real_page_html(self.rng.choice(self.real_pages), page), "text/html"
        else:
            body, content_type = layout_html(page, related), "text/html; charset=utf-8"
        return f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n\r\n".encode() + body

    def __call__(self, path: Path, pages: list[dict]) -> None:
        with open(path, "wb") as f:
            info = {"url": "", "date": pages[0]["date"]}
            f.write(
                warc_member(
                    "warcinfo", info, self._record_id(), b"software: web_corpus.py\r\n", "application/warc-fields"
                )
            )
            for page in pages:
                related = [self.rng.choice(pages)["url"] for _ in range(RELATED_LINKS)]
                for kind, block, content_type in (
                    ("request", f"GET {page['url']} HTTP/1.1\r\n\r\n".encode(), "application/http; msgtype=request"),
                    ("response", self._response(page, related), "application/http; msgtype=response"),
                    ("metadata", b"fetchTimeMs: 120\r\n", "application/warc-fields"),
                ):
                    f.write(warc_member(kind, page, self._record_id(), block, content_type))


WRITERS = {
    "parquet": (".parquet", write_parquet),
    "zst": (".jsonl.zst", write_jsonl_zst),
    "jsonl": (".jsonl", write_jsonl),  # the baseline: the reader raw_records had before
    "warc": (".warc.gz", None),  # a WarcWriter: it needs the seed and the real pages
}


def build(
    out: Path,
    pages: int,
    seed: int,
    pages_per_file: int,
    formats: list[str],
    sentences: Path | None,
    real_pages: Path = REAL_PAGES,
) -> dict:
    """Writes the corpus to `out`; returns its figures."""
    t0 = time.perf_counter()
    maker = PageMaker(load_paragraphs(sentences), seed)
    writers = {fmt: write for fmt, (_, write) in WRITERS.items()}
    if "warc" in formats:
        writers["warc"] = WarcWriter(seed, load_real_pages(real_pages))
    out.mkdir(parents=True, exist_ok=True)
    files, languages, total_bytes = [], {}, 0
    for start in range(0, pages, pages_per_file):
        batch = [maker.page(n) for n in range(start, min(pages, start + pages_per_file))]
        fmt = formats[len(files) % len(formats)]
        path = out / f"web-{len(files):05d}{WRITERS[fmt][0]}"
        writers[fmt](path, batch)
        files.append(path.name)
        total_bytes += path.stat().st_size
        for p in batch:
            languages[p["language"]] = languages.get(p["language"], 0) + 1
    return {
        "pages": pages,
        "files": len(files),
        "bytes_on_disk": total_bytes,
        "languages": dict(sorted(languages.items(), key=lambda kv: -kv[1])),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def ingest_rates(out: Path, formats: list[str], repeats: int = 2) -> dict:
    """raw_records (ingest, one worker) on each format's files of `out`: records/s (best of `repeats`: the first
    run of a process pays imports and warm-up), and the ratio to plain .jsonl when it is one of the formats."""
    rates = {}
    for fmt in formats:
        ext = WRITERS[fmt][0]
        names = [p.name for p in sorted(out.iterdir()) if p.name.endswith(ext)]
        best = None
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                result = ingest(out, Path(tmp) / "raw", RawSettings(), workers=1, only=names)
                seconds = time.perf_counter() - t0
            best = seconds if best is None else min(best, seconds)
        rates[fmt] = {
            "records": result.docs_out,
            "rejected": result.rejected,
            "seconds": round(best, 2),
            "records_per_s": round(result.docs_out / best),
        }
    if "jsonl" in rates:
        for fmt in rates:
            rates[fmt]["vs_jsonl"] = round(rates[fmt]["records_per_s"] / rates["jsonl"]["records_per_s"], 2)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--pages", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pages-per-file", type=int, default=5000)
    ap.add_argument("--formats", nargs="+", choices=sorted(WRITERS), default=["parquet", "zst"])
    ap.add_argument("--sentences", type=Path, default=SENTENCES, help="folder of <iso code>.txt sentence files")
    ap.add_argument("--html", type=Path, default=REAL_PAGES, help="folder of real .html(.gz) pages for the WARC")
    ap.add_argument("--ingest", action="store_true", help="then read the corpus with raw_records, per format")
    args = ap.parse_args()
    figures = build(args.out, args.pages, args.seed, args.pages_per_file, args.formats, args.sentences, args.html)
    print(json.dumps(figures, ensure_ascii=False))
    if args.ingest:
        print(json.dumps(ingest_rates(args.out, args.formats)))


if __name__ == "__main__":
    main()
