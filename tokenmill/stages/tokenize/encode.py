"""Encoding: a byte range of deduped_jsonl -> per split, the token arrays of its records (one task).

The input part files are cut into newline-aligned byte ranges. A task parses its range, routes each record to
train/val by a hash of its id, renders it (render.py), encodes every text piece of a batch at once (with
piece_bpe.PieceEncoder for tokenizers of the shape the tokenizer asset trains, several times less CPU (docs/profile.md,
'Runs of 2026-12-04 (second session) with the piece encoder'); else with one HF
`encode_batch` call) and assembles each key's flat arrays with numpy gathers (no per-token Python work), then writes
them to its file in the stage folder (atomically), so no token array travels back with its result: on a cluster the
run process reads them from the shared data root to pack the shards. Encoding
the rendered string instead gives the same tokens (added tokens split the input and BPE never merges across them):
on chinese-poetry both give exactly 7,451,422 tokens.

Cores: with several workers each spawned process encodes single-threaded (TOKENIZERS_PARALLELISM=false), so JSON
parsing and array work run in parallel too; with one worker HF's encoder uses every core (the piece encoder one).
"""

from __future__ import annotations

import itertools
import os
import shutil
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tokenmill.common.io import json_parser, record_shards
from tokenmill.common.samples import ReasonSamples, with_text
from tokenmill.errors import CapacityError, CorruptOutputError
from tokenmill.stages.tokenize.forgotten import FORGOTTEN_REASON, Forgotten
from tokenmill.stages.tokenize.piece_bpe import PieceEncoder
from tokenmill.stages.tokenize.render import RENDERERS, Segments, split_hash, title_author
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill.stages.tokenize.tokenizer import TokenizerPin, parse_pinned, read_pinned, special_token_ids
from tokenmill.stages.tokenize.train import parse_record
from tokenmill_loader.format import KEYS, MASK, MASK_OF, SPLITS, VALUES

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MIN_TASK_BYTES, MAX_TASK_BYTES = 256 << 10, 16 << 20
TASKS_PER_WORKER = 8  # enough tasks for the pool to balance uneven ranges
TAIL_SHARE = 2  # planned ranges shrink to what is left / (TAIL_SHARE * workers): the workers finish together


@dataclass(frozen=True, kw_only=True)
class Encoder:
    """A tokenizer ready to encode text pieces (special tokens matched as text), with its lookup tables."""

    tok: Tokenizer
    vocab_size: int
    special: dict[str, int]
    is_punct: np.ndarray  # is_punct[id]: the token decodes to exactly one punctuation character
    short_pieces: dict[str, list[int]] = field(default_factory=dict)  # piece_ids' ids of short pieces seen
    pieces: PieceEncoder | None = None  # the same ids, vectorized, for tokenizers of the shape we train


_ENCODERS: dict[str, Encoder] = {}  # per process, by tokenizer SHA-256
# Short pieces (titles, authors, chat roles' contents) repeat across records: their ids are kept per process, as a
# piece always encodes to the same ids, so HF builds one Encoding object per distinct short piece, not per record
SHORT_PIECE_CHARS, SHORT_PIECES_KEPT = 32, 100_000  # at most ~50 MB per worker


def piece_ids(enc: Encoder, texts: list[str]) -> list[list[int]]:
    """The token ids of each text piece."""
    known = enc.short_pieces
    new = list(dict.fromkeys(t for t in texts if t not in known))
    encoded = dict(zip(new, (e.ids for e in enc.tok.encode_batch_fast(new, add_special_tokens=False)))) if new else {}
    if len(known) < SHORT_PIECES_KEPT:
        known.update((t, ids) for t, ids in encoded.items() if len(t) <= SHORT_PIECE_CHARS)
    return [known[t] if t in known else encoded[t] for t in texts]


def _punct_table(tok, vocab: int) -> np.ndarray:
    table = np.zeros(vocab, dtype=bool)
    for i in range(vocab):
        s = tok.decode([i], skip_special_tokens=False)
        if len(s) == 1 and unicodedata.category(s).startswith("P"):
            table[i] = True
    return table


def encoder(pin: TokenizerPin) -> Encoder:
    """The pinned tokenizer, its bytes checked on every call (each task), parsed once per process."""
    data = read_pinned(pin)
    enc = _ENCODERS.get(pin.sha256)
    if enc is None:
        tok = parse_pinned(pin, data)
        tok.encode_special_tokens = True
        vocab = tok.get_vocab_size(with_added_tokens=True)
        pieces = PieceEncoder.build(tok, data)
        enc = Encoder(
            tok=tok,
            vocab_size=vocab,
            special=special_token_ids(tok, pin.path),
            is_punct=_punct_table(tok, vocab),
            pieces=pieces,
        )
        _ENCODERS.clear()
        _ENCODERS[pin.sha256] = enc
    return enc


def check_ids(ids: np.ndarray, vocab_size: int, where: str = "") -> None:
    if ids.size and int(ids.max()) >= vocab_size:
        raise CapacityError(f"{where}: token id {int(ids.max())} >= vocabulary size {vocab_size}")


@dataclass(frozen=True, kw_only=True)
class ByteRange:
    """Lines of one part file: bytes [start, end), the first of them numbered first_line."""

    path: str
    start: int
    end: int
    first_line: int


@dataclass(frozen=True, kw_only=True)
class EncodeTask:
    range: ByteRange
    tokenizer: TokenizerPin
    settings: ShardSettings
    token_dtype: str
    threads: bool  # let the encoder use every core (one task at a time in this process)
    out: str  # the task's encoded arrays, written here for the run process (a folder in the stage folder)
    val_ids: frozenset[str] = frozenset()  # records put in val whatever their split hash (an empty val topped up)
    forgotten: Forgotten = field(default_factory=Forgotten)  # taken down: dropped as FORGOTTEN_REASON (forgotten.py)


def plan_ranges(in_dir: Path, task_bytes: int, workers: int) -> list[ByteRange]:
    """Newline-aligned byte ranges of the part files (task_bytes 0: about TASKS_PER_WORKER per worker, the last
    ones smaller and smaller, down to MIN_TASK_BYTES, so that no worker is left encoding a large range alone).

    Streams each file once (a range at a time) to find the cuts and count lines; nothing is kept.
    """
    parts = record_shards(in_dir)
    left = sum(p.stat().st_size for p in parts)
    taper = not task_bytes
    if taper:
        task_bytes = min(MAX_TASK_BYTES, max(MIN_TASK_BYTES, left // max(1, TASKS_PER_WORKER * workers)))
    ranges = []
    for p in parts:
        size = p.stat().st_size
        with open(p, "rb") as f:
            start, line = 0, 1
            while start < size:
                want = min(task_bytes, max(MIN_TASK_BYTES, left // (TAIL_SHARE * workers))) if taper else task_bytes
                chunk = f.read(want)
                if start + len(chunk) < size:
                    chunk += f.readline()  # up to and including the next newline
                end = start + len(chunk)
                ranges.append(ByteRange(path=str(p), start=start, end=end, first_line=line))
                line += chunk.count(b"\n")
                start, left = end, left - len(chunk)
    return ranges


@dataclass(kw_only=True)
class SplitCounts:
    """The counts of a split's encoded records: one task's (SplitChunk) or one batch's (summary.SplitTotals)."""

    supervised: int = 0  # tokens trained on (assemble: a loss mask's ones, else every token but grpo's prompts)
    punct: int = 0  # tokens that decode to one punctuation character
    text_chars: int = 0  # characters of the text pieces encoded
    text_tokens: int = 0  # their tokens
    dropout: int = 0  # conditional: records rendered without their title/author
    no_metadata: int = 0  # conditional: records that have neither

    def add_counts(self, other: SplitCounts) -> None:
        for name in SPLIT_COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


SPLIT_COUNTS = tuple(f.name for f in fields(SplitCounts))  # in this order in save_splits' "counts" array
SPLIT_ARRAYS = ("data", "item_lens", "rec_items")  # SplitChunk's per-key arrays


@dataclass(kw_only=True)
class SplitChunk(SplitCounts):
    """Encoded records of one split from one task: per key the flat data, item lengths, items per record."""

    ids: list = field(default_factory=list)
    data: dict = field(default_factory=dict)  # key -> 1-D array
    item_lens: dict = field(default_factory=dict)  # key -> int64 per item
    rec_items: dict = field(default_factory=dict)  # key -> int64 per record
    rec_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # token-key tokens per record

    @property
    def records(self) -> int:
        return len(self.rec_tokens)


def assemble(seg: Segments, tt: str, enc: Encoder, dtype: np.dtype, where: str) -> SplitChunk:
    """Encodes the batch's text pieces once and gathers every key's flat arrays."""
    piece_flat, piece_lens, piece_start = _piece_arrays(enc, seg.texts, where)
    ch = SplitChunk(
        ids=seg.ids,
        text_chars=sum(map(len, seg.texts)),
        text_tokens=len(piece_flat),
        dropout=seg.dropout,
        no_metadata=seg.no_metadata,
    )
    rec_tokens = np.zeros(len(seg.ids), dtype=np.int64)
    for key, kind in KEYS[tt].items():
        if kind == MASK:
            continue
        nitems = np.asarray(seg.nitems[key], dtype=np.int64)
        ch.rec_items[key] = nitems
        if kind == VALUES:  # grpo rewards: one item per record, nseg = values per record
            ch.data[key] = np.asarray(seg.rewards, dtype=np.float32)
            ch.item_lens[key] = np.asarray(seg.nseg[key], dtype=np.int64)
            continue
        tokens, mask, item_lens = _gather(seg, key, piece_flat, piece_lens, piece_start)
        check_ids(tokens, enc.vocab_size, where)
        ch.data[key] = tokens.astype(dtype)
        ch.item_lens[key] = item_lens
        mkey = next((mk for mk, tk in MASK_OF.items() if tk == key and mk in KEYS[tt]), None)
        if mkey:
            ch.data[mkey] = mask
            ch.item_lens[mkey] = item_lens
            ch.rec_items[mkey] = nitems
            ch.supervised += int(mask.sum())
        else:
            ch.supervised += 0 if tt == "grpo" else len(tokens)  # grpo prompts are context; seq trains every token
        ch.punct += int(enc.is_punct[tokens].sum()) if len(tokens) else 0
        rec_of_item = np.repeat(np.arange(len(nitems)), nitems)
        rec_tokens += np.bincount(rec_of_item, weights=item_lens, minlength=len(nitems)).astype(np.int64)
    ch.rec_tokens = rec_tokens
    return ch


def _piece_arrays(enc: Encoder, texts: list[str], where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The text pieces' ids, flat, and each piece's length and start in them."""
    encoded = enc.pieces.encode(texts) if enc.pieces else None
    if encoded is None:
        id_lists = piece_ids(enc, texts)
        piece_lens = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        piece_flat = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=int(piece_lens.sum()))
    else:
        piece_flat, piece_lens = encoded
    check_ids(piece_flat, enc.vocab_size, where)
    piece_start = np.zeros(len(piece_lens), dtype=np.int64)
    if len(piece_lens):
        np.cumsum(piece_lens[:-1], out=piece_start[1:])
    return piece_flat, piece_lens, piece_start


def _gather(
    seg: Segments, key: str, piece_flat: np.ndarray, piece_lens: np.ndarray, piece_start: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One key's tokens, mask bits and item lengths: each text segment its piece's ids, each special one its id."""
    src = np.asarray(seg.src[key], dtype=np.int64)
    is_text = src >= 0
    seg_len = np.ones(len(src), dtype=np.int64)
    seg_len[is_text] = piece_lens[src[is_text]]
    # gather: text segment -> piece_flat[start + j]; special segment -> its id
    seg_from = np.where(is_text, piece_start[np.maximum(src, 0)], 0)
    seg_out = np.zeros(len(src), dtype=np.int64)
    if len(src):
        np.cumsum(seg_len[:-1], out=seg_out[1:])
    within = np.arange(int(seg_len.sum()), dtype=np.int64) - np.repeat(seg_out, seg_len)
    rep_text = np.repeat(is_text, seg_len)
    idx = np.repeat(seg_from, seg_len) + within
    text_ids = piece_flat[np.where(rep_text, idx, 0)] if len(piece_flat) else 0
    tokens = np.where(rep_text, text_ids, np.repeat(-src - 1, seg_len))
    mask = np.repeat(np.asarray(seg.mask[key], dtype=np.uint8), seg_len)
    nseg = np.asarray(seg.nseg[key], dtype=np.int64)
    seg_item = np.repeat(np.arange(len(nseg)), nseg)
    item_lens = np.bincount(seg_item, weights=seg_len, minlength=len(nseg)).astype(np.int64)
    return tokens, mask, item_lens


def concat_chunks(chunks: list[SplitChunk]) -> SplitChunk:
    if len(chunks) == 1:
        return chunks[0]
    out = SplitChunk()
    for c in chunks:
        out.ids.extend(c.ids)
        out.add_counts(c)
    for attr in SPLIT_ARRAYS:
        keys = getattr(chunks[0], attr).keys()
        setattr(out, attr, {k: np.concatenate([getattr(c, attr)[k] for c in chunks]) for k in keys})
    out.rec_tokens = np.concatenate([c.rec_tokens for c in chunks])
    return out


@dataclass(kw_only=True)
class TaskResult:
    docs_in: int
    reasons: dict[str, int]  # records the training type cannot render, by reason
    # one entry each: id, reason, where (part file:line), source; the task's first SAMPLES_PER_REASON of each
    # reason also carry their record's line (`text`, cut) so a drop can be read
    rejected: list[dict]
    splits: dict[str, SplitChunk]  # empty as returned; the run process reads them from splits_dir (save_splits)
    splits_dir: str = ""
    first_train: tuple[int, str] | None = None  # (split hash, id) of the train record with the smallest hash
    with_metadata: int = 0  # records with a title or author (what training_type auto decides on)
    languages: dict[str, list[int]] = field(default_factory=dict)  # meta.language -> [records, tokens] encoded


def save_splits(splits: dict[str, SplitChunk], path: str) -> None:
    """A task's encoded arrays as a folder of .npy files, `<split>.<what>[.<key>].npy` (plain arrays, which the run
    process loads with allow_pickle=False: nothing under the data root is unpickled), renamed into place complete (a
    killed, retried task never leaves half a folder). Saved and loaded about as fast as pickle and faster than one
    .npz (its zip read and checksummed)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp)
    for split, ch in splits.items():
        arrays: dict[str, np.ndarray] = {
            "ids": np.frombuffer("".join(ch.ids).encode("utf-8", "surrogatepass"), dtype=np.uint8),
            "id_chars": np.fromiter(map(len, ch.ids), dtype=np.int64, count=len(ch.ids)),
            "rec_tokens": ch.rec_tokens,
            "counts": np.array([getattr(ch, a) for a in SPLIT_COUNTS], dtype=np.int64),
        }
        arrays |= {f"{attr}.{key}": values for attr in SPLIT_ARRAYS for key, values in getattr(ch, attr).items()}
        for name, values in arrays.items():
            np.save(os.path.join(tmp, f"{split}.{name}.npy"), values)
    shutil.rmtree(path, ignore_errors=True)  # what an earlier attempt of a retried task renamed into place
    os.replace(tmp, path)


COUNT_ARRAYS = ("rec_tokens", "counts")  # what the run process's totals and pack plan read


def read_splits(path: str, only: str | None = None, data: bool = True) -> dict[str, SplitChunk]:
    """save_splits' folder back into SplitChunks (allow_pickle=False: an object array is refused, never unpickled):
    every split or `only` one; `data=False`: the counts alone (COUNT_ARRAYS), no ids or encoded arrays."""
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for name in sorted(os.listdir(path)):
        split, what = name.removesuffix(".npy").split(".", 1)
        if (only is None or split == only) and (data or what in COUNT_ARRAYS):
            arrays.setdefault(split, {})[what] = np.load(os.path.join(path, name), allow_pickle=False)
    splits = {}
    for split, named in arrays.items():
        ch = SplitChunk(rec_tokens=named.pop("rec_tokens"))
        if "ids" in named:
            text = named.pop("ids").tobytes().decode("utf-8", "surrogatepass")  # one decode, then slices
            ends = np.cumsum(named.pop("id_chars")).tolist()
            ch.ids = [text[a:b] for a, b in zip([0, *ends], ends)]
        for a, count in zip(SPLIT_COUNTS, named.pop("counts").tolist()):
            setattr(ch, a, count)
        for what, values in named.items():
            attr, key = what.split(".", 1)
            getattr(ch, attr)[key] = values
        splits[split] = ch
    return splits


def _lines(rng: ByteRange) -> tuple[list[bytes], Callable]:
    """The range's lines and the json_parser for them. A surrogate's UTF-8 form (json accepts it, the tokenizer does
    not) starts with byte ED, as some Hangul does: only a range holding one is decoded to find it."""
    with open(rng.path, "rb") as f:
        f.seek(rng.start)
        data = f.read(rng.end - rng.start)
    if b"\xed" in data:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = rng.first_line + data[: e.start].count(b"\n")
            raise CorruptOutputError(f"{rng.path}:{line}: not UTF-8 ({e.reason})") from None
    return data.split(b"\n"), json_parser(data)


def head_range(in_dir: Path, nbytes: int) -> ByteRange | None:
    """About the first `nbytes` of the folder's first part file, newline-aligned (None: no part file)."""
    parts = record_shards(in_dir)
    if not parts:
        return None
    with open(parts[0], "rb") as f:
        size = len(f.read(nbytes) + f.readline())
    return ByteRange(path=str(parts[0]), start=0, end=size, first_line=1)


def metadata_task(rng: ByteRange) -> tuple[int, int]:
    """(records, records with a title or author) of one byte range: what training_type auto decides on. Only the
    lines that hold a "title" or "author" key are parsed (deduped_jsonl is written by json.dumps: keys unescaped)."""
    records = with_metadata = 0
    lines, parse = _lines(rng)
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        records += 1
        if (b'"title"' in line or b'"author"' in line) and any(
            title_author(parse_record(line, rng.path, rng.first_line + n, parse))
        ):
            with_metadata += 1
    return records, with_metadata


UNKNOWN_LANGUAGE = "und"  # ISO 639-2 "undetermined": a record without meta.language


def record_language(rec: dict) -> str:
    meta = rec.get("meta")
    language = meta.get("language") if isinstance(meta, dict) else None
    return language if isinstance(language, str) and language else UNKNOWN_LANGUAGE


def count_languages(into: dict[str, list[int]], languages: list[str], rec_tokens: np.ndarray) -> None:
    """Adds records and tokens per language (`languages[i]` is the language of the record with rec_tokens[i])."""
    names, of_record = np.unique(languages, return_inverse=True)
    records = np.bincount(of_record, minlength=len(names)).tolist()
    tokens = np.bincount(of_record, weights=rec_tokens, minlength=len(names)).astype(np.int64).tolist()
    for name, n, t in zip(names.tolist(), records, tokens):
        figures = into.setdefault(name, [0, 0])
        figures[0] += n
        figures[1] += t


class _SplitRecords:
    """One task's encoded records per split (0 train, 1 val): the rendered ones waiting to be encoded (every
    batch_records), the chunks encoded, and each record's meta.language in record order."""

    def __init__(self, tt: str, enc: Encoder, dtype: np.dtype, where: str, batch_records: int):
        self.tt, self.enc, self.dtype, self.where, self.batch_records = tt, enc, dtype, where, batch_records
        self.rendered = [Segments(KEYS[tt]), Segments(KEYS[tt])]
        self.chunks: list[list[SplitChunk]] = [[], []]
        self.languages: list[list[str]] = [[], []]

    def add(self, s: int, rid: str, rec: dict) -> None:
        """The record just rendered into rendered[s]."""
        self.rendered[s].ids.append(rid)
        self.languages[s].append(record_language(rec))
        if len(self.rendered[s].ids) >= self.batch_records:
            self.flush(s)

    def flush(self, s: int) -> None:
        if self.rendered[s].ids:
            self.chunks[s].append(assemble(self.rendered[s], self.tt, self.enc, self.dtype, self.where))
        self.rendered[s] = Segments(KEYS[self.tt])

    def finish(self, languages: dict[str, list[int]]) -> dict[str, SplitChunk]:
        """Each split's chunks as one; adds records and tokens per language to `languages`."""
        splits = {}
        for s, split in enumerate(SPLITS):
            self.flush(s)
            if self.chunks[s]:
                splits[split] = concat_chunks(self.chunks[s])
                count_languages(languages, self.languages[s], splits[split].rec_tokens)
        return splits


def _reject(result: TaskResult, samples: ReasonSamples, reason: str, rec: dict, where: str, line: bytes) -> None:
    result.reasons[reason] = result.reasons.get(reason, 0) + 1
    rid = rec.get("id")
    entry = {"id": rid, "reason": reason, "where": where, "source": rec.get("source")}
    # the record as deduped_jsonl holds it (the fields the renderer lacked); a taken-down text is never copied
    if reason != FORGOTTEN_REASON and samples.add(reason, rid):
        entry = with_text(entry, line.decode("utf-8", "surrogatepass"))
    result.rejected.append(entry)


def encode_task(task: EncodeTask) -> TaskResult:
    """Worker: one byte range of one part file -> per-split SplitChunks, rejected records, counts."""
    if not task.threads:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    settings, rng = task.settings, task.range
    render = RENDERERS[settings.training_type]
    enc = encoder(task.tokenizer)
    split_records = _SplitRecords(
        settings.training_type, enc, np.dtype(task.token_dtype), rng.path, settings.batch_records
    )
    result = TaskResult(docs_in=0, reasons={}, rejected=[], splits={})
    samples = ReasonSamples()
    lines, parse = _lines(rng)
    reason: str | None  # why the record is rejected; None: rendered
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        result.docs_in += 1
        lineno = rng.first_line + n
        rec = parse_record(line, rng.path, lineno, parse)
        result.with_metadata += any(title_author(rec))
        rid = rec.get("id")
        if not isinstance(rid, str) or not rid:
            reason = "missing_id"
        elif task.forgotten.holds(rid, rec):
            reason = FORGOTTEN_REASON
        else:
            h = split_hash(rid)
            s = 1 if h < settings.val_fraction * 2.0**64 or rid in task.val_ids else 0
            reason = render(rec, split_records.rendered[s], enc.special, settings)
            if reason is None:
                split_records.add(s, rid, rec)
                if s == 0 and (result.first_train is None or (h, rid) < result.first_train):
                    result.first_train = (h, rid)
                continue
        _reject(result, samples, reason, rec, f"{os.path.basename(rng.path)}:{lineno}", line)
    save_splits(split_records.finish(result.languages), task.out)
    result.splits_dir = task.out
    return result
