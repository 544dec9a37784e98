"""The `tokenized_bins` stage: records -> token shards for one training type (docs/format.md).

Flow: the input part files are cut into newline-aligned byte ranges (tasks). A worker parses its
range, routes each record to train/val by a hash of its id, renders it into *segments* (a special
token, or a text piece with a mask bit), encodes all text pieces of a batch with one
`encode_batch` call and assembles the token keys with numpy gathers (no per-token Python work).
The parent packs the per-task arrays, in task order, into shards (`ShardWriter`), so the output is
byte-identical for any worker count or task cut. Text pieces are encoded with special-token
matching off, so a literal "</s>" in a poem stays text; special tokens are inserted by id, which is
what encoding the rendered string gives (added tokens split the input; BPE never merges across them):
on chinese-poetry both give exactly 7,451,422 tokens.

Cores: with several workers each spawned process encodes single-threaded (TOKENIZERS_PARALLELISM=false),
so JSON parsing and array work run in parallel too; with one worker the encoder's own threads use every
core. benchmarks/bench_tokenize.py: ~0.9 of the `encode_batch`-alone ceiling (wall and CPU time),
peak RSS ~280 MiB (parent + 2 workers) on 90k poems.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tokenmill.common.io import STATS_FILE, atomic_write_json, record_shards
from tokenmill.common.parallel import default_workers, map_ordered
from tokenmill.common.progress import Progress
from tokenmill.tokenization import SPECIAL_TOKENS, TOKENIZER_FILE, hash64, load_tokenizer

FORMAT_NAME = "tokenmill-shards"
FORMAT_VERSION = 1
DATASET_FILE = "dataset.json"
REJECTED_JSON = "_rejected.json"  # not .jsonl: record globbing tools must not take it for records
SPLITS = ("train", "val")
TRAINING_TYPES = ("seq", "conditional", "sft", "dpo", "grpo")

# training type -> {key: (dtype or "tokens", kind)} in file order
KEYS = {
    "seq": {"sequence": ("tokens", "tokens")},
    "conditional": {"sequence": ("tokens", "tokens"), "loss_mask": ("uint8", "mask")},
    "sft": {"sequence": ("tokens", "tokens"), "loss_mask": ("uint8", "mask")},
    "dpo": {"chosen": ("tokens", "tokens"), "rejected": ("tokens", "tokens"),
            "chosen_mask": ("uint8", "mask"), "rejected_mask": ("uint8", "mask")},
    "grpo": {"prompts": ("tokens", "tokens"), "responses": ("tokens", "tokens"),
             "masks": ("uint8", "mask"), "rewards": ("float32", "values")},
}
# mask key -> the token key it masks
MASK_OF = {"loss_mask": "sequence", "chosen_mask": "chosen", "rejected_mask": "rejected", "masks": "responses"}
TOKEN_KEYS = ("sequence", "chosen", "rejected", "prompts", "responses")
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
HIST_EDGES = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


@dataclass(frozen=True)
class ShardSettings:
    """How records become token shards."""

    training_type: str = "conditional"
    """seq | conditional | sft | dpo | grpo (see docs/format.md for each rendering)."""
    val_fraction: float = 0.05
    """Share of documents in `val`, chosen by a hash of the record id (stable when records are added)."""
    metadata_dropout: float = 0.25
    """conditional: share of documents rendered without title/author (per-document, seeded by id)."""
    seed: int = 42
    """Seed of the metadata dropout decision."""
    shard_tokens: int = 32_000_000
    """A shard is closed before a record would take it past this many tokens (records never straddle)."""
    token_dtype: str = "auto"
    """auto (uint16 when the vocabulary fits, else uint32) | uint16 | uint32; a vocabulary too large is refused."""
    batch_records: int = 2048
    """Records per encode_batch call inside a task."""
    task_bytes: int = 0
    """Input bytes per task (0: about 8 tasks per worker, 256 KiB..16 MiB); does not change the output."""


# ------------------------------------------------------------------------------------------------
# dtype checks
# ------------------------------------------------------------------------------------------------
def token_dtype_for(vocab_size: int, requested: str = "auto") -> np.dtype:
    """The token dtype for a vocabulary; refuses a vocabulary that overflows it."""
    if requested == "auto":
        requested = "uint16" if vocab_size <= 2 ** 16 else "uint32"
    if requested not in ("uint16", "uint32"):
        raise ValueError(f"token_dtype must be auto, uint16 or uint32, not {requested!r}")
    dt = np.dtype(requested)
    if vocab_size > np.iinfo(dt).max + 1:
        raise ValueError(f"vocabulary of {vocab_size:,} tokens overflows {dt} (max {np.iinfo(dt).max + 1:,} ids); "
                         f"use token_dtype uint32 or auto")
    return dt


def check_ids(ids: np.ndarray, vocab_size: int, where: str = "") -> None:
    if ids.size and int(ids.max()) >= vocab_size:
        raise ValueError(f"{where}: token id {int(ids.max())} >= vocabulary size {vocab_size}")


# ------------------------------------------------------------------------------------------------
# worker side: render + encode
# ------------------------------------------------------------------------------------------------
_TOK_CACHE: dict = {}


def _tokenizer(path: str):
    """Per-process tokenizer (special tokens matched as text inside pieces) and lookup tables."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _TOK_CACHE:
        tok = load_tokenizer(path)
        tok.encode_special_tokens = True
        vocab = tok.get_vocab_size(with_added_tokens=True)
        special = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
        missing = [t for t, i in special.items() if i is None]
        if missing:
            raise ValueError(f"{path}: tokenizer lacks special tokens {missing} (build it with the tokenizer asset)")
        _TOK_CACHE.clear()
        _TOK_CACHE[key] = (tok, vocab, special, _punct_table(tok, vocab))
    return _TOK_CACHE[key]


def _punct_table(tok, vocab: int) -> np.ndarray:
    """is_punct[id]: the token decodes to exactly one punctuation character."""
    table = np.zeros(vocab, dtype=bool)
    for i in range(vocab):
        s = tok.decode([i], skip_special_tokens=False)
        if len(s) == 1 and unicodedata.category(s).startswith("P"):
            table[i] = True
    return table


def _split_of(rid: str, val_fraction: float) -> int:
    return 1 if hash64("tokenmill-split", rid) < val_fraction * 2.0 ** 64 else 0


def _dropped(rid: str, seed: int, rate: float) -> bool:
    return rate > 0 and hash64("tokenmill-dropout", str(seed), rid) < rate * 2.0 ** 64


def _str(x) -> str | None:
    return x if isinstance(x, str) else None


class _Batch:
    """Segments of a batch of records, per key: special (id) or text piece (index), with mask bits."""

    def __init__(self, keys):
        self.texts: list[str] = []
        self.src = {k: [] for k in keys}     # >= 0: text piece index; < 0: -(special id) - 1
        self.mask = {k: [] for k in keys}
        self.nseg = {k: [] for k in keys}    # segments per item
        self.nitems = {k: [] for k in keys}  # items per record
        self.rewards: list[float] = []
        self.ids: list[str] = []
        self.sample_text: list[str | None] = []

    def text(self, key, s, m):
        self.src[key].append(len(self.texts))
        self.texts.append(s)
        self.mask[key].append(m)

    def special(self, key, sid, m):
        self.src[key].append(-sid - 1)
        self.mask[key].append(m)


def _render(rec: dict, tt: str, b: _Batch, sp: dict, settings: ShardSettings) -> tuple[str | None, dict]:
    """Appends the record's segments to `b`; returns (reason it cannot be rendered, flags)."""
    flags = {}
    if tt in ("seq", "conditional"):
        text = _str(rec.get("text"))
        if not text:
            return "empty_text", flags
        if tt == "seq":
            k = "sequence"
            b.special(k, sp["<s>"], 1); b.text(k, text, 1); b.special(k, sp["</s>"], 1)
            b.nseg[k].append(3); b.nitems[k].append(1)
            return None, flags
        meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
        title, author = _str(meta.get("title")) or "", _str(meta.get("author")) or ""
        k, n = "sequence", 0
        if not title and not author:
            flags["no_metadata"] = True
        elif _dropped(str(rec["id"]), settings.seed, settings.metadata_dropout):
            flags["dropout"] = True
        else:
            b.special(k, sp["<|title|>"], 0); b.text(k, title, 0)
            b.special(k, sp["<|author|>"], 0); b.text(k, author, 0)
            n = 4
        b.special(k, sp["<|content|>"], 0); b.text(k, text, 1); b.special(k, sp["</s>"], 1)
        b.nseg[k].append(n + 3); b.nitems[k].append(1)
        return None, flags
    if tt == "sft":
        msgs = rec.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return "missing_messages", flags
        for m in msgs:
            if not (isinstance(m, dict) and m.get("role") in ROLE_TOKENS and isinstance(m.get("content"), str)):
                return "bad_message", flags
        if not any(m["role"] == "assistant" for m in msgs):
            return "no_assistant_turn", flags
        k = "sequence"
        b.special(k, sp["<s>"], 0)
        for m in msgs:
            t = 1 if m["role"] == "assistant" else 0
            b.special(k, sp[ROLE_TOKENS[m["role"]]], 0); b.text(k, m["content"], t); b.special(k, sp["<|end|>"], t)
        b.special(k, sp["</s>"], 0)
        b.nseg[k].append(2 + 3 * len(msgs)); b.nitems[k].append(1)
        return None, flags
    if tt == "dpo":
        p, c, r = _str(rec.get("prompt")), _str(rec.get("chosen")), _str(rec.get("rejected"))
        if p is None or c is None or r is None:
            return "missing_dpo_fields", flags
        for k, resp in (("chosen", c), ("rejected", r)):
            b.special(k, sp["<s>"], 0); b.special(k, sp["<|user|>"], 0); b.text(k, p, 0)
            b.special(k, sp["<|end|>"], 0); b.special(k, sp["<|assistant|>"], 0)
            b.text(k, resp, 1); b.special(k, sp["<|end|>"], 1); b.special(k, sp["</s>"], 1)
            b.nseg[k].append(8); b.nitems[k].append(1)
        return None, flags
    if tt == "grpo":
        p, resps, rewards = _str(rec.get("prompt")), rec.get("responses"), rec.get("rewards")
        if p is None or not isinstance(resps, list) or not resps or not isinstance(rewards, list):
            return "missing_grpo_fields", flags
        if not all(isinstance(x, str) for x in resps):
            return "bad_responses", flags
        if len(rewards) != len(resps) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   for x in rewards):
            return "rewards_mismatch", flags
        k = "prompts"
        b.special(k, sp["<s>"], 0); b.special(k, sp["<|user|>"], 0); b.text(k, p, 0)
        b.special(k, sp["<|end|>"], 0); b.special(k, sp["<|assistant|>"], 0)
        b.nseg[k].append(5); b.nitems[k].append(1)
        for resp in resps:
            b.text("responses", resp, 1); b.special("responses", sp["<|end|>"], 1)
            b.special("responses", sp["</s>"], 1)
            b.nseg["responses"].append(3)
        b.nitems["responses"].append(len(resps))
        b.rewards.extend(float(x) for x in rewards)
        b.nitems["rewards"].append(1)
        b.nseg["rewards"].append(len(rewards))  # for rewards: values per item
        return None, flags
    raise ValueError(f"unknown training_type {tt!r}; expected one of {TRAINING_TYPES}")


@dataclass
class SplitChunk:
    """Encoded records of one split from one task: per key the flat data, item lengths, items per record."""

    ids: list = field(default_factory=list)
    data: dict = field(default_factory=dict)        # key -> 1-D array
    item_lens: dict = field(default_factory=dict)   # key -> int64 per item
    rec_items: dict = field(default_factory=dict)   # key -> int64 per record
    rec_tokens: np.ndarray | None = None            # token-key tokens per record
    supervised: int = 0
    punct: int = 0
    text_chars: int = 0
    text_tokens: int = 0
    dropout: int = 0
    no_metadata: int = 0

    @property
    def records(self) -> int:
        return len(self.ids)


def _assemble(b: _Batch, tt: str, tok, vocab: int, punct: np.ndarray, dtype, where: str) -> SplitChunk:
    """Encodes the batch's text pieces once and gathers every key's flat arrays."""
    encs = tok.encode_batch_fast(b.texts, add_special_tokens=False) if b.texts else []
    id_lists = [e.ids for e in encs]
    piece_lens = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    total = int(piece_lens.sum())
    piece_flat = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=total)
    check_ids(piece_flat, vocab, where)
    piece_start = np.zeros(len(piece_lens), dtype=np.int64)
    if len(piece_lens):
        np.cumsum(piece_lens[:-1], out=piece_start[1:])
    ch = SplitChunk(ids=b.ids)
    ch.text_chars = sum(map(len, b.texts))
    ch.text_tokens = total
    rec_tokens = np.zeros(len(b.ids), dtype=np.int64)
    for key, (kdt, kind) in KEYS[tt].items():
        if kind == "mask":
            continue
        nitems = np.asarray(b.nitems[key], dtype=np.int64)
        ch.rec_items[key] = nitems
        if kind == "values":  # grpo rewards: one item per record, nseg = values per record
            ch.data[key] = np.asarray(b.rewards, dtype=np.float32)
            ch.item_lens[key] = np.asarray(b.nseg[key], dtype=np.int64)
            continue
        src = np.asarray(b.src[key], dtype=np.int64)
        smask = np.asarray(b.mask[key], dtype=np.uint8)
        is_text = src >= 0
        seg_len = np.ones(len(src), dtype=np.int64)
        seg_len[is_text] = piece_lens[src[is_text]]
        # gather: text segment -> piece_flat[start + j]; special segment -> its id
        seg_from = np.where(is_text, piece_start[np.maximum(src, 0)], 0)
        n = int(seg_len.sum())
        seg_out = np.zeros(len(src), dtype=np.int64)
        if len(src):
            np.cumsum(seg_len[:-1], out=seg_out[1:])
        within = np.arange(n, dtype=np.int64) - np.repeat(seg_out, seg_len)
        rep_text = np.repeat(is_text, seg_len)
        idx = np.repeat(seg_from, seg_len) + within
        tokens = np.where(rep_text, piece_flat[np.where(rep_text, idx, 0)] if total else 0,
                          np.repeat(-src - 1, seg_len))
        mask = np.repeat(smask, seg_len)
        nseg = np.asarray(b.nseg[key], dtype=np.int64)
        seg_item = np.repeat(np.arange(len(nseg)), nseg)
        item_lens = np.bincount(seg_item, weights=seg_len, minlength=len(nseg)).astype(np.int64)
        check_ids(tokens, vocab, where)
        ch.data[key] = tokens.astype(dtype)
        ch.item_lens[key] = item_lens
        mkey = next((mk for mk, tk in MASK_OF.items() if tk == key and mk in KEYS[tt]), None)
        if mkey:
            ch.data[mkey] = mask
            ch.item_lens[mkey] = item_lens
            ch.rec_items[mkey] = nitems
            ch.supervised += int(mask.sum())
        else:
            ch.supervised += 0 if tt == "grpo" else n  # grpo prompts are context; seq trains every token
        ch.punct += int(punct[tokens].sum()) if n else 0
        rec_of_item = np.repeat(np.arange(len(nitems)), nitems)
        rec_tokens += np.bincount(rec_of_item, weights=item_lens, minlength=len(nitems)).astype(np.int64)
    ch.rec_tokens = rec_tokens
    return ch


def _concat_chunks(chunks: list[SplitChunk]) -> SplitChunk:
    if len(chunks) == 1:
        return chunks[0]
    out = SplitChunk()
    for c in chunks:
        out.ids.extend(c.ids)
        for a in ("supervised", "punct", "text_chars", "text_tokens", "dropout", "no_metadata"):
            setattr(out, a, getattr(out, a) + getattr(c, a))
    for attr in ("data", "item_lens", "rec_items"):
        keys = chunks[0].__dict__[attr].keys()
        setattr(out, attr, {k: np.concatenate([c.__dict__[attr][k] for c in chunks]) for k in keys})
    out.rec_tokens = np.concatenate([c.rec_tokens for c in chunks])
    return out


def encode_task(task: tuple) -> dict:
    """Worker: one byte range of one part file -> per-split SplitChunks, rejected records, counts."""
    path, start, end, first_line, tok_path, settings_d, threads = task
    if not threads:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    settings = ShardSettings(**settings_d)
    tt = settings.training_type
    tok, vocab, sp, punct = _tokenizer(tok_path)
    dtype = token_dtype_for(vocab, settings.token_dtype)
    with open(path, "rb") as f:
        f.seek(start)
        raw = f.read(end - start)
    lines = raw.decode("utf-8").split("\n")
    rel = os.path.basename(path)
    rejected, reasons = [], {}
    docs_in = 0
    batches = {s: _Batch(KEYS[tt]) for s in (0, 1)}
    chunks: dict[int, list[SplitChunk]] = {0: [], 1: []}
    flags_count = {0: {"dropout": 0, "no_metadata": 0}, 1: {"dropout": 0, "no_metadata": 0}}

    def flush(s):
        b = batches[s]
        if b.ids:
            ch = _assemble(b, tt, tok, vocab, punct, dtype, f"{path}")
            chunks[s].append(ch)
        batches[s] = _Batch(KEYS[tt])

    for n, line in enumerate(lines):
        if not line.strip():
            continue
        docs_in += 1
        lineno = first_line + n
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except ValueError as e:
            reasons["bad_json"] = reasons.get("bad_json", 0) + 1
            rejected.append({"reason": "bad_json", "where": f"{rel}:{lineno}", "error": str(e)[:200]})
            continue
        rid = rec.get("id")
        if not isinstance(rid, str) or not rid:
            reason = "missing_id"
        else:
            s = _split_of(rid, settings.val_fraction)
            b = batches[s]
            reason, flags = _render(rec, tt, b, sp, settings)  # checks every field before appending
            if reason is None:
                b.ids.append(rid)
                for fl in flags:
                    flags_count[s][fl] += 1
                if len(b.ids) >= settings.batch_records:
                    flush(s)
                continue
        reasons[reason] = reasons.get(reason, 0) + 1
        rejected.append({"id": rid, "reason": reason, "where": f"{rel}:{lineno}", "source": rec.get("source")})
    out = {"docs_in": docs_in, "reasons": reasons, "rejected": rejected, "splits": {}}
    for s in (0, 1):
        flush(s)
        if chunks[s]:
            ch = _concat_chunks(chunks[s])
            ch.dropout, ch.no_metadata = flags_count[s]["dropout"], flags_count[s]["no_metadata"]
            out["splits"][SPLITS[s]] = ch
    return out


# ------------------------------------------------------------------------------------------------
# parent side: shard writer
# ------------------------------------------------------------------------------------------------
class _HashingFile:
    def __init__(self, path: Path):
        self.f = open(path, "wb")
        self.h = hashlib.sha256()
        self.bytes = 0

    def write(self, arr: np.ndarray) -> None:
        b = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        self.f.write(b)
        self.h.update(b)
        self.bytes += len(b)

    def close(self) -> dict:
        self.f.close()
        return {"bytes": self.bytes, "sha256": self.h.hexdigest()}


class ShardWriter:
    """Packs SplitChunks into `split_dir/shard-XXXXX/` (written in `.tmp-shard-XXXXX/`, renamed when done)."""

    def __init__(self, split_dir: Path, training_type: str, vocab_size: int, token_dtype: str | np.dtype,
                 shard_tokens: int):
        self.dir = Path(split_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tt = training_type
        self.vocab = vocab_size
        self.dtype = np.dtype(token_dtype)
        if self.dtype not in (np.dtype("uint16"), np.dtype("uint32")):
            raise ValueError(f"token dtype must be uint16 or uint32, not {self.dtype}")
        if vocab_size > np.iinfo(self.dtype).max + 1:
            raise ValueError(f"vocabulary of {vocab_size:,} tokens overflows {self.dtype}; refusing to write")
        self.shard_tokens = max(1, int(shard_tokens))
        self.keys = {k: (self.dtype if d == "tokens" else np.dtype(d)) for k, (d, _) in KEYS[training_type].items()}
        self.shards: list[dict] = []
        self.bytes_per_key: dict[str, int] = {}
        self._open = None

    def _start(self):
        name = f"shard-{len(self.shards):05d}"
        tmp = self.dir / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self._open = {"name": name, "tmp": tmp, "tokens": 0, "ids": [],
                      "files": {k: _HashingFile(tmp / f"{k}.bin") for k in self.keys},
                      "offsets": {k: [np.zeros(1, dtype=np.int64)] for k in self.keys},
                      "ends": {k: 0 for k in self.keys}}

    def _finish(self):
        sh = self._open
        files = {f"{k}.bin": f.close() for k, f in sh["files"].items()}
        meta = {}
        for k, dt in self.keys.items():
            offs = np.concatenate(sh["offsets"][k])
            meta[k] = {"shape": [int(offs[-1])], "dtype": dt.name, "offsets": offs.tolist()}
        for fname, obj in (("meta.json", meta), ("record_ids.json", sh["ids"])):
            data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
            (sh["tmp"] / fname).write_bytes(data)
            files[fname] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for fname, info in files.items():
            self.bytes_per_key[fname] = self.bytes_per_key.get(fname, 0) + info["bytes"]
        os.replace(sh["tmp"], self.dir / sh["name"])
        self.shards.append({"name": sh["name"], "tokens": int(sh["tokens"]), "records": len(sh["ids"]),
                            "files": files})
        self._open = None

    def add(self, ch: SplitChunk) -> None:
        for k in TOKEN_KEYS:
            if k in ch.data:
                check_ids(ch.data[k], self.vocab, str(self.dir))
        cum_tok = np.concatenate([[0], np.cumsum(ch.rec_tokens)])
        cum_items = {k: np.concatenate([[0], np.cumsum(ch.rec_items[k])]) for k in self.keys}
        cum_elems = {k: np.concatenate([[0], np.cumsum(ch.item_lens[k])]) for k in self.keys}
        i, n = 0, ch.records
        while i < n:
            if self._open is None:
                self._start()
            sh = self._open
            room = self.shard_tokens - sh["tokens"]
            # records [i, j) fit: cum_tok[j] - cum_tok[i] <= room
            j = int(np.searchsorted(cum_tok, cum_tok[i] + room, side="right")) - 1
            if j <= i:
                if sh["ids"]:
                    self._finish()
                    continue
                j = i + 1  # one record larger than a shard gets a shard of its own
            for k in self.keys:
                a, b = cum_items[k][i], cum_items[k][j]
                ea, eb = cum_elems[k][a], cum_elems[k][b]
                arr = ch.data[k][ea:eb]
                if self.keys[k] != arr.dtype:
                    arr = arr.astype(self.keys[k])
                sh["files"][k].write(arr)
                sh["offsets"][k].append(sh["ends"][k] + cum_elems[k][a + 1:b + 1] - ea)
                sh["ends"][k] += int(eb - ea)
            sh["ids"].extend(ch.ids[i:j])
            sh["tokens"] += int(cum_tok[j] - cum_tok[i])
            i = j
            if sh["tokens"] >= self.shard_tokens:
                self._finish()

    def close(self) -> list[dict]:
        if self._open is not None:
            self._finish()
        if not self.shards:  # an empty split still gets one (empty) shard, so it loads
            self._start()
            self._finish()
        return self.shards

    def abort(self) -> None:
        if self._open is not None:
            for f in self._open["files"].values():
                f.f.close()
            shutil.rmtree(self._open["tmp"], ignore_errors=True)
            self._open = None


# ------------------------------------------------------------------------------------------------
# the stage
# ------------------------------------------------------------------------------------------------
def _tasks(in_dir: Path, task_bytes: int, workers: int) -> list[tuple[str, int, int, int]]:
    """Newline-aligned byte ranges of the part files: (path, start, end, first line number).

    Streams each file once (a range at a time) to find the cuts and count lines; nothing is kept.
    """
    parts = record_shards(in_dir)
    total = sum(p.stat().st_size for p in parts)
    if not task_bytes:
        task_bytes = min(16 << 20, max(256 << 10, total // max(1, 8 * workers)))
    tasks = []
    for p in parts:
        size = p.stat().st_size
        with open(p, "rb") as f:
            start, line = 0, 1
            while start < size:
                chunk = f.read(task_bytes)
                if start + len(chunk) < size:
                    chunk += f.readline()  # up to and including the next newline
                end = start + len(chunk)
                tasks.append((str(p), start, end, line))
                line += chunk.count(b"\n")
                start = end
    return tasks


def _hist(tokens_per_doc: np.ndarray) -> list[dict]:
    edges = HIST_EDGES + [np.inf]
    counts, _ = np.histogram(tokens_per_doc, bins=edges) if tokens_per_doc.size else ([0] * (len(edges) - 1), None)
    rows = []
    for lo, hi, c in zip(edges[:-1], edges[1:], counts):
        rows.append({"tokens": f"{lo}-{int(hi) - 1}" if hi != np.inf else f">={lo}", "docs": int(c)})
    while len(rows) > 1 and rows[-1]["docs"] == 0:
        rows.pop()
    return rows


def sample_markdown(tok, ids: np.ndarray, mask: np.ndarray | None) -> str:
    """Decoded tokens with masked spans in [brackets] (and ~~struck~~); trained text plain."""
    if mask is None:
        mask = np.ones(len(ids), dtype=np.uint8)
    out, i = [], 0
    while i < len(ids):
        j = i
        while j < len(ids) and mask[j] == mask[i]:
            j += 1
        text = tok.decode([int(x) for x in ids[i:j]], skip_special_tokens=False)
        out.append(text if mask[i] else f"[~~{text}~~]")
        i = j
    return "".join(out)


def tokenize_corpus(in_dir: Path, tokenizer_dir: Path, out_dir: Path, settings: ShardSettings,
                    workers: int | None = None, log=None) -> dict:
    """Writes out_dir/train/ and out_dir/val/ (docs/format.md), _rejected.json and _stats.json."""
    t0 = time.perf_counter()
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    tt = settings.training_type
    if tt not in TRAINING_TYPES:
        raise ValueError(f"unknown training_type {tt!r}; expected one of {TRAINING_TYPES}")
    if not 0.0 <= settings.val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), not {settings.val_fraction}")
    if not 0.0 <= settings.metadata_dropout <= 1.0:
        raise ValueError(f"metadata_dropout must be in [0, 1], not {settings.metadata_dropout}")
    if settings.shard_tokens < 1 or settings.batch_records < 1 or settings.task_bytes < 0:
        raise ValueError("shard_tokens and batch_records must be >= 1, task_bytes >= 0")
    tok_path = Path(tokenizer_dir)
    tok_path = tok_path / TOKENIZER_FILE if tok_path.is_dir() else tok_path
    tok, vocab, special, _ = _tokenizer(str(tok_path))
    dtype = token_dtype_for(vocab, settings.token_dtype)
    tok_bytes = tok_path.read_bytes()
    workers = default_workers() if workers is None else max(1, workers)
    tasks = _tasks(in_dir, settings.task_bytes, workers)
    threads = workers <= 1 or len(tasks) <= 1  # in-process: let the encoder use every core
    task_args = [(p, a, b, ln, str(tok_path), asdict(settings), threads) for p, a, b, ln in tasks]
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = {s: out_dir / f".tmp-{s}" for s in SPLITS}
    for d in staging.values():
        shutil.rmtree(d, ignore_errors=True)
    writers = {s: ShardWriter(staging[s], tt, vocab, dtype, settings.shard_tokens) for s in SPLITS}
    progress = Progress("tokenized_bins", total=sum(b - a for _, a, b, _ in tasks), unit="bytes", log=log)
    totals = {s: {"records": 0, "supervised": 0, "punct": 0, "text_chars": 0, "text_tokens": 0,
                  "dropout": 0, "no_metadata": 0} for s in SPLITS}
    tokens_per_doc = {s: [] for s in SPLITS}
    reasons: dict[str, int] = {}
    docs_in = 0
    sample = None
    rej_tmp = out_dir / f".{REJECTED_JSON}.tmp"
    n_rejected = 0
    try:
        with open(rej_tmp, "w", encoding="utf-8") as rej:
            rej.write("[")
            for task, res in zip(tasks, map_ordered(encode_task, task_args, workers)):
                docs_in += res["docs_in"]
                for r, c in res["reasons"].items():
                    reasons[r] = reasons.get(r, 0) + c
                for entry in res["rejected"]:
                    rej.write(("\n" if n_rejected == 0 else ",\n") + json.dumps(entry, ensure_ascii=False))
                    n_rejected += 1
                for s, ch in res["splits"].items():
                    writers[s].add(ch)
                    t = totals[s]
                    t["records"] += ch.records
                    for a in ("supervised", "punct", "text_chars", "text_tokens", "dropout", "no_metadata"):
                        t[a] += getattr(ch, a)
                    tokens_per_doc[s].append(ch.rec_tokens.astype(np.int32))
                    if sample is None and s == "train" and ch.records:
                        sample = _first_record(ch, tt)
                progress.advance(task[2] - task[1])
            rej.write("\n]\n" if n_rejected else "]\n")
        os.replace(rej_tmp, out_dir / REJECTED_JSON)
        manifests = {}
        for s in SPLITS:
            shards = writers[s].close()
            (staging[s] / TOKENIZER_FILE).write_bytes(tok_bytes)
            manifests[s] = _dataset_json(s, tt, vocab, dtype, special, tok_bytes, shards, totals[s])
            atomic_write_json(staging[s] / DATASET_FILE, manifests[s])
        for s in SPLITS:
            final = out_dir / s
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging[s], final)
    except BaseException:
        for s in SPLITS:
            writers[s].abort()
            shutil.rmtree(staging[s], ignore_errors=True)
        rej_tmp.unlink(missing_ok=True)
        (out_dir / REJECTED_JSON).unlink(missing_ok=True)
        raise
    progress.finish()
    seconds = time.perf_counter() - t0
    stats = _stats(settings, vocab, dtype, docs_in, reasons, manifests, totals, tokens_per_doc, writers,
                   tok, sample, seconds, workers, len(tasks))
    atomic_write_json(out_dir / STATS_FILE, stats)
    if log:
        log.info(f"tokenized_bins: {stats['docs_out']:,} records, {stats['tokens']:,} tokens "
                 f"({stats['tokens_per_second']:,.0f}/s), dropped {n_rejected:,}")
    return stats


def _first_record(ch: SplitChunk, tt: str) -> dict:
    key = {"dpo": "chosen", "grpo": "prompts"}.get(tt, "sequence")
    mkey = {"sequence": "loss_mask", "chosen": "chosen_mask"}.get(key)
    n = int(ch.item_lens[key][0])
    ids = ch.data[key][:n].copy()
    mask = ch.data[mkey][:n].copy() if mkey in ch.data else None
    if tt == "grpo":  # prompt + first response
        m = int(ch.item_lens["responses"][0])
        ids = np.concatenate([ids, ch.data["responses"][:m]])
        mask = np.concatenate([np.zeros(n, np.uint8), ch.data["masks"][:m]])
    return {"id": ch.ids[0], "ids": ids, "mask": mask}


def _dataset_json(split, tt, vocab, dtype, special, tok_bytes, shards, t) -> dict:
    tokens = sum(s["tokens"] for s in shards)
    return {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION,
        "training_type": tt, "split": split,
        "vocab_size": vocab, "token_dtype": dtype.name,
        "tokenizer": {"file": TOKENIZER_FILE, "sha256": hashlib.sha256(tok_bytes).hexdigest(), "vocab_size": vocab},
        "special_tokens": special,
        "keys": {k: {"dtype": dtype.name if d == "tokens" else d, "kind": kind}
                 for k, (d, kind) in KEYS[tt].items()},
        "shards": shards,
        "totals": {"tokens": tokens, "records": sum(s["records"] for s in shards),
                   "supervised_tokens": t["supervised"], "masked_tokens": tokens - t["supervised"]},
    }


def _stats(settings, vocab, dtype, docs_in, reasons, manifests, totals, tokens_per_doc, writers, tok,
           sample, seconds, workers, ntasks) -> dict:
    tokens = sum(m["totals"]["tokens"] for m in manifests.values())
    records = sum(m["totals"]["records"] for m in manifests.values())
    supervised = sum(m["totals"]["supervised_tokens"] for m in manifests.values())
    tpd = np.concatenate([a for s in SPLITS for a in tokens_per_doc[s]]) if records else np.zeros(0, np.int32)
    text_chars = sum(t["text_chars"] for t in totals.values())
    text_tokens = sum(t["text_tokens"] for t in totals.values())
    punct = sum(t["punct"] for t in totals.values())
    dropout = sum(t["dropout"] for t in totals.values())
    bytes_per_key: dict[str, int] = {}
    for w in writers.values():
        for k, v in w.bytes_per_key.items():
            bytes_per_key[k] = bytes_per_key.get(k, 0) + v
    stats = {
        "docs_in": docs_in, "docs_out": records,
        **{f"dropped_{r}": c for r, c in sorted(reasons.items())},
        "training_type": settings.training_type, "settings": asdict(settings),
        "vocab_size": vocab, "token_dtype": dtype.name,
        "records": records, "tokens": tokens,
        "supervised_tokens": supervised, "masked_tokens": tokens - supervised,
        "supervised_share": round(supervised / tokens, 4) if tokens else 0.0,
        "masked_share": round((tokens - supervised) / tokens, 4) if tokens else 0.0,
        "metadata_dropout": dropout,
        "metadata_dropout_share": round(dropout / records, 4) if records else 0.0,
        "no_metadata": sum(t["no_metadata"] for t in totals.values()),
        "records_with_metadata": records - sum(t["no_metadata"] for t in totals.values()) - dropout
        if settings.training_type == "conditional" else 0,
        "chars_per_token": round(text_chars / text_tokens, 4) if text_tokens else None,
        "isolated_punctuation_tokens": punct,
        "isolated_punctuation_share": round(punct / tokens, 5) if tokens else 0.0,
        "bytes_on_disk": bytes_per_key,
        "tokens_per_doc": {
            "mean": round(float(tpd.mean()), 2) if tpd.size else 0.0,
            **{f"p{q}": int(np.percentile(tpd, q)) if tpd.size else 0 for q in (50, 90, 99)},
            "max": int(tpd.max()) if tpd.size else 0,
            "histogram": _hist(tpd),
        },
        "seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else 0.0,
        "workers": workers, "tasks": ntasks,
    }
    for s in SPLITS:
        stats[f"{s}_tokens"] = manifests[s]["totals"]["tokens"]
        stats[f"{s}_records"] = manifests[s]["totals"]["records"]
        stats[f"{s}_shards"] = len(manifests[s]["shards"])
        stats[s] = {"tokens": stats[f"{s}_tokens"], "records": stats[f"{s}_records"], "shards": stats[f"{s}_shards"]}
    if sample is not None:
        stats["sample"] = {"id": sample["id"], "tokens": int(len(sample["ids"])),
                           "markdown": sample_markdown(tok, sample["ids"], sample["mask"])}
    return stats
