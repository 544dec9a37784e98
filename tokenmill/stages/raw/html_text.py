"""HTML -> main text: the payload decoded by its declared charset, then the main content extracted (menus,
footers, cookie banners dropped; one block per line) by the extractor raw_records names, and the page title.

    tokenmill     ours (stages/raw/extract.py), the default: on WCXB's dev split (1,497 pages of 7 kinds) word F1
                  0.85 against 0.79 for trafilatura's fast mode, at ~5x its pages per CPU second
    trafilatura   trafilatura's fast mode (no readability/jusText fallbacks), the extractor before ours
    resiliparse   Resiliparse's main-content plain text
benchmarks/bench_extract.py measures all of them. The other two come with the `extractors` extra.

Time per page grows with its bytes and element count (nesting does not matter: lxml caps the depth at 256), so a
page is refused before extraction above `html_max_bytes` or `html_max_tags`. Deterministic caps rather than a
wall-clock timeout: a timeout would make the output depend on the machine's load, and signals only reach a
process's main thread, which a worker task need not run in.
"""

from __future__ import annotations

import codecs
import functools
import html as html_escapes
import importlib.metadata
import re
from collections.abc import Callable
from dataclasses import dataclass

from tokenmill.stages.raw import extract
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Rejected

# WHATWG's encoding labels: browsers decode these declared charsets (Python codec names) with a superset, as we do
CHARSET_SUPERSETS = {"gb2312": "gb18030", "gbk": "gb18030", "iso8859-1": "cp1252", "ascii": "cp1252"}
META_SCAN_BYTES = 4096  # <meta charset> must sit in the first 1024 bytes by the HTML spec; pages stray further
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
# the <title> element, read by a regex whatever the extractor: trafilatura's metadata pass costs 4x its extraction
TITLE_SCAN_CHARS = 1 << 16
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)


SHAPE_SHARE = 0.4  # of a page's text in table rows or list items that makes it a table or a list page
SHORT_PAGE_CHARS = 500


@dataclass(frozen=True)
class PageText:
    text: str
    """Main text, one block per line."""
    meta: dict
    """The record's meta from the page: its title (when it has one), the extractor and its version."""
    shape: str
    """What the text is mostly made of: 'prose', 'list', 'table' or 'short' (raw_records counts pages by it)."""


def _tokenmill(html: str) -> str:
    return extract.main_text(html)


def _trafilatura(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, include_comments=False, fast=True) or ""


def _resiliparse(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    return extract_plain_text(HTMLTree.parse(html), main_content=True)


EXTRACTORS: dict[str, Callable[[str], str]] = {
    "tokenmill": _tokenmill,
    "trafilatura": _trafilatura,
    "resiliparse": _resiliparse,
}


@functools.cache
def extractor_version(name: str) -> str:
    """The version recorded with each page: extract.VERSION for ours, the installed package's for the others."""
    return extract.VERSION if name == "tokenmill" else importlib.metadata.version(name)


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


def extract_page(html: str, settings: RawSettings) -> PageText:
    """The main text, title and shape of a decoded page; raises Rejected: 'record_too_large' above
    html_max_tags elements, 'extraction_failed' when the extractor raises, 'extraction_empty' when it finds no
    main text."""
    tags = html.count("<")
    if tags > settings.html_max_tags:
        raise Rejected(
            "record_too_large", f"{tags} tags, more than html_max_tags ({settings.html_max_tags}); not extracted"
        )
    try:
        text = EXTRACTORS[settings.extractor](html)
    except Exception as e:  # a parser on hostile input: any error is this page's, never the run's
        raise Rejected("extraction_failed", f"{type(e).__name__}: {e}") from None
    if not text or not text.strip():
        raise Rejected("extraction_empty", "no main text found (the page is navigation, a form or empty)")
    meta = {"extractor": settings.extractor, "extractor_version": extractor_version(settings.extractor)}
    title = page_title(html)
    return PageText(text, {"title": title, **meta} if title else meta, page_shape(text))


def page_title(html: str) -> str | None:
    """The text of the page's <title> element (entities resolved, whitespace collapsed), None when absent."""
    m = _TITLE.search(html, 0, TITLE_SCAN_CHARS)
    title = " ".join(html_escapes.unescape(m.group(1)).split()) if m else ""
    return title or None


def page_shape(text: str) -> str:
    """'table' or 'list' when SHAPE_SHARE of the text is table rows (tab-separated cells) or list items ("- "),
    'short' under SHORT_PAGE_CHARS, else 'prose'."""
    rows = items = 0
    for line in text.split("\n"):
        if "\t" in line:
            rows += len(line)
        elif line.startswith("- "):
            items += len(line)
    if rows >= SHAPE_SHARE * len(text):
        return "table"
    if items >= SHAPE_SHARE * len(text):
        return "list"
    return "short" if len(text) < SHORT_PAGE_CHARS else "prose"


def page_text(payload: bytes, http_charset: str | None, settings: RawSettings) -> PageText:
    """An HTML payload -> its main text and title, or Rejected (too large, undecodable, nothing extracted)."""
    if len(payload) > settings.html_max_bytes:
        raise Rejected(
            "record_too_large",
            f"HTML of {len(payload)} bytes, more than html_max_bytes ({settings.html_max_bytes}); not extracted",
        )
    return extract_page(decode_html(payload, http_charset), settings)
