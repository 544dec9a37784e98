"""The per-record rules of the cleaning stage: text repair, metadata extraction and garbage filters.

Each rule is a plain function on one text (or text + meta), so a test can prove it alone; `clean.py`
applies them in the documented order and `boilerplate.py` holds the corpus-wide line rule.

Repair rules return the new text plus a count of what they changed; filters return None (keep) or
(reason, detail).
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter

try:
    from _collections import _count_elements
except ImportError:  # another Python implementation: the pure-Python helper has the same signature
    from collections import _count_elements

# --------------------------------------------------------------------------------------------- repair

SURROGATE_RE = re.compile(r"[\ud800-\udfff]")
# Latin-1 range or an HTML entity: what UTF-8 mojibake (UTF-8 bytes decoded as cp1252/latin-1) always contains.
MOJIBAKE_HINT_RE = re.compile(r"[\u0080-\u00ff]|&#?\w+;")
# control characters (tab and newline kept, CR handled by whitespace), zero-width space/no-break space (BOM),
# word joiner, direction marks and embeddings. ZWJ/ZWNJ (U+200C/D) are kept: emoji sequences, Persian and
# Indic scripts need them.
CONTROL_RE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]")
# line breaks other than \n: CRLF, CR, vertical tab, form feed, NEL, line/paragraph separators
LINEBREAK_RE = re.compile(r"\r\n?|[\x0b\x0c\x85\u2028\u2029]")
# exotic spaces become a plain space; U+3000 (ideographic space) is kept: CJK verse uses it for indentation
SPACE_RE = re.compile(r"[\u00a0\u1680\u2000-\u200a\u202f\u205f]")
TRAILING_WS_RE = re.compile(r"[ \t\u3000]+$", re.M)
BLANK_RUN_RE = re.compile(r"\n{3,}")

_FTFY_CONFIG = None


def _ftfy_config():
    """ftfy fixes encodings only: width, quotes, line breaks and normalization stay ours (CJK full-width
    punctuation such as ，。！ must not be turned into ASCII)."""
    global _FTFY_CONFIG
    if _FTFY_CONFIG is None:
        import ftfy  # imported lazily: most records never need it

        _FTFY_CONFIG = ftfy.TextFixerConfig(
            unescape_html="auto", remove_terminal_escapes=True, fix_encoding=True, restore_byte_a0=True,
            replace_lossy_sequences=True, decode_inconsistent_utf8=True, fix_c1_controls=True,
            fix_latin_ligatures=False, fix_character_width=False, uncurl_quotes=False, fix_line_breaks=False,
            fix_surrogates=True, remove_control_chars=False, normalization=None, explain=False)
    return _FTFY_CONFIG


def needs_repair(text: str) -> bool:
    """True when `text` may hold anything the repair rules change. A few C-speed string tests (~1.5 us a poem):
    most clean text skips ftfy, the control-character pass and the whitespace pass."""
    if not text.replace("\n", "").isprintable():  # controls, tab, CR, format chars, exotic spaces, surrogates
        return True
    if " \n" in text or "\n\n\n" in text or "&" in text or text[:1] in " \n" or text[-1:] in " \n":
        return True
    if not text.isascii():
        b = text.encode("utf-8")
        return b"\xc2" in b or b"\xc3" in b  # lead bytes of U+0080..U+00FF: the raw material of mojibake
    return False


def repair_surrogates(text: str) -> tuple[str, int]:
    """Removes lone UTF-16 surrogates (e.g. a JSON "\\ud800" with no partner): they cannot be encoded to UTF-8."""
    try:
        text.encode("utf-8")
        return text, 0
    except UnicodeEncodeError:
        fixed, n = SURROGATE_RE.subn("", text)
        return fixed, n


def repair_mojibake(text: str) -> tuple[str, int]:
    """Repairs UTF-8 decoded with the wrong codec ("Ã©tÃ©" -> "été") and HTML entities, via ftfy. Returns 1
    when the text changed."""
    if MOJIBAKE_HINT_RE.search(text) is None:
        return text, 0
    import ftfy

    fixed = ftfy.fix_text(text, _ftfy_config())
    return fixed, int(fixed != text)


def normalize_unicode(text: str, form: str = "NFC") -> str:
    """Unicode normalization: "NFC" (default: composes, keeps full-width CJK punctuation), "NFKC" (also folds
    compatibility forms: full-width ASCII, ligatures, circled digits), or "none"."""
    if form == "none" or unicodedata.is_normalized(form, text):
        return text
    return unicodedata.normalize(form, text)


def strip_control_chars(text: str) -> tuple[str, int]:
    """Removes control and zero-width characters (keeps \\t, \\n and the joiners U+200C/U+200D)."""
    return CONTROL_RE.subn("", text)


def normalize_whitespace(text: str) -> str:
    """Line endings to \\n, exotic spaces to ' ', no trailing spaces, at most one blank line in a row, no
    leading/trailing blank lines. Leading indentation of a line is kept (verse and code use it)."""
    text = LINEBREAK_RE.sub("\n", text)
    text = SPACE_RE.sub(" ", text)
    text = TRAILING_WS_RE.sub("", text)
    text = BLANK_RUN_RE.sub("\n\n", text)
    return text.strip("\n")


def meta_value_needs_cleaning(value: str, form: str = "NFC") -> bool:
    return needs_repair(value) or (form != "none" and not unicodedata.is_normalized(form, value))


def clean_meta_value(value, form: str = "NFC"):
    """Meta strings get the text's repair: no surrogates, no control characters, normalized, stripped."""
    if not isinstance(value, str):
        return value
    if needs_repair(value):
        value, _ = repair_surrogates(value)
        value, _ = strip_control_chars(value)
        value = value.strip()
    return normalize_unicode(value, form)


# --------------------------------------------------------------------------------------------- metadata

# header lines at the top of a text: "Title: ...", "作者：..." (label -> meta key)
META_LABELS = {
    "title": "title", "标题": "title", "標題": "title", "题目": "title", "題目": "title", "诗名": "title",
    "詩名": "title", "篇名": "title", "词牌": "title", "詞牌": "title",
    "author": "author", "作者": "author", "poet": "author", "writer": "author", "诗人": "author", "詩人": "author",
    "dynasty": "dynasty", "朝代": "dynasty", "年代": "dynasty", "时代": "dynasty", "時代": "dynasty",
    "date": "date", "日期": "date", "published": "date", "时间": "date", "時間": "date", "发布时间": "date",
    "source": "source", "来源": "source", "來源": "source", "出处": "source", "出處": "source",
    "url": "url", "链接": "url", "tags": "tags", "标签": "tags", "category": "category", "分类": "category",
}
META_LINE_RE = re.compile(
    r"^\s*(?:[#*>]+\s*)?(" + "|".join(sorted(map(re.escape, META_LABELS), key=len, reverse=True))
    + r")\s*[:：]\s*(.{1,200}?)\s*$", re.I)
BY_LINE_RE = re.compile(r"^\s*(?:[Bb]y|[Ww]ritten [Bb]y)\s+([A-Z][\w.'\-]*(?:\s+[A-Z][\w.'\-]*){0,3})\s*$")
# "〔唐〕李白", "[宋] 苏轼", "（唐）王维": dynasty + author on one line
DYNASTY_AUTHOR_RE = re.compile(r"^\s*[\[〔【（(]\s*(\S{1,3})\s*[\]〕】）)]\s*(\S{1,8})\s*$")
META_KEYS_FROM_READER = {"title": ("title", "rhythmic", "name"), "author": ("author", "authors", "writer", "poet"),
                         "dynasty": ("dynasty",), "date": ("date",)}


def extract_metadata(text: str, meta: dict, max_header_lines: int = 6) -> tuple[str, dict, int]:
    """Moves title/author/dynasty/date/source header lines out of the top of `text` into `meta`.

    Only the leading block of lines is looked at (at most `max_header_lines`, stopping at the first line that
    is not a header), so a "Title:" inside the body stays. A leading line equal to the title or author the
    reader already found is dropped as a repeat of that field. A value the reader found wins over one from the
    text (the text's value is then discarded). Returns (text, meta, number of lines moved).
    """
    if not text:
        return text, meta, 0
    cut = text.find("\n")
    first = text if cut < 0 else text[:cut]
    if not (":" in first or "：" in first or first[:1] in "[〔【（(" or first[:3].lower() in ("by ", "wri")):
        fs = first.strip()
        if fs != meta.get("title") and fs != meta.get("author"):
            return text, meta, 0  # fast path: the first line is no header (nearly every text)
    lines = text.split("\n", max_header_lines)
    known = {meta.get(k) for keys in META_KEYS_FROM_READER.values() for k in keys if isinstance(meta.get(k), str)}
    known.discard("")
    moved, found = 0, {}
    for i, line in enumerate(lines[:max_header_lines]):
        s = line.strip()
        if not s:
            if moved:
                moved += 1  # a blank line right after a header block goes with it
                continue
            break
        m = META_LINE_RE.match(s)
        if m:
            found.setdefault(META_LABELS[m.group(1).lower()], m.group(2))
        elif s in known:
            pass  # the reader's title/author repeated as the first lines
        elif i == moved and (bm := BY_LINE_RE.match(s)) and "author" not in found:
            found["author"] = bm.group(1)
        elif (dm := DYNASTY_AUTHOR_RE.match(s)) and i == moved and moved and "author" not in found:
            found.setdefault("dynasty", dm.group(1))
            found["author"] = dm.group(2)
        else:
            break
        moved = i + 1
    if not moved:
        return text, meta, 0
    body = "\n".join(lines[moved:]).lstrip("\n")
    if not body.strip():
        return text, meta, 0  # a text that is only header lines is left alone (the filters will judge it)
    meta = dict(meta)
    for k, v in found.items():
        if not (isinstance(meta.get(k), str) and meta[k].strip()):
            meta[k] = v
    return body, meta, moved


# --------------------------------------------------------------------------------------------- filters

PLACEHOLDER_RE = re.compile(r"[\ufffd\u25a1\u25a0\u25a2\u25af\u25fb\u25fc\u2b1c\u2b1b\ue000-\uf8ff"
                            r"\U000f0000-\U0010ffff]|\?{2,}|(?<=\w)\?(?=\w)|囗{2,}")
PRIVATE_OR_BOX_RE = re.compile(r"[\u25a2\u25af\u25fb\u25fc\u2b1c\u2b1b\ue000-\uf8ff\U000f0000-\U0010ffff]")
CJK_CHARS_PER_WORD = 1.6  # n-gram checks start at min_tokens words, i.e. about 80 CJK characters for 50 words


def count_chars(text: str) -> int:
    """Characters that are not whitespace."""
    return len(text) - sum(map(text.count, (" ", "\n", "\t", "\u3000")))


def check_empty(text: str):
    if not text.strip():
        return "empty", "no text left after cleaning"
    return None


def check_too_short(text: str, min_chars: int):
    n = count_chars(text)
    if n < min_chars:
        return "too_short", f"{n} chars < min_chars {min_chars}"
    return None


def check_too_long(text: str, max_chars: int):
    if max_chars and len(text) > max_chars:
        return "too_long", f"{len(text)} chars > max_chars {max_chars}"
    return None


def placeholder_ratio(text: str) -> float:
    """Share of non-space characters that are placeholders or garbage: U+FFFD, □ ■ and kin, private-use
    characters, runs of '?' and a '?' stuck inside a word ("wh?t", "明?光": a character lost in transcoding)."""
    bad = 0
    for m in PLACEHOLDER_RE.finditer(text):
        bad += len(m.group())
    return bad / max(1, count_chars(text))


def _maybe_placeholders(text: str) -> bool:
    """Cheap test that there may be placeholder glyphs at all (`in` and max() run at C speed)."""
    return ("\ufffd" in text or "?" in text or "\u25a1" in text or "\u25a0" in text or "囗囗" in text
            or PRIVATE_OR_BOX_RE.search(text) is not None)


def check_placeholder_glyphs(text: str, max_ratio: float):
    if not text or not _maybe_placeholders(text) or PLACEHOLDER_RE.search(text) is None:
        return None
    r = placeholder_ratio(text)
    if r > max_ratio:
        return "placeholder_glyphs", f"placeholder ratio {r:.3f} > {max_ratio}"
    return None


def tokens_of(text: str) -> list[str] | str:
    """Tokens for the repetition statistics: lower-cased whitespace-separated words, or, for text written mostly
    without spaces (CJK: over 2 UTF-8 bytes a character), its characters without whitespace, returned as one
    string. Punctuation stays in both (dropping it costs a regex pass over every text for little change)."""
    if not text.isascii() and len(text.encode("utf-8")) > 2 * len(text):
        return "".join(text.split())
    return text.lower().split()


def repetition_stats(text: str, ngram_ns=(2, 3, 4), thresholds=None, min_tokens: int = 0) -> dict:
    """Gopher-style repetition figures: duplicate-line fraction (by lines and by characters) and, for each n,
    the share of tokens covered by the most frequent n-gram (texts of `min_tokens` tokens or more).
    With `thresholds` (n -> limit) the n-gram counts are skipped where a cheap bound proves they stay under it."""
    raw_lines = text.split("\n")
    if len(set(raw_lines)) == len(raw_lines):  # no line repeats (the common case): skip the per-line work
        lines = raw_lines if all(raw_lines) else [ln for ln in raw_lines if ln.strip()]
        out = {"lines": len(lines), "dup_line_frac": 0.0, "dup_line_char_frac": 0.0}
        return _ngram_stats(text, out, ngram_ns, thresholds, min_tokens)
    lines = [s for s in (ln.strip() for ln in raw_lines) if s]
    seen, dup_lines, dup_chars = set(), 0, 0
    for s in lines:
        if s in seen:
            dup_lines += 1
            dup_chars += len(s)
        else:
            seen.add(s)
    total_line_chars = sum(map(len, lines)) or 1
    out = {"lines": len(lines), "dup_line_frac": dup_lines / max(1, len(lines)),
           "dup_line_char_frac": dup_chars / total_line_chars}
    return _ngram_stats(text, out, ngram_ns, thresholds, min_tokens)


def _ngram_stats(text: str, out: dict, ngram_ns, thresholds, min_tokens: int) -> dict:
    """Adds top_<n>gram_frac: the share of tokens covered by the most frequent n-gram (k occurrences cover
    k * n tokens; capped at 1). Gopher measures characters; tokens make the bound below exact and cheap."""
    if len(text) < min_tokens or (text.isascii() and text.count(" ") + text.count("\n") + 1 < min_tokens):
        return out  # cannot hold min_tokens tokens: skip the tokenizer
    toks = tokens_of(text)
    if isinstance(toks, str) and len(toks) < CJK_CHARS_PER_WORD * min_tokens:
        return out
    total = len(toks)
    if total < max(min_tokens, 2):
        return out
    counts: dict = {}
    _count_elements(counts, toks)  # Counter's C core without its Python wrapper: ~2 us less per text
    top1 = max(counts.values())
    for n in ngram_ns:
        if total < n + 1:
            continue
        # an n-gram occurs at most as often as the commonest token: k*n/N <= top1*n/N (C-speed Counter above)
        if thresholds is not None and top1 * n / total <= thresholds.get(n, 1.0):
            continue
        if isinstance(toks, str):
            grams = Counter(map(toks.__getitem__, map(slice, range(total - n + 1), range(n, total + 1))))
        else:
            grams = Counter(zip(*[toks[i:] for i in range(n)]))
        k = max(grams.values())
        if k > 1:
            out[f"top_{n}gram_frac"] = min(1.0, k * n / total)
    return out


def check_repetition(text: str, max_dup_line_frac: float, max_dup_line_char_frac: float,
                     top_ngram_fracs: dict, min_lines: int = 4, min_tokens: int = 50):
    """Rejects spam-like repetition; duplicate-line limits apply from `min_lines` lines on (a 2-line text with
    a repeated line is a refrain, not spam), n-gram limits from `min_tokens` tokens on (Gopher's 50 words: in
    a short poem, repeated characters are style, not spam). The same figures as repetition_stats, with the
    common cases (no repeated line, too few tokens) decided before any per-line or per-token work."""
    raw_lines = text.split("\n")
    if len(raw_lines) >= min_lines and len(set(raw_lines)) < len(raw_lines):
        st = repetition_stats(text, (), None, 0)
        if st["lines"] >= min_lines:
            if st["dup_line_frac"] > max_dup_line_frac:
                return "repetition", f"duplicate-line fraction {st['dup_line_frac']:.2f} > {max_dup_line_frac}"
            if st["dup_line_char_frac"] > max_dup_line_char_frac:
                return "repetition", (f"duplicate-line char fraction {st['dup_line_char_frac']:.2f} > "
                                      f"{max_dup_line_char_frac}")
    if len(text) < min_tokens:
        return None
    st = _ngram_stats(text, {}, tuple(top_ngram_fracs), top_ngram_fracs, min_tokens)
    for n, limit in top_ngram_fracs.items():
        v = st.get(f"top_{n}gram_frac", 0.0)
        if v > limit:
            return "repetition", f"top {n}-gram token fraction {v:.2f} > {limit}"
    return None
