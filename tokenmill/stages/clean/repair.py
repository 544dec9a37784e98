"""Rules 1-5 of cleaning, text repair: surrogates, mojibake, Unicode normalization, control characters,
whitespace. Each is a plain function on one text returning the new text (plus a count of what it changed), so a
test can prove it alone; `prepare` applies them in the documented order."""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

NormalizationForm = Literal["NFC", "NFKC", "none"]  # CleanSettings.normalization
SURROGATE_RE = re.compile(r"[\ud800-\udfff]")
# Latin-1 range or an HTML entity: what UTF-8 mojibake (UTF-8 bytes decoded as cp1252/latin-1) always contains.
MOJIBAKE_HINT_RE = re.compile(r"[\u0080-\u00ff]|&#?\w+;")
LATIN1_RE = re.compile(r"[\u0080-\u00ff]")  # U+0080..U+00FF: the raw material of mojibake
# what ftfy's other fixes (entities, C1 controls, surrogates, terminal escapes) act on, whatever the encoding
FTFY_FIX_RE = re.compile(r"&#?\w+;|[\x1b\x80-\x9f\ud800-\udfff]")
# control characters (tab and newline kept, CR handled by whitespace), zero-width space/no-break space (BOM),
# word joiner, direction marks and embeddings. ZWJ/ZWNJ (U+200C/D) are kept: emoji sequences, Persian and
# Indic scripts need them.
CONTROL_RE = re.compile(
    r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\u200b\u200e\u200f\u202a-\u202e"
    r"\u2060-\u2064\u2066-\u206f\ufeff]"
)
# line breaks other than \n: CRLF, CR, vertical tab, form feed, NEL, line/paragraph separators
LINEBREAK_RE = re.compile(r"\r\n?|[\x0b\x0c\x85\u2028\u2029]")
# exotic spaces become a plain space; U+3000 (ideographic space) is kept: CJK verse uses it for indentation
SPACE_RE = re.compile(r"[\u00a0\u1680\u2000-\u200a\u202f\u205f]")
TRAILING_WS_RE = re.compile(r"[ \t\u3000]+$", re.M)
BLANK_RUN_RE = re.compile(r"\n{3,}")
INNER_SPACES_RE = re.compile(r"(?<=[^ \n])  +")  # two or more spaces after a line's first non-space character
# a line indented by a tab or two spaces: code or aligned text, whose inner spacing means something
INDENTED_LINE_RE = re.compile(r"^(?:\t| {2})", re.M)

_FTFY_CONFIG = None


def _ftfy_config():
    """ftfy fixes encodings only: width, quotes, line breaks and normalization stay ours (CJK full-width
    punctuation such as ，。！ must not be turned into ASCII)."""
    global _FTFY_CONFIG
    if _FTFY_CONFIG is None:
        import ftfy  # imported lazily: most records never need it

        _FTFY_CONFIG = ftfy.TextFixerConfig(
            unescape_html="auto",
            remove_terminal_escapes=True,
            fix_encoding=True,
            restore_byte_a0=True,
            replace_lossy_sequences=True,
            decode_inconsistent_utf8=True,
            fix_c1_controls=True,
            fix_latin_ligatures=False,
            fix_character_width=False,
            uncurl_quotes=False,
            fix_line_breaks=False,
            fix_surrogates=True,
            remove_control_chars=False,
            normalization=None,
            explain=False,
        )
    return _FTFY_CONFIG


def needs_repair(text: str) -> bool:
    """True when `text` may hold anything the repair rules change. A few C-speed string tests:
    most clean text skips ftfy, the control-character pass and the whitespace pass."""
    if not text.replace("\n", "").isprintable():  # controls, tab, CR, format chars, exotic spaces, surrogates
        return True
    if " \n" in text or "\n\n\n" in text or "&" in text or text[:1] in " \n" or text[-1:] in " \n":
        return True
    return not text.isascii() and LATIN1_RE.search(text) is not None


def repair_surrogates(text: str) -> tuple[str, int]:
    """Removes lone UTF-16 surrogates (e.g. a JSON "\\ud800" with no partner): they cannot be encoded to UTF-8."""
    try:
        text.encode("utf-8")
        return text, 0
    except UnicodeEncodeError:
        fixed, n = SURROGATE_RE.subn("", text)
        return fixed, n


def ftfy_leaves_unchanged(text: str) -> bool:
    """True when ftfy.fix_text returns `text` as it is, by ftfy's own early exits: it fixes each line (its
    segment, "\\n" included) alone, and returns one with nothing for its other fixes as it is when the line is
    ASCII or not `badness.is_bad`. Most web text holds a "©" or "’" and no mojibake: one regex search per
    non-ASCII line instead of ftfy's passes over every line."""
    if FTFY_FIX_RE.search(text) is not None or len(text) > _ftfy_config().max_decode_length:
        return False
    from ftfy.badness import is_bad

    *lines, last = text.split("\n")
    segments = [line + "\n" for line in lines if not line.isascii()]
    if not last.isascii():
        segments.append(last)
    return not any(map(is_bad, segments))


def repair_mojibake(text: str) -> tuple[str, int]:
    """Repairs UTF-8 decoded with the wrong codec ("Ã©tÃ©" -> "été") and HTML entities, via ftfy. Returns 1
    when the text changed."""
    if MOJIBAKE_HINT_RE.search(text) is None or ftfy_leaves_unchanged(text):
        return text, 0
    import ftfy

    fixed = ftfy.fix_text(text, _ftfy_config())
    return fixed, int(fixed != text)


def normalize_unicode(text: str, form: NormalizationForm = "NFC") -> str:
    """Unicode normalization: "NFC" (default: composes, keeps full-width CJK punctuation), "NFKC" (also folds
    compatibility forms: full-width ASCII, ligatures, circled digits), or "none"."""
    if form == "none" or unicodedata.is_normalized(form, text):
        return text
    return unicodedata.normalize(form, text)


def strip_control_chars(text: str) -> tuple[str, int]:
    """Removes control and zero-width characters (keeps \\t, \\n and the joiners U+200C/U+200D)."""
    return CONTROL_RE.subn("", text)


def normalize_whitespace(text: str, collapse_inner_spaces: bool = True) -> str:
    """Line endings to \\n, exotic spaces to ' ', no trailing spaces, at most one blank line in a row, no
    leading/trailing blank lines. Leading indentation of a line is kept (verse and code use it). With
    `collapse_inner_spaces`, a run of spaces inside a line becomes one space, unless a line of the text is
    indented (code-like: its alignment is kept)."""
    text = LINEBREAK_RE.sub("\n", text)
    text = SPACE_RE.sub(" ", text)
    text = TRAILING_WS_RE.sub("", text)
    text = BLANK_RUN_RE.sub("\n\n", text)
    if collapse_inner_spaces and "  " in text and not INDENTED_LINE_RE.search(text):
        text = INNER_SPACES_RE.sub(" ", text)
    return text.strip("\n")


def meta_value_needs_cleaning(value: str, form: NormalizationForm = "NFC") -> bool:
    return needs_repair(value) or (form != "none" and not unicodedata.is_normalized(form, value))


def clean_meta_value(value, form: NormalizationForm = "NFC"):
    """Meta strings get the text's repair: no surrogates, no control characters, normalized, stripped."""
    if not isinstance(value, str):
        return value
    if needs_repair(value):
        value, _ = repair_surrogates(value)
        value, _ = strip_control_chars(value)
        value = value.strip()
    return normalize_unicode(value, form)
