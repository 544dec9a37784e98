"""Rule 8b of cleaning, benchmark decontamination: a record that shares an n-gram with an item of an evaluation file
(`decontaminate`) is dropped (reason "contamination", the file and the item's index in `_rejected.jsonl`) or, with
`decontaminate_mode: flag`, kept with `meta.contamination = {"eval_file", "eval_item"}`.

Normalization, the same for records and evaluation items: the stage's Unicode form (`normalization`, NFC by
default; records have it from rule 3, items get it when indexed), lowercased; punctuation, symbols, whitespace
and control characters (Unicode P*, S*, Z*, C*) separate words and are otherwise dropped. Character n-grams use
dedup's key (NFKC, case-folded, the same characters dropped), vectorized and cheap on CJK text. Then a text is cut into
n-grams of `decontaminate_words` words (13) when it is in a space-separated script, or of `decontaminate_chars`
characters (50, separators left out) when it is in a script written without spaces: by the record's language
(`meta.language` in dedup's UNSPACED_LANGUAGES, zh, yue, ja, th, ...: characters; any other code: words), else by
its script (dedup's `by_words`: at most half of its characters CJK/Thai/... -> words). An item shorter than one
n-gram cannot match anything; the report counts such items (`items_too_short`).

The index of an evaluation file is built once and cached by content (the file's bytes and the n-gram settings) in
`<cache>/<sha256>.npy`, written atomically: a (2, n) uint64 array, row 0 the sorted, distinct n-gram hashes, row 1
the index of the first item holding each. Workers open it with np.load(mmap_mode="r") (the task carries its path,
never the array) and look a batch's n-grams up with one searchsorted per file. A record matching several files is
attributed to the first file in `decontaminate` order, and to the item of its first matching n-gram.

N-gram hashes are 64-bit polynomial hashes computed with prefix sums over a batch's code points (numpy, no
per-record Python loop), mixed with splitmix64; the chance that a record's n-gram collides with one of 10^7 indexed
n-grams is about 10^7 / 2^64 per n-gram.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_file, atomic_write_json
from tokenmill.common.text_keys import UNSPACED_LANGUAGES, by_words, dedup_keys
from tokenmill.errors import ConfigError
from tokenmill.stages.clean.repair import normalize_unicode

INDEX_VERSION = 1  # bump when the normalization or hashing changes (invalidates cached indexes)
CACHE_DIR = "_decontam_cache"  # under the cleaned_jsonl stage folder
# the text fields of common benchmark layouts (GSM8K, MMLU, HellaSwag, SQuAD, ...), tried when a row lacks the setting's
FALLBACK_FIELDS = (
    "question",
    "prompt",
    "problem",
    "input",
    "instruction",
    "query",
    "context",
    "ctx",
    "sentence",
    "passage",
)
EVAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
ITEMS_PER_CHUNK = 2048  # evaluation items hashed at a time while building an index
SEPARATOR_LIMIT = 0x40000  # code points above (planes 4+: unassigned but for tags and private use) are word characters
MAX_CHUNK_CHARS = 1 << 22  # code points hashed at once (arrays of ~8 bytes each): bounded memory per batch
CONTAMINATION_REASON = "contamination"  # a record sharing an n-gram with an evaluation item, in 'drop' mode

_CHAR_BASE, _WORD_BASE = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F  # odd, so invertible modulo 2^64
_CHAR_SALT, _WORD_SALT = np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344)
_U64 = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: spreads the polynomial hash's bits (vectorized, wrapping uint64 arithmetic)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


_POWERS: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # base -> its powers, grown as longer batches come
POWERS_KEPT = 1 << 22  # longer tables (a record near max_chars) are computed for the call and dropped


def _powers(base: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """base^i and base^-i modulo 2^64 for i < n (at least)."""
    kept = _POWERS.get(base)
    if kept is not None and len(kept[0]) >= n:
        return kept
    size = 1 << max(16, (n - 1).bit_length())
    pos = np.full(size, base, dtype=np.uint64)
    neg = np.full(size, pow(base, -1, 1 << 64), dtype=np.uint64)
    pos[0] = neg[0] = 1
    powers = np.cumprod(pos, dtype=np.uint64), np.cumprod(neg, dtype=np.uint64)
    if size <= POWERS_KEPT:
        _POWERS[base] = powers
    return powers


def _span_hashes(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, base: int) -> np.ndarray:
    """The mixed polynomial hash of values[s:e] for each (s, e): sum v_j * base^(e-1-j), from one prefix sum."""
    pos, neg = _powers(base, len(values) + 1)
    prefix = np.zeros(len(values) + 1, dtype=np.uint64)
    np.cumsum(values * neg[: len(values)], out=prefix[1:])
    return _mix((prefix[ends] - prefix[starts]) * pos[ends - 1])


@functools.lru_cache(maxsize=1)
def _separators() -> np.ndarray:
    """Per code point below SEPARATOR_LIMIT, and False for the one every later code point is clipped to: whether it
    separates words (Unicode punctuation, symbols, separators and controls: P*, S*, Z*, C*). ~0.1 s once a process."""
    return np.array([unicodedata.category(chr(c))[0] in "PSZC" for c in range(SEPARATOR_LIMIT)] + [False])


def _normalized(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The texts lowercased, joined by newlines as uint64 code points; which are separators; each text's length.
    Records carry the stage's Unicode normalization already (rule 3), evaluation items get it when indexed (NFKC
    here would cost ~20 us per 70 CJK characters: full-width punctuation takes CPython's slow path)."""
    folded = [t.lower() for t in texts]
    lengths = np.fromiter(map(len, folded), dtype=np.int64, count=len(folded))
    cps = np.frombuffer("\n".join(folded).encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return cps.astype(np.uint64), _separators()[np.minimum(cps, SEPARATOR_LIMIT)], lengths


def _word_ngrams(texts: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash, text) of each window of n words (the runs between separators), text by text and in order."""
    cps, sep, lengths = _normalized(texts)
    edges = np.diff(np.concatenate(([True], sep, [True])).astype(np.int8))
    starts, ends = np.flatnonzero(edges == -1), np.flatnonzero(edges == 1)
    words = _span_hashes(cps, starts, ends, _CHAR_BASE)
    owner = np.searchsorted(np.cumsum(lengths + 1), starts, side="right")
    first = np.arange(max(0, len(words) - n + 1))
    first = first[owner[first] == owner[first + n - 1]]
    return _span_hashes(words, first, first + n, _WORD_BASE) ^ _WORD_SALT, owner[first]


def _char_ngrams(texts: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash, text) of each window of n characters, separators left out, text by text and in order (dedup's key:
    one table lookup per code point)."""
    keys = dedup_keys(texts, strip_symbols=True)
    chars = np.frombuffer("".join(keys).encode("utf-32-le"), dtype="<u4").astype(np.uint64)
    owner = np.repeat(np.arange(len(keys)), np.fromiter(map(len, keys), dtype=np.int64, count=len(keys)))
    first = np.arange(max(0, len(chars) - n + 1))
    first = first[owner[first] == owner[first + n - 1]]
    return _span_hashes(chars, first, first + n, _CHAR_BASE) ^ _CHAR_SALT, owner[first]


def ngram_hashes(
    texts: Sequence[str], languages: Sequence[str | None], n_words: int, n_chars: int
) -> tuple[np.ndarray, np.ndarray]:
    """(hash, index of its text) of every n-gram of the texts (see the module docstring), each text's in order."""
    base_code = {code: (code or "").split("-")[0].split("_")[0].lower() for code in set(languages)}
    unspaced = {code for code, base in base_code.items() if base in UNSPACED_LANGUAGES}
    spaced = np.array([code not in unspaced for code in languages], dtype=bool)
    by_script = [i for i, code in enumerate(languages) if not base_code[code]]
    if by_script:
        spaced[by_script] = by_words([texts[i] for i in by_script])
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    hashes, owners = [], []
    for pick, ngrams, n in ((spaced, _word_ngrams, n_words), (~spaced, _char_ngrams, n_chars)):
        chosen = np.flatnonzero(pick)
        for part in _chunks(chosen, lengths[chosen]):
            h, owner = ngrams([texts[i] for i in part], n)
            hashes.append(h)
            owners.append(part[owner])
    if not hashes:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    return np.concatenate(hashes), np.concatenate(owners)


def _chunks(indices: np.ndarray, lengths: np.ndarray) -> Iterator[np.ndarray]:
    """`indices` in consecutive runs of texts starting within the same MAX_CHUNK_CHARS code points (one run for a
    usual batch; a run holds at most MAX_CHUNK_CHARS plus its last text)."""
    if not len(indices):
        return
    starts = np.cumsum(lengths + 1) - (lengths + 1)
    run = starts // MAX_CHUNK_CHARS
    cuts = np.flatnonzero(run[1:] != run[:-1]) + 1
    yield from np.split(indices, cuts)


# ------------------------------------------------------------------------------------------------
# Evaluation files -> cached indexes (in the run process, once per file content)
# ------------------------------------------------------------------------------------------------


def _text_of(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    raise ConfigError(f"{where}: the evaluation text is a {type(value).__name__}, not a string or list of strings")


def _row_text(row, field: str, where: str) -> str:
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: an evaluation item is not a JSON object")
    for name in (field, *FALLBACK_FIELDS):
        if name in row and row[name] is not None:
            return _text_of(row[name], f"{where}: field '{name}'")
    raise ConfigError(
        f"{where}: no text field: looked for '{field}' (decontaminate_field), then {', '.join(FALLBACK_FIELDS)}; "
        f"the item has {', '.join(map(repr, row)) or 'no fields'}"
    )


def _json_items(path: Path, field: str) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        head = f.read(1)
        while head.isspace():
            head = f.read(1)
        f.seek(0)
        if head == "[":  # a .json document holding a list of items
            for k, row in enumerate(_parse(f.read(), f"{path}")):
                yield _row_text(row, field, f"{path}: item {k}")
            return
        for line_no, line in enumerate(f, 1):
            if line.strip():
                yield _row_text(_parse(line, f"{path}:{line_no}"), field, f"{path}:{line_no}")


def _parse(text: str, where: str):
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{where}: not JSON ({e})") from None


def _parquet_items(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    column = next((c for c in (field, *FALLBACK_FIELDS) if c in names), None)
    if column is None:
        raise ConfigError(
            f"{path}: no text column: looked for '{field}' (decontaminate_field), then "
            f"{', '.join(FALLBACK_FIELDS)}; the file has {', '.join(names)}"
        )
    for batch in parquet.iter_batches(columns=[column], batch_size=ITEMS_PER_CHUNK):
        for k, value in enumerate(batch.column(0).to_pylist()):
            yield "" if value is None else _text_of(value, f"{path}: column '{column}', row {k}")


def eval_items(path: Path, field: str) -> Iterator[str]:
    """The text of each item of an evaluation file, in file order (item index = position)."""
    if path.suffix == ".parquet":
        return _parquet_items(path, field)
    return _json_items(path, field)


def _content_key(path: Path, s) -> str:
    """SHA-256 of the index's inputs: the file's bytes and the settings that shape its n-grams."""
    digest = hashlib.sha256(
        json.dumps(
            [
                INDEX_VERSION,
                s.decontaminate_field,
                s.decontaminate_words,
                s.decontaminate_chars,
                s.normalization,
                path.suffix,
            ]
        ).encode()
    )
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def build_index(path: Path, s) -> tuple[np.ndarray, dict]:
    """The (2, n) index array of one evaluation file and its figures (items, items_too_short, ngrams)."""
    hashes, items, too_short, count = [], [], 0, 0
    texts: list[str] = []

    def flush() -> None:
        nonlocal too_short
        h, owner = ngram_hashes(texts, [None] * len(texts), s.decontaminate_words, s.decontaminate_chars)
        too_short += len(texts) - len(np.unique(owner))
        hashes.append(h)
        items.append(owner.astype(np.uint64) + _U64(count - len(texts)))
        texts.clear()

    for text in eval_items(path, s.decontaminate_field):
        texts.append(normalize_unicode(text, s.normalization))  # the form rule 3 gave the records
        count += 1
        if len(texts) >= ITEMS_PER_CHUNK:
            flush()
    if texts:
        flush()
    h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    it = np.concatenate(items) if items else np.zeros(0, np.uint64)
    order = np.lexsort((it, h))  # by hash, then item: the first of each hash is its smallest item
    h, it = h[order], it[order]
    first = np.ones(len(h), dtype=bool)
    first[1:] = h[1:] != h[:-1]
    return np.stack([h[first], it[first]]), {"items": count, "items_too_short": too_short, "ngrams": int(first.sum())}


@dataclass(frozen=True, kw_only=True)
class EvalIndex:
    label: str
    """The evaluation file as configured."""
    array: str
    """Its cached index (.npy)."""
    figures: dict
    """items, items_too_short, ngrams, sha256, cache ('built' or 'reused')."""


def prepare_indexes(s, cache_dir: Path, log=None) -> ContaminationIndex | None:
    """The index of every evaluation file of `decontaminate`, built when its content is not cached yet; a
    ConfigError naming each missing file first. None when `decontaminate` is empty."""
    if not s.decontaminate:
        return None
    paths = [Path(f).expanduser() for f in s.decontaminate]
    missing = [f"{f} ({p.absolute()})" for f, p in zip(s.decontaminate, paths) if not p.is_file()]
    if missing:
        raise ConfigError(f"cleaned_jsonl.decontaminate: evaluation file not found: {', '.join(missing)}")
    unknown = [f for f, p in zip(s.decontaminate, paths) if not p.name.endswith(EVAL_SUFFIXES)]
    if unknown:
        raise ConfigError(
            f"cleaned_jsonl.decontaminate: not an evaluation file format ({', '.join(EVAL_SUFFIXES)}): "
            + ", ".join(unknown)
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    indexes = []
    for label, path in zip(s.decontaminate, paths):
        key = _content_key(path, s)
        array, sidecar = cache_dir / f"{key}.npy", cache_dir / f"{key}.json"
        if array.exists() and sidecar.exists():
            figures = {**json.loads(sidecar.read_text()), "cache": "reused"}
        else:
            index, figures = build_index(path, s)
            figures["sha256"] = key
            atomic_write_json(sidecar, figures)
            with atomic_file(array, "wb") as f:  # last: an index file present means its figures are too
                np.save(f, index)
            figures = {**figures, "cache": "built"}
            if log is not None:
                log.info(f"cleaned_jsonl: decontamination index of {label}: {figures['ngrams']:,} n-grams ({array})")
        indexes.append(EvalIndex(label=label, array=str(array), figures=figures))
    return ContaminationIndex(
        files=tuple(indexes), mode=s.decontaminate_mode, n_words=s.decontaminate_words, n_chars=s.decontaminate_chars
    )


# ------------------------------------------------------------------------------------------------
# The check (in the workers, per batch)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Table:
    hashes: np.ndarray
    items: np.ndarray
    present: np.ndarray
    """A bit per value of the hashes' top `bits` bits, set when some n-gram has it: ~95% of a batch's n-grams are
    ruled out by one gather from this small array (searchsorted costs ~0.5 us per query on a 10k-item index)."""
    bits: int

    def lookup(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in `queries` that are indexed n-grams, the item of each)."""
        top = queries >> _U64(64 - self.bits)
        maybe = np.flatnonzero((self.present[top >> _U64(3)] >> (top & _U64(7)).astype(np.uint8)) & 1)
        at = np.minimum(np.searchsorted(self.hashes, queries[maybe]), len(self.hashes) - 1)
        hit = self.hashes[at] == queries[maybe]
        return maybe[hit], self.items[at[hit]]


PRESENCE_BITS = (16, 26)  # the presence filter: 2^16 bits (8 KiB) to 2^26 (8 MiB), ~16 bits per n-gram


@functools.lru_cache(maxsize=16)
def _open(array: str) -> _Table:
    """An index, memory-mapped once per process (its name is its content's hash, so it never goes stale), with
    its presence filter."""
    index = np.load(array, mmap_mode="r")
    hashes = index[0]
    bits = int(np.clip(int(max(1, len(hashes))).bit_length() + 4, *PRESENCE_BITS))
    top = np.asarray(hashes) >> _U64(64 - bits)
    present = np.zeros(1 << bits, dtype=bool)
    present[top] = True
    return _Table(hashes=hashes, items=index[1], present=np.packbits(present, bitorder="little"), bits=bits)


@dataclass(frozen=True, kw_only=True)
class ContaminationIndex:
    """What a task needs to screen its records: the cached index files (paths only) and the mode."""

    files: tuple[EvalIndex, ...]
    mode: str
    n_words: int
    n_chars: int

    def find(self, texts: Sequence[str], languages: Sequence[str | None]) -> dict[int, tuple[int, int]]:
        """text index -> (file index, item index) of each text sharing an n-gram with an evaluation item."""
        hashes, owner = ngram_hashes(texts, languages, self.n_words, self.n_chars)
        found: dict[int, tuple[int, int]] = {}
        for f, eval_index in enumerate(self.files):
            table = _open(eval_index.array)
            if not len(hashes) or not len(table.hashes):
                continue
            hit, items = table.lookup(hashes)
            texts_hit, first = np.unique(owner[hit], return_index=True)  # hits are in text order, then position
            for text, item in zip(texts_hit.tolist(), items[first].tolist()):
                found.setdefault(text, (f, int(item)))
        return found

    def screen(self, batch: list[tuple[bytes, dict]], entries: list, counts: Counter) -> None:
        """Drops or flags the contaminated records of a prepared batch (prepare.Prepared entries), in place. Every
        entry with text is checked, also those a filter rejected: pass 2 may take them back after stripping."""
        todo = [k for k, e in enumerate(entries) if e.text]
        languages = []
        for k in todo:
            e, rec = entries[k], batch[k][1]
            meta = (e.new or rec).get("meta")
            code = e.language[0] if e.language else meta.get("language") if isinstance(meta, dict) else None
            languages.append(code if isinstance(code, str) else None)
        for pos, (f, item) in self.find([entries[k].text for k in todo], languages).items():
            k = todo[pos]
            e, rec = entries[k], batch[k][1]
            label = self.files[f].label
            evidence = {"eval_file": label, "eval_item": item}
            counts[f"contaminated:{f}"] += 1
            if self.mode == "drop":
                e.reject = (CONTAMINATION_REASON, f"shares an n-gram with item {item} of {label}", evidence)
                e.text = ""  # out of the line statistics, so pass 2 never takes the record back
                continue
            new = dict(e.new or rec)
            new["meta"] = {**(m if isinstance(m := new.get("meta"), dict) else {}), "contamination": evidence}
            e.new, e.kind = new, "contamination"  # a kind the examples do not show
            e.before = e.text if e.before is None else e.before
            counts["flagged_contamination"] += 1

    def report(self, counts: Counter) -> list[dict]:
        """Per evaluation file: its figures and the records that matched it."""
        return [
            {"file": f.label, **f.figures, "hits": counts.get(f"contaminated:{k}", 0)} for k, f in enumerate(self.files)
        ]
