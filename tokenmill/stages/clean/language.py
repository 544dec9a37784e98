"""Language identification of cleaned texts (`meta.language`, `meta.language_score`) and the `language` rule.

Two models that ship inside their wheels (nothing is downloaded, at install or at run time):

  CLD2 (pycld2)   Chromium's compact language detector, ~165 languages, asked for its best effort (an answer for
                  short texts too): decides when it calls its answer reliable, most texts (10-100 us per record).
                  Score: the share of the text's letters in that language.
  py3langid       langid.py's naive Bayes model (py3langid 0.4, 142 languages): decides the rest (short or mixed
                  texts, bytes CLD2 refuses; ~100-500 us per record). Score: its probability over its languages.

benchmarks/bench_langid.py chose the pair by measurement against fastText lid.176 (ftz), CLD3 and lingua, on the 75
languages of lingua's Leipzig test sentences (1,000 each): 0.952 mean accuracy per language on sentences (CLD2 alone
0.938, py3langid alone 0.923 at a ninth of the speed, lingua 0.960 at a hundredth, lid.176 0.797: it lacks 8 of the
languages and scores 0.893 on the others), 0.980 on 1 kB documents at ~11k documents/s per core, and 98.8% of Tang
and Song poems called Chinese (the rest Japanese: both shingled by characters in dedup) where lid.176 calls a quarter
of them Japanese and some Korean. Asking CLD2 for its best effort (0.952) instead of falling back whenever it is
unsure (0.958) keeps py3langid off short Chinese texts: 10x faster on the renamed poems of the 355k-poem benchmark
corpus.

Codes: ISO 639-1 where one exists, else ISO 639-3, as both libraries give them, except CLD2's old or script-tagged
codes (iw -> he, jw -> jv, zh-Hant -> zh: a script, not a language; sr-ME -> sr) and py3langid's `zxx` (no
linguistic content, ISO 639-2). `bh` (Bihari) and `no` (Norwegian: Bokmål in practice) are ISO 639-1 group codes.
Scores are rounded to SCORE_DECIMALS so that the last bits of float arithmetic, which vary between CPUs, never change
the output bytes.
"""

from __future__ import annotations

import functools
import io
import lzma
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tokenmill.common.cache import cached_arrays
from tokenmill.common.io import dumps
from tokenmill.errors import ConfigError

# characters of a text the models read: a bound on the cost of a long record (CLD2 takes ~100 us per 1 kB); a
# page's first kilobyte names its language (0.980 on bench_langid.py's 1 kB documents)
LANGUAGE_CHARS = 1000
SCORE_DECIMALS = 2
RENAMED = {"iw": "he", "jw": "jv", "zh-Hant": "zh", "sr-ME": "sr"}
# CLD2 answers that name no language (unknown, script-only "xx-Latn", test codes): py3langid decides instead
NO_LANGUAGE = frozenset({"un", "xxx", "zzb", "zze", "zzh", "zzp"})
LANGUAGE_REASON = "language"  # a record outside `languages` or below `min_language_score`


@functools.lru_cache(maxsize=1)
def _fallback():
    """py3langid's identifier over its model unpacked once into tokenmill's cache and memory-mapped from there:
    opening the packed model (LZMA) takes 0.6-1 s in each process that identifies languages, the unpacked one
    ~0.05 s, and the processes share its pages."""
    from importlib.metadata import version

    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

    packed = MODEL_DIR / MODEL_FILE
    model = cached_arrays(f"py3langid-{version('py3langid')}-{packed.stat().st_size}", lambda: _unpacked(packed))
    return LanguageIdentifier(
        model["ptc"],
        model["pc"],
        model["classes"].tolist(),
        _int_array(model["nextmove"]),
        model["out_feat"].tolist(),
        norm_probs=True,
        tk_row=_int_array(model["nextmove_row"]),
    )


def _unpacked(packed: Path) -> dict[str, np.ndarray]:
    """The arrays of py3langid's packed model (an LZMA-compressed .npz), as its own loader reads them."""
    with lzma.open(packed) as f, np.load(io.BytesIO(f.read()), allow_pickle=False) as model:
        return {name: model[name] for name in model.files}


def _int_array(arr: np.ndarray) -> array:
    """An unsigned integer array as the stdlib array py3langid's tokenizer walks (its loader's conversion)."""
    return array({2: "H", 4: "I", 8: "L"}[arr.dtype.itemsize], arr.tobytes())


def _code(code: str) -> str:
    return RENAMED.get(code, code)


def _names_language(code: str) -> bool:
    return code not in NO_LANGUAGE and not code.startswith("xx-")


@functools.lru_cache(maxsize=1)
def language_labels() -> frozenset[str]:
    """Every code identify_languages can answer."""
    import pycld2

    cld2 = {_code(code) for name, code in pycld2.LANGUAGES if name in pycld2.DETECTED_LANGUAGES}
    return frozenset(code for code in cld2 | set(_fallback().labels) if _names_language(code))


def identify_languages(texts: Sequence[str]) -> list[tuple[str, float]]:
    """(code, score 0..1) of each text, from its first LANGUAGE_CHARS characters (newlines and all: both models read
    multi-line text)."""
    import pycld2

    detect, fallback = pycld2.detect, _fallback().classify
    out = []
    for text in texts:
        sample = text[:LANGUAGE_CHARS]
        try:
            reliable, _, found = detect(sample, bestEffort=True)
        except (pycld2.error, UnicodeEncodeError):  # control characters, lone surrogates
            reliable = False
        if reliable and _names_language(found[0][1]):
            out.append((_code(found[0][1]), found[0][2] / 100))
        else:
            code, prob = fallback(sample)
            out.append((_code(code), round(prob, SCORE_DECIMALS)))
    return out


def check_languages(codes: Sequence[str]) -> list[str]:
    """`codes` when each is one identify_languages can answer; else ConfigError naming the others."""
    unknown = sorted(set(codes) - language_labels())
    if unknown:
        raise ConfigError(
            f"unknown language codes {unknown}: use ISO 639-1 codes (ISO 639-3 where none exists), "
            f"one of {sorted(language_labels())}"
        )
    return list(codes)


class LanguageRule:
    """The `language` rule: a record whose detected language is not among `languages` (when any are given), or
    whose score is below `min_score`, is rejected with the language and score as evidence."""

    def __init__(self, languages: Sequence[str], min_score: float):
        self.languages, self.min_score = frozenset(languages), min_score

    def check(self, language: str, score: float) -> tuple | None:
        if self.languages and language not in self.languages:
            detail = f"language {language} (score {score}) not in languages {sorted(self.languages)}"
        elif score < self.min_score:
            detail = f"language {language} scored {score} < min_language_score {self.min_score}"
        else:
            return None
        return LANGUAGE_REASON, detail, {"language": language, "language_score": score}


def with_language(rec: dict, language: str, score: float) -> dict:
    """A copy of the record with meta.language and meta.language_score (after its other meta fields). A label the
    source gave (FineWeb's `language` / `language_score` columns) is kept as meta.source_language /
    source_language_score, not overwritten unseen."""
    meta = dict(rec["meta"]) if isinstance(rec.get("meta"), dict) else {}
    for field in ("language", "language_score"):
        if field in meta:
            meta[f"source_{field}"] = meta.pop(field)
    return {**rec, "meta": {**meta, "language": language, "language_score": score}}


def relabelled(rec: dict, language: str, score: float) -> dict:
    """A copy of a record `with_language` labelled, with the language identified again (its text changed)."""
    return {**rec, "meta": {**rec["meta"], "language": language, "language_score": score}}


RECORD_KEYS = ["id", "text", "meta", "source"]
SOURCE_KEY = b', "source": '


def with_language_line(line: bytes, rec: dict, language: str, score: float) -> bytes:
    """The JSONL line of `with_language(rec, ...)` for a record that is `line` (as read): spliced into the line when
    a stage wrote it (io.dumps: id, text, meta, source in that order, meta an object without the two fields, source
    one of plain values, so the last ', "source": ' is the key), else encoded again. Splicing costs a seventh of
    encoding a poem, and most records of a curated corpus reach the output unchanged."""
    meta, source = rec.get("meta"), rec.get("source")
    at = line.rfind(SOURCE_KEY)
    if (
        at > 0
        and line[at - 1 : at] == b"}"
        and list(rec) == RECORD_KEYS
        and isinstance(meta, dict)
        and "language" not in meta
        and "language_score" not in meta
        and isinstance(source, dict)
        and not any(isinstance(v, (dict, list)) for v in source.values())
    ):
        fields = f'"language": {dumps(language)}, "language_score": {score!r}}}'.encode()
        return line[: at - 1] + (b", " if meta else b"") + fields + line[at:]
    return dumps(with_language(rec, language, score)).encode("utf-8")
