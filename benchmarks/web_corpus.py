"""A web-scale benchmark corpus (50,000 pages and more) built from the real text reachable here, written in the
layouts web corpora ship: Parquet (FineWeb / Hugging Face datasets columns) and multi-frame .jsonl.zst (Dolma,
RedPajama). For benchmarks, never tests: nothing is downloaded, and the same --seed gives byte-identical files.

usage: python benchmarks/web_corpus.py OUT [--pages 50000] [--seed 0] [--pages-per-file 5000]
                                           [--formats parquet zst [jsonl]] [--sentences DIR] [--ingest]

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
lines) and, when --formats names it, plain web-NNNNN.jsonl (the baseline), taking turns, --pages-per-file pages each.
--ingest then reads each format's files with raw_records (ingest, one worker) and prints records/s and the ratio to
plain .jsonl.
"""

from __future__ import annotations

import argparse
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
from tokenmill.stages.raw.stream import zstd  # noqa: E402

CORPORA = REPO.parent / "shared" / "corpora"
SENTENCES = REPO / "benchmarks" / "data" / "langid-sentences"
POETRY_FILES = 3  # ~3,000 Tang poems: enough distinct Chinese paragraphs, read in well under a second
ROW_GROUP_ROWS = 1000  # FineWeb's files hold row groups of about this many pages
FRAME_LINES = 1000  # Dolma-style: the .jsonl.zst is a sequence of independent zstd frames
SITES = 2000
COPY_POOL = 5000  # earlier pages a copy is drawn from (a seeded reservoir: memory flat in --pages)
COPIES_AFTER = 100  # new pages before the first copy, so the first pages are not copies of one another
KINDS = {"new": 0.80, "near_copy": 0.08, "exact_copy": 0.07, "junk": 0.05}
LANGUAGE_SHARES = {"en": 0.45, "zh": 0.10}  # of the sites, about as on the web; the other languages share the rest
DUMPS = ("CC-MAIN-2023-50", "CC-MAIN-2024-10", "CC-MAIN-2024-18")
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


WRITERS = {
    "parquet": (".parquet", write_parquet),
    "zst": (".jsonl.zst", write_jsonl_zst),
    "jsonl": (".jsonl", write_jsonl),  # the baseline: the reader raw_records had before
}


def build(out: Path, pages: int, seed: int, pages_per_file: int, formats: list[str], sentences: Path | None) -> dict:
    """Writes the corpus to `out`; returns its figures."""
    t0 = time.perf_counter()
    maker = PageMaker(load_paragraphs(sentences), seed)
    out.mkdir(parents=True, exist_ok=True)
    files, languages, total_bytes = [], {}, 0
    for start in range(0, pages, pages_per_file):
        batch = [maker.page(n) for n in range(start, min(pages, start + pages_per_file))]
        ext, write = WRITERS[formats[len(files) % len(formats)]]
        path = out / f"web-{len(files):05d}{ext}"
        write(path, batch)
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
                stats = ingest(out, Path(tmp) / "raw", RawSettings(), workers=1, only=names)
                seconds = time.perf_counter() - t0
            best = seconds if best is None else min(best, seconds)
        rates[fmt] = {
            "records": stats["docs_out"],
            "rejected": stats["rejected"],
            "seconds": round(best, 2),
            "records_per_s": round(stats["docs_out"] / best),
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
    ap.add_argument("--ingest", action="store_true", help="then read the corpus with raw_records, per format")
    args = ap.parse_args()
    figures = build(args.out, args.pages, args.seed, args.pages_per_file, args.formats, args.sentences)
    print(json.dumps(figures, ensure_ascii=False))
    if args.ingest:
        print(json.dumps(ingest_rates(args.out, args.formats)))


if __name__ == "__main__":
    main()
