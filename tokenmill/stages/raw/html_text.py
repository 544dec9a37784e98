"""HTML -> main text: the payload decoded by its charset (decode_page: as browsers find it, detected when the page
lies), then the main content extracted (menus, footers, cookie banners dropped; one block per line) by the extractor
raw_records names, and the page title.

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
from dataclasses import dataclass, replace

import charset_normalizer

from tokenmill.stages.raw import extract
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Rejected

# WHATWG's encoding labels: browsers decode these declared charsets (Python codec names) with a superset, as we do
CHARSET_SUPERSETS = {"gb2312": "gb18030", "gbk": "gb18030", "iso8859-1": "cp1252", "ascii": "cp1252"}
META_SCAN_BYTES = 4096  # <meta charset> must sit in the first 1024 bytes by the HTML spec; pages stray further
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
NOT_PAGE_CODECS = {"idna", "punycode", "undefined", "unicode-escape", "raw-unicode-escape", "utf-7"}
# a header declaring UTF-16/32 for bytes with no NUL among the first of these is no declaration: markup in UTF-16
# is every other byte NUL
UTF16_SNIFF_BYTES = 64
BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
# What charset-normalizer may answer: the legacy encodings WHATWG lists (its Shift_JIS, EUC-KR and Big5 are
# Microsoft's and Hong Kong's supersets) but the Mac ones, which it ranked first for 14% of German and 63% of Finnish
# pages of benchmarks/data/langid-sentences; not the DOS, EBCDIC and UTF-16/32 codecs no web page is in. Latin ones
# apart: a Latin page is read as windows-1252 when that reads it as well (no more mess): the web's Latin pages are
# mostly windows-1252, and the detector's letter statistics do not tell the Latin charsets apart (it ranks cp1250 or
# cp1257 first for 25-30% of French and Portuguese pages)
DETECTABLE_LATIN = (
    "cp1252", "cp1250", "cp1254", "cp1257", "cp1258", "iso8859_2", "iso8859_3", "iso8859_4", "iso8859_10",
    "iso8859_13", "iso8859_14", "iso8859_15", "iso8859_16",
)  # fmt: skip
DETECTABLE = DETECTABLE_LATIN + (
    "utf_8", "cp1251", "cp1253", "cp1255", "cp1256", "cp874", "cp866", "iso8859_5", "iso8859_6", "iso8859_7",
    "iso8859_8", "koi8_r", "koi8_u", "gb18030", "big5hkscs", "euc_jp", "iso2022_jp", "cp932", "cp949",
)  # fmt: skip
# a detected superset is tried after the standard codec it extends, which reads a few characters as browsers do
# (Shift_JIS 0x8160 is the wave dash 〜, cp932's the fullwidth tilde ～)
EXTENDED = {"cp932": "shift_jis"}
SAME_MESS = 0.01  # charset-normalizer's mess ratios this close rate two readings alike
# the detector reads the first DETECT_SAMPLE_BYTES (cut at a line or tag start, which splits no multibyte
# character): it decodes what it is given in every candidate charset, 0.2 s for a 1.4 MB page
DETECT_SAMPLE_BYTES = 1 << 16
# fewer non-ASCII bytes than this, and a detector's answer of a non-Latin script is a guess: 6 bytes of "Москва"
# come out as Big5; Latin pages are told from fewer (a few accents among ASCII letters)
DETECT_MIN_BYTES = 32
# A page read in a Latin charset is plainly mis-decoded when most of its non-ASCII characters come in runs
# ("Ìîñêâà", "±‚ñ‚É"): Latin languages put an accented letter between plain ones ("café crème")
MISREAD_LATIN = {"cp1252", "iso8859-15"}
MISREAD_MIN_CHARS = DETECT_MIN_BYTES  # in runs: enough to detect the right charset by
MISREAD_SHARE = 0.5
MISREAD_SCAN_CHARS = 1 << 16  # a misread page is misread throughout: its start tells
_NON_ASCII_RUN = re.compile("[^\x00-\x7f\xa0]+")  # a no-break space sits beside accents in any language
_LATIN_LETTER = re.compile("[\u00c0-\u024f\u1e00-\u1eff]")
_OTHER_SCRIPT = re.compile("[\u0370-\u1dff\u2e80-\ufffc]")  # Greek to Mongolian; CJK, kana, Hangul and beyond
_HIGH_BYTES = bytes(range(0x80, 0x100))
# a payload that does not decode is damaged UTF-8, not another charset, when UTF-8 reads at least this many
# non-ASCII characters per invalid sequence: legacy CJK text reads as at most 0.54 (EUC-JP), Cyrillic as 0
DAMAGED_UTF8_RATIO = 2
DETECTOR = f"charset-normalizer {charset_normalizer.__version__}"
# meta.charset_source: how meta.charset (the Python codec that decoded the page) was chosen
CHARSET_SOURCES = {
    "bom": "by its byte order mark",
    "http": "declared in the HTTP Content-Type header",
    "meta": "declared in its <meta charset>",
    "default": "UTF-8, nothing usable declared",
    "detected": "detected: the declared charset failed or plainly mis-decoded, or none was declared and the page is "
    "not UTF-8 (or is UTF-8 declared otherwise)",
}
# the <title> element, read by a regex whatever the extractor: trafilatura's metadata pass costs 4x its extraction
TITLE_SCAN_CHARS = 1 << 16
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)


SHAPE_SHARE = 0.4  # of a page's text in table rows or list items that makes it a table or a list page
SHORT_PAGE_CHARS = 500


@dataclass(frozen=True, kw_only=True)
class PageText:
    text: str
    """Main text, one block per line."""
    meta: dict
    """The record's meta from the page: its title (when it has one), the extractor and its version, the charset
    that decoded it and how it was chosen (page_text)."""
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


@functools.lru_cache(maxsize=1024)  # a crawl repeats a few labels; hostile ones cannot grow it without bound
def _codec(label: str | None) -> str | None:
    """The Python codec for a declared charset label, None when unknown, absent or no page's charset: Python's
    bytes-to-bytes codecs (base64, zlib, ...) and text codecs no browser decodes a page with (NOT_PAGE_CODECS:
    UTF-7 is an XSS vector, the others are no charsets)."""
    if not label:
        return None
    label = label.strip().strip("\"'").lower()
    try:
        name = codecs.lookup(label).name
        if name in NOT_PAGE_CODECS:
            return None
        b"<".decode(name, "ignore")  # bytes-to-bytes codecs raise LookupError here
    except LookupError:
        return None
    return CHARSET_SUPERSETS.get(name, name)


@functools.cache
def _ascii_compatible(codec: str) -> bool:
    """Whether ASCII bytes read as themselves in `codec` (not in UTF-16/32)."""
    return b"<html>".decode(codec, "replace") == "<html>"


def _declaration(payload: bytes, http_charset: str | None) -> tuple[str | None, str, int]:
    """The declared codec (None when none is usable), where it is declared ('bom', 'http', else 'meta') and where
    the text starts (after a BOM). A <meta> naming UTF-16 is no declaration (WHATWG): it was found by reading the
    bytes as ASCII; nor is a header naming it for bytes that are plainly not (UTF16_SNIFF_BYTES)."""
    for bom, bom_codec in BOMS:
        if payload.startswith(bom):
            return bom_codec, "bom", len(bom)
    codec = _codec(http_charset)
    if codec is not None and (_ascii_compatible(codec) or b"\x00" in payload[:UTF16_SNIFF_BYTES]):
        return codec, "http", 0
    m = _META_CHARSET.search(payload, 0, META_SCAN_BYTES)
    codec = _codec(m.group(1).decode("ascii")) if m else None
    return (codec if codec and _ascii_compatible(codec) else None), "meta", 0


def declared_charset(payload: bytes, http_charset: str | None) -> str | None:
    """The codec the page declares: its byte order mark, the HTTP Content-Type charset, then a <meta> charset near
    the top."""
    return _declaration(payload, http_charset)[0]


@dataclass(frozen=True, kw_only=True)
class Decoded:
    text: str
    charset: str
    """The Python codec that decoded the page: payload.decode(charset) (after a BOM) gives the text again."""
    source: str
    """How the charset was chosen, a key of CHARSET_SOURCES."""


def decode_page(payload: bytes, http_charset: str | None = None) -> Decoded:
    """The page as text, decoded as browsers do: by its byte order mark, else the HTTP charset, else its
    <meta charset>, else UTF-8; detected from the bytes (charset-normalizer) when that fails or plainly
    mis-decodes (misread_latin). Valid UTF-8 beyond ASCII is taken as UTF-8 whatever is declared: legacy text is
    not valid UTF-8 by chance. Raises Rejected('undecodable_bytes') naming what was tried when nothing fits."""
    declared, source, start = _declaration(payload, http_charset)
    payload = payload[start:]
    tried = []
    if declared is None or (
        source != "bom" and declared != "utf-8" and not payload.isascii() and _ascii_compatible(declared)
    ):
        try:
            return Decoded(
                text=payload.decode("utf-8"),
                charset="utf-8",
                source="default" if declared is None else "detected",
            )
        except UnicodeDecodeError as e:
            tried.append(f"utf-8 (at byte {e.start}: {e.reason})")
    if declared is not None:
        try:
            text = payload.decode(declared)
        except UnicodeDecodeError as e:
            tried.append(f"{declared}, {CHARSET_SOURCES[source]} (at byte {e.start}: {e.reason})")
        else:
            if declared in MISREAD_LATIN and misread_latin(text):
                found = _detect(payload)
                if found is not None and _other_script(found.text):
                    return found
            return Decoded(text=text, charset=declared, source=source)
    found, why = _detect_undecoded(payload)
    if found is None:
        raise Rejected("undecodable_bytes", f"not {' nor '.join(tried)}; {why}")
    return found


def decode_html(payload: bytes, http_charset: str | None = None) -> str:
    """The page as text (decode_page)."""
    return decode_page(payload, http_charset).text


def misread_latin(text: str) -> bool:
    """Whether text read in a Latin charset is plainly another's: at least MISREAD_MIN_CHARS of its non-ASCII
    characters, and MISREAD_SHARE of them, in runs of two or more."""
    runs = [len(run) for run in _NON_ASCII_RUN.findall(text, 0, MISREAD_SCAN_CHARS)]
    paired = sum(n for n in runs if n > 1)
    return paired >= MISREAD_MIN_CHARS and paired >= MISREAD_SHARE * sum(runs)


def _other_script(text: str) -> bool:
    """Whether text's non-ASCII letters are mostly of a script other than Latin (Cyrillic, Greek, CJK, ...)."""
    scan = text[:MISREAD_SCAN_CHARS]
    return len(_OTHER_SCRIPT.findall(scan)) > len(_LATIN_LETTER.findall(scan))


def _detect_undecoded(payload: bytes) -> tuple[Decoded | None, str]:
    """The charset detected for a payload its declared charset and UTF-8 do not decode, or None and why not:
    it is UTF-8 with a few invalid bytes (read as any other charset, its text would be garbled), the detector finds
    nothing, or it reads too few non-ASCII bytes as a script other than Latin to be more than a guess."""
    high = len(payload) - len(payload.translate(None, _HIGH_BYTES))
    text = payload.decode("utf-8", "replace")
    invalid = text.count("\ufffd")
    valid = len(text) - (len(payload) - high) - invalid  # the non-ASCII characters UTF-8 decodes
    if invalid and valid >= DAMAGED_UTF8_RATIO * invalid:
        return None, f"UTF-8 with {invalid} invalid sequences among {valid} characters, not another charset"
    found = _detect(payload)
    if found is None:
        return None, f"{DETECTOR} finds no charset that decodes it"
    if high < DETECT_MIN_BYTES and _other_script(found.text):
        return None, f"{high} non-ASCII bytes (fewer than {DETECT_MIN_BYTES}) are too few to tell {found.charset} by"
    return found, ""


def _detect(payload: bytes) -> Decoded | None:
    """The charset charset-normalizer finds (of DETECTABLE; windows-1252 for a Latin page it reads as well) that
    decodes the whole payload, None when none does."""
    sample = payload[:DETECT_SAMPLE_BYTES]
    cut = max(sample.rfind(b"\n"), sample.rfind(b"<")) if len(payload) > DETECT_SAMPLE_BYTES else -1
    if cut > 0:
        sample = sample[:cut]
    matches = charset_normalizer.from_bytes(sample, cp_isolation=list(DETECTABLE), preemptive_behaviour=False)
    if not matches:
        return None
    best = matches[0]
    names = [m.encoding for m in matches]
    if best.encoding in DETECTABLE_LATIN and any(
        "cp1252" in m.could_be_from_charset and m.chaos <= best.chaos + SAME_MESS for m in matches
    ):
        names.insert(0, "cp1252")
    for name in names:
        for codec in filter(None, (EXTENDED.get(name), name)):
            try:
                return Decoded(text=payload.decode(codec), charset=codecs.lookup(codec).name, source="detected")
            except UnicodeDecodeError:
                continue
    return None


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
    return PageText(text=text, meta={"title": title, **meta} if title else meta, shape=page_shape(text))


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
    decoded = decode_page(payload, http_charset)
    page = extract_page(decoded.text, settings)
    return replace(page, meta=page.meta | {"charset": decoded.charset, "charset_source": decoded.source})
