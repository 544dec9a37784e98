"""Text keys: what dedup and decontamination compare a text by. NFKC, case-fold, punctuation/space/control (and
symbol) removal, optional traditional -> simplified Chinese folding (`dedup_key`, vectorized over a batch:
`dedup_keys`), and whether a key is shingled by words or characters (`by_words`). Below both stages (dedup, clean's
decontamination), so neither imports the other.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from tokenmill.common.cache import cached_arrays

_TABLES_VERSION = 1  # bump when the key rules change (invalidates cached tables)


def _cached(name: str, build: Callable[[], np.ndarray]) -> np.ndarray:
    """The table `build()` makes, kept in tokenmill's cache (rebuilt, slowly, without one), keyed by the Unicode
    version and the key rules' version, and memory-mapped read-only from there."""
    folder = f"dedup-{name}-unicode{unicodedata.unidata_version}-v{_TABLES_VERSION}"
    return cached_arrays(folder, lambda: {"table": build()})["table"]


def _build_drop(strip_symbols: bool) -> np.ndarray:
    planes = list(range(0x0, 0x40000)) + list(range(0xE0000, 0xE1000))  # assigned planes only (fast)
    return np.asarray(
        [
            cp
            for cp in planes
            if (lambda c: c[0] in "PZ" or c in ("Cc", "Cf") or (strip_symbols and c[0] == "S"))(
                unicodedata.category(chr(cp))
            )
        ],
        dtype=np.int64,
    )


@functools.lru_cache(maxsize=2)
def _drop_table(strip_symbols: bool) -> dict:
    """str.translate table deleting punctuation (P*), separators/whitespace (Z*), controls and
    format characters (Cc, Cf: zero-width spaces, BOM), and with strip_symbols also symbols (S*)."""
    cps = _cached(f"drop-{int(strip_symbols)}", lambda: _build_drop(strip_symbols))
    return dict.fromkeys(cps.tolist())


@functools.lru_cache(maxsize=1)
def _t2s_converter() -> Callable[[str], str]:
    """Traditional-to-simplified folding for the key; uses OpenCC when installed (pluggable, off by default)."""
    try:
        import opencc  # type: ignore
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "fold_chinese=True needs the 'opencc' package (pip install opencc); "
            "it is optional and only used to build dedup keys"
        ) from e
    for cfg in ("t2s", "t2s.json"):
        try:
            return opencc.OpenCC(cfg).convert
        except Exception:  # noqa: BLE001 - the config name differs between opencc builds
            continue
    raise RuntimeError("opencc is installed but has no t2s configuration")


def dedup_key(text: str, strip_symbols: bool = True, fold_chinese: bool = False, spaced: bool = False) -> str:
    """The string that exact dedup hashes and near dedup shingles (never written to the output).

    NFKC (full-width -> ASCII, compatibility forms), case-fold, then punctuation, whitespace, control
    and format characters (and symbols, by default) removed; optionally traditional -> simplified
    Chinese. A text made only of removed characters keys on its whitespace-free NFKC form instead,
    so two different all-punctuation texts are not called duplicates. `spaced`: whitespace between two kept
    characters becomes one space (the word boundaries of word shingles); without the spaces it is the key.
    """
    folded = unicodedata.normalize("NFKC", text).casefold()
    drop = _drop_table(strip_symbols)
    key = " ".join(w for w in (part.translate(drop) for part in folded.split()) if w) if spaced else ""
    key = key or folded.translate(drop)
    if not key:
        key = "".join(folded.split())
    if fold_chinese and key:
        key = _t2s_converter()(key)
    return key


_MAP_LIMIT = 0x40000  # code points above (planes 4+: rare) take the per-text path
_DROP, _UNSAFE = -1, -2


@functools.lru_cache(maxsize=2)
def _key_map(strip_symbols: bool) -> np.ndarray:
    return _cached(f"keymap-{int(strip_symbols)}", lambda: _build_key_map(strip_symbols))


def _build_key_map(strip_symbols: bool) -> np.ndarray:
    """Per code point: what dedup_key turns it into when it stands among inert characters.

    >= 0: the single code point casefold(NFKC(c)); -1: dropped (c and everything NFKC/casefold make of it
    are dropped characters); -2: unsafe (expands to several characters, composes with a neighbour, or
    reorders as a combining mark), so a text holding one takes the exact per-text path.
    """
    drop = _drop_table(strip_symbols)
    table = np.full(_MAP_LIMIT, _UNSAFE, dtype=np.int32)
    trailing = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))  # Hangul V/T jamo compose
    for cp in range(_MAP_LIMIT):
        dec = unicodedata.decomposition(chr(cp))
        if dec and not dec.startswith("<"):
            parts = dec.split()
            if len(parts) == 2:
                trailing.add(int(parts[1], 16))
    for cp in range(_MAP_LIMIT):
        ch = chr(cp)
        if cp in trailing or unicodedata.combining(ch):
            continue
        out = unicodedata.normalize("NFKC", ch).casefold()
        if all(ord(o) in drop for o in out):
            if cp in drop:
                table[cp] = _DROP
        elif len(out) == 1 and cp not in drop and ord(out) not in trailing and not unicodedata.combining(out):
            table[cp] = ord(out)
    return table


def _fold_batch(keys: list[str]) -> list[str]:
    """Traditional -> simplified for many keys in one OpenCC call (keys hold no newline)."""
    if not keys:
        return keys
    out = _t2s_converter()("\n".join(keys)).split("\n")
    return out if len(out) == len(keys) else [_t2s_converter()(k) if k else k for k in keys]


@functools.lru_cache(maxsize=2)
def _key_table(strip_symbols: bool) -> np.ndarray:
    """_key_map with one more entry, _UNSAFE, that every code point past it is clipped to (one lookup, no mask)."""
    return np.append(_key_map(strip_symbols), np.int32(_UNSAFE))


_WHITESPACE_LIMIT = 0x3001  # every code point str.split() splits on is below


@functools.lru_cache(maxsize=1)
def _whitespace() -> np.ndarray:
    """Per code point below _WHITESPACE_LIMIT, and False for the one every later code point is clipped to: whether
    str.split() splits on it (all of them dropped from the key: Z* or Cc)."""
    return np.asarray([chr(cp).isspace() for cp in range(_WHITESPACE_LIMIT)] + [False])


def per_text(mask: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """How many code points of each text `mask` (over the concatenated texts) holds; text i is bounds[i]:bounds[i+1].
    One reduceat over the non-empty texts (a cumulative sum into int64 is several times slower)."""
    counts = np.zeros(len(bounds) - 1, dtype=np.int64)
    nonempty = np.flatnonzero(bounds[1:] > bounds[:-1])
    if len(nonempty):
        counts[nonempty] = np.add.reduceat(mask, bounds[nonempty], dtype=np.int64)
    return counts


def text_bounds(lengths: np.ndarray) -> np.ndarray:
    """Where each of the concatenated texts of `lengths` starts, and where the last one ends."""
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return bounds


def dedup_keys(
    texts: Sequence[str], strip_symbols: bool = True, fold_chinese: bool = False, spaced: bool = False
) -> list[str]:
    """dedup_key for a batch, vectorized: one code-point array, one table lookup; a text with an unsafe
    character (see _key_map) or nothing left takes dedup_key itself, so the result always equals
    [dedup_key(t, strip_symbols, fold_chinese, spaced) for t in texts]."""
    if fold_chinese:
        return _fold_batch(dedup_keys(texts, strip_symbols, spaced=spaced))
    if not texts:
        return []
    cps = np.frombuffer("".join(texts).encode("utf-32-le"), dtype="<u4")
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    bounds = text_bounds(lengths)
    mapped = _key_table(strip_symbols)[np.minimum(cps, _MAP_LIMIT)]
    keep = mapped >= 0
    kept = per_text(keep, bounds)
    fast = (kept > 0) & (per_text(mapped == _UNSAFE, bounds) == 0)
    if not fast.all():
        keep &= np.repeat(fast, lengths)
        kept[~fast] = 0
    at = np.flatnonzero(keep)
    doc = np.repeat(np.arange(len(texts)), kept)
    # the keys, joined by newlines (a newline is dropped from every key, so it never is a key's character)
    out_at = np.arange(len(at)) + doc
    joined = np.full(len(at) + len(texts) - 1, ord("\n"), dtype="<u4")
    if spaced:  # a space before each kept character with whitespace between it and the previous one of its text
        seen = np.cumsum(_whitespace()[np.minimum(cps, _WHITESPACE_LIMIT)])[at]
        gap = np.zeros(len(at), dtype=bool)
        gap[1:] = (seen[1:] > seen[:-1]) & (doc[1:] == doc[:-1])
        out_at += np.cumsum(gap)
        joined = np.full(len(joined) + int(gap.sum()), ord(" "), dtype="<u4")
        gaps = per_text(gap, text_bounds(kept))
        joined[np.arange(len(texts) - 1) + text_bounds(kept + gaps)[1:-1]] = ord("\n")
    joined[out_at] = mapped[at]
    out = str(joined.data, "utf-32-le").split("\n")
    for i in np.flatnonzero(~fast).tolist():
        out[i] = dedup_key(texts[i], strip_symbols, spaced=spaced)
    return out


# scripts written without spaces between words (their texts are shingled by characters): Thai, Lao, Tibetan, Myanmar,
# Khmer, CJK radicals and symbols, kana, bopomofo, CJK ideographs (BMP, compatibility and planes 2-3), half-width kana
_UNSPACED = np.asarray(
    [0x0E00, 0x10A0, 0x1780, 0x1800, 0x2E80, 0x3130, 0x31F0, 0x3200, 0x3400, 0x4DC0, 0x4E00, 0xA000,
     0xF900, 0xFB00, 0xFF66, 0xFFA0, 0x20000, 0x40000],
    dtype=np.uint32,
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def _unspaced() -> np.ndarray:
    """Per code point up to _UNSPACED[-1] (every later one is clipped to it): whether it is in _UNSPACED's ranges."""
    return np.searchsorted(_UNSPACED, np.arange(_UNSPACED[-1] + 1), side="right") % 2 == 1


# languages written without spaces between words (meta.language, ISO 639): Chinese and the Chinese varieties
# language identification tells apart, Japanese, Thai, Lao, Khmer, Burmese, Tibetan, Dzongkha. Korean is written with
# spaces: words. zxx (no linguistic content) says nothing: the script decides.
UNSPACED_LANGUAGES = frozenset({"zh", "yue", "wuu", "ja", "th", "lo", "km", "my", "bo", "dz"})
NO_LANGUAGE = "zxx"


def by_words(keys: Sequence[str], languages: Sequence[str | None] | None = None) -> np.ndarray:
    """Whether each key is shingled by words: it is non-empty and, when its record's language is known
    (`languages`, meta.language), that language is written with spaces (not in UNSPACED_LANGUAGES); otherwise at
    most half of its code points are in a script written without spaces (_UNSPACED)."""
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
    bounds = text_bounds(lengths)
    cps = np.frombuffer("".join(keys).encode("utf-32-le"), dtype="<u4")
    unspaced = _unspaced()[np.minimum(cps, _UNSPACED[-1])]
    chars = lengths - per_text(cps == 0x20, bounds)
    words = 2 * per_text(unspaced, bounds) <= chars
    if languages is not None:
        codes = [_base_language(c) for c in languages]
        known = np.fromiter((c is not None for c in codes), bool, len(keys))
        spaced = np.fromiter((c not in UNSPACED_LANGUAGES for c in codes), bool, len(keys))
        words = np.where(known, spaced, words)
    return (lengths > 0) & words


def _base_language(code) -> str | None:
    """The language of a meta.language value as a source may spell it too ("zh-Hans", "ZH_cn" -> zh); None when it
    names none."""
    if not isinstance(code, str):
        return None
    base = code.strip().lower().replace("_", "-").split("-")[0]
    return base if base and base != NO_LANGUAGE else None
