"""HTML -> main text: the payload decoded by its declared charset, then trafilatura's main-content extraction
(menus, footers, cookie banners dropped; one paragraph per line) and the page title.

trafilatura was chosen by benchmarks/bench_extract.py on scrapinghub's article-extraction-benchmark (181 pages,
the benchmark's own shingle F1): trafilatura 0.960 at ~39 pages/s per core, resiliparse 0.898 at ~500 pages/s. It runs
in its fast mode, without the readability/jusText fallbacks it otherwise retries short extractions with: F1 0.962
against 0.960 with them, at 1.4-1.5x the pages per CPU second.

Time per page grows with its element count (~0.5 ms per element, nesting does not matter: lxml caps the depth),
so a page is refused before extraction above `html_max_bytes` or `html_max_tags`. Deterministic caps rather than
a wall-clock timeout: a timeout would make the output depend on the machine's load, and signals only reach a
process's main thread, which a worker task need not run in.
"""

from __future__ import annotations

import codecs
import html as html_escapes
import re
from dataclasses import dataclass

import trafilatura

from tokenmill.stages.raw.stream import Rejected

# WHATWG's encoding labels: browsers decode these declared charsets (Python codec names) with a superset, as we do
CHARSET_SUPERSETS = {"gb2312": "gb18030", "gbk": "gb18030", "iso8859-1": "cp1252", "ascii": "cp1252"}
META_SCAN_BYTES = 4096  # <meta charset> must sit in the first 1024 bytes by the HTML spec; pages stray further
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
# the <title> element, read by us: trafilatura's metadata pass (dates, authors) costs 4x its text extraction
TITLE_SCAN_CHARS = 1 << 16
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class PageText:
    text: str
    """Main text, one paragraph per line."""
    title: str | None


def _codec(label: str | None) -> str | None:
    """The Python codec for a declared charset label, None when unknown or absent."""
    if not label:
        return None
    label = label.strip().strip("\"'").lower()
    try:
        name = codecs.lookup(label).name
    except LookupError:
        return None
    return CHARSET_SUPERSETS.get(name, name)


def declared_charset(payload: bytes, http_charset: str | None) -> str | None:
    """The codec the page declares: the HTTP Content-Type charset first, then a <meta> charset near the top."""
    codec = _codec(http_charset)
    if codec is None:
        m = _META_CHARSET.search(payload, 0, META_SCAN_BYTES)
        codec = _codec(m.group(1).decode("ascii")) if m else None
    return codec


def decode_html(payload: bytes, http_charset: str | None = None) -> str:
    """The page as text: a byte order mark wins, then the declared charset, then UTF-8 (pages often declare a
    charset they are not in); raises Rejected('undecodable_bytes') naming what was tried when none fits."""
    if payload.startswith(codecs.BOM_UTF8):
        payload, tried = payload[3:], ["utf-8"]
    else:
        tried = list(dict.fromkeys(c for c in (declared_charset(payload, http_charset), "utf-8") if c))
    for codec in tried:
        try:
            return payload.decode(codec)
        except UnicodeDecodeError as e:
            error = e
    raise Rejected(
        "undecodable_bytes", f"not {' nor '.join(tried)} at byte {error.start} of the payload: {error.reason}"
    )


def extract_page(html: str, max_tags: int) -> PageText:
    """The main text and title of a decoded page; raises Rejected: 'record_too_large' above `max_tags` elements,
    'extraction_failed' when the extractor raises, 'extraction_empty' when it finds no main text."""
    tags = html.count("<")
    if tags > max_tags:
        raise Rejected("record_too_large", f"{tags} tags, more than html_max_tags ({max_tags}); not extracted")
    try:
        text = trafilatura.extract(html, include_comments=False, fast=True)
    except Exception as e:  # a third-party parser on hostile input: any error is this page's, never the run's
        raise Rejected("extraction_failed", f"{type(e).__name__}: {e}") from None
    if not text or not text.strip():
        raise Rejected("extraction_empty", "no main text found (the page is navigation, a form or empty)")
    return PageText(text, page_title(html))


def page_title(html: str) -> str | None:
    """The text of the page's <title> element (entities resolved, whitespace collapsed), None when absent."""
    m = _TITLE.search(html, 0, TITLE_SCAN_CHARS)
    title = " ".join(html_escapes.unescape(m.group(1)).split()) if m else ""
    return title or None


def page_text(payload: bytes, http_charset: str | None, max_bytes: int, max_tags: int) -> PageText:
    """An HTML payload -> its main text and title, or Rejected (too large, undecodable, nothing extracted)."""
    if len(payload) > max_bytes:
        raise Rejected(
            "record_too_large", f"HTML of {len(payload)} bytes, more than html_max_bytes ({max_bytes}); not extracted"
        )
    return extract_page(decode_html(payload, http_charset), max_tags)
