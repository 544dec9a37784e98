"""cleaned_jsonl: repair, normalize, extract metadata, strip boilerplate and filter garbage, shard by shard.

Rules, in the order they run on each record (each a plain function in `clean_rules.py` / `boilerplate.py`):

  0. too_long guard       reject texts over `max_chars` before any work (reason "too_long")
  1. repair_surrogates    lone UTF-16 surrogates (JSON "\\ud800") removed, counted
  2. repair_mojibake      ftfy, encodings and HTML entities only (no width/quote/line-break changes)
  3. normalize_unicode    NFC (default), NFKC or none
  4. strip_control_chars  control, zero-width, BOM and bidi characters removed
  5. normalize_whitespace \\r\\n -> \\n, exotic spaces, trailing spaces, blank-line runs, outer blank lines
  6. extract_metadata     Title:/Author:/作者：/朝代：/By ... header lines (and repeats of the reader's title or
                          author) moved from the top of the text into `meta`, before boilerplate removal
  7. strip_boilerplate    lines whose joint boilerplate score passes the threshold (two passes, see below)
  8. filters, first failing one names the reason: empty, too_short, placeholder_glyphs, repetition

Rules 1-5 only run on a text that a few C-speed string tests (`needs_repair`) flag; most clean text skips them.

Two passes over the shards, each in parallel (`map_ordered`, one task per input shard, results in shard order):
  pass 1 reads and parses each record once, applies rules 0-6, then rule 8 on the text as it stands, and
  gathers line statistics (boilerplate.LineStats -> numpy arrays). It stages per batch (marshal, in out_dir,
  removed at the end) each record's output line as bytes (the input line itself when nothing changed), its
  rejected line if a filter failed, and the 64-bit hashes of its lines;
  merge sums the line statistics, keeps lines in >= `bp_min_df` documents and prunes, vectorized, those that
  cannot reach the threshold;
  pass 2 finds, with one np.isin per batch, the records that hold a candidate line, strips their boilerplate
  lines (rule 7) and runs rule 8 again on them only (a record no line was stripped from keeps its verdict:
  same text, same answer, so the filters effectively run after rule 7), then writes `part-XXXXX.jsonl` (same
  shard names as the input) and a rejected side file per shard, concatenated in order into `_rejected.jsonl`.
Output is byte-identical for any worker count; records in = out + rejected (checked before `_stats.json`).
"""
from __future__ import annotations

import json
import marshal
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tokenmill import clean_rules as R
from tokenmill.boilerplate import BoilerplateTable, LineStats, merge_line_stats, prune_candidates
from tokenmill.common.io import REJECTED_FILE, STATS_FILE, JsonlWriter, atomic_write_json, concat_files, dumps, record_shards
from tokenmill.common.parallel import default_workers, map_ordered
from tokenmill.common.progress import Progress

REASONS = ("too_long", "empty", "too_short", "placeholder_glyphs", "repetition")
RULES = ("read_json", "too_long", "repair_surrogates", "repair_mojibake", "normalize_unicode", "strip_control_chars",
         "normalize_whitespace", "extract_metadata", "assemble_records", "line_stats", "stage_io", "merge_line_stats",
         "strip_boilerplate", "filter_empty", "filter_too_short", "filter_placeholder_glyphs", "filter_repetition",
         "write_json")
# length histogram buckets (characters): [0,10), [10,20), ... [10000, inf)
LENGTH_BUCKETS = (0, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
EXAMPLE_CHARS = 160
BATCH = 2048  # records per column-wise batch: bounded memory, per-rule timing without per-record clock calls
PASS1_POOL_MIN_BYTES = 8 << 20  # input size from which pass 1 runs in worker processes
PASS2_POOL_MIN = 500_000  # records from which pass 2 runs in worker processes (see clean_corpus)
SPECIAL_TEXT_KEYS = ("messages", "prompt", "chosen", "rejected", "responses")


@dataclass(frozen=True)
class CleanSettings:
    normalization: str = "NFC"
    """Unicode normalization form: "NFC" (keeps full-width CJK punctuation), "NFKC" (also folds full-width
    ASCII, ligatures, circled digits), or "none"."""
    fix_mojibake: bool = True
    """Repair mojibake (UTF-8 read with the wrong codec) and HTML entities with ftfy."""
    extract_metadata: bool = True
    """Move title/author/dynasty/date/source header lines from the top of the text into meta."""
    max_header_lines: int = 6
    """How many lines at the top of a text may be metadata header lines."""
    boilerplate: bool = True
    """Strip boilerplate lines (two-pass corpus-wide detector)."""
    bp_min_df: int = 5
    """A line must occur in at least this many documents to be a boilerplate candidate."""
    bp_threshold: float = 0.65
    """Joint boilerplate score (df, position, template, short; 0..1) from which a candidate line is stripped."""
    bp_edge_frac: float = 0.05
    """Header/footer zone: the first/last share of a document's lines (at least one line each)."""
    min_chars: int = 10
    """Records with fewer non-whitespace characters after cleaning are rejected ("too_short"); a 20-character
    jueju passes."""
    max_chars: int = 1_000_000
    """Records longer than this (characters, before cleaning) are rejected ("too_long"); 0 disables the guard."""
    max_placeholder_ratio: float = 0.10
    """Reject when more than this share of characters are placeholders (U+FFFD, □, ■, private use, stray ?)."""
    max_dup_line_frac: float = 0.40
    """Reject when more than this share of lines repeat an earlier line (texts of 4+ lines; Gopher uses 0.30 for
    web text, poetry with refrains needs more room)."""
    max_dup_line_char_frac: float = 0.40
    """Reject when more than this share of characters sits in repeated lines (texts of 4+ lines)."""
    max_top_2gram_frac: float = 0.60
    """Reject when the most frequent word 2-gram (CJK: character 2-gram) covers more than this share of the tokens
    (texts of 50+ words or 80+ CJK characters). Spam sits near 1.0; on chinese-poetry (90k poems) no genuine
    poem passes 0.6, while refrain poems of the Shijing and Yuan qu reach 0.5."""
    max_top_3gram_frac: float = 0.60
    """As max_top_2gram_frac, for 3-grams."""
    max_top_4gram_frac: float = 0.60
    """As max_top_2gram_frac, for 4-grams."""
    examples: int = 6
    """Before/after examples kept in _stats.json."""

    def __post_init__(self):
        if self.normalization not in ("NFC", "NFKC", "none"):
            raise ValueError(f"normalization must be NFC, NFKC or none, not {self.normalization!r}")
        if self.min_chars < 0 or self.max_chars < 0 or self.bp_min_df < 1:
            raise ValueError("min_chars and max_chars must be >= 0, bp_min_df >= 1")

    def ngram_limits(self) -> dict:
        return {2: self.max_top_2gram_frac, 3: self.max_top_3gram_frac, 4: self.max_top_4gram_frac}


# --------------------------------------------------------------------------------------------- per record

class Timer:
    """Seconds per rule, summed over a worker's batches (reported as each rule's share of the stage)."""

    def __init__(self):
        self.sec = dict.fromkeys(RULES, 0.0)
        self._t = time.perf_counter()

    def lap(self, rule: str) -> None:
        now = time.perf_counter()
        self.sec[rule] += now - self._t
        self._t = now


def _coerce_text(value) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return str(value)


def _repair_batch(texts: list, metas: list, live: list[int], s: CleanSettings, timer: Timer, counts: Counter,
                  rejects: dict, meta_moved: set) -> None:
    """Rules 0-6 on the live records of a batch, in place."""
    if s.max_chars:
        for i in live:
            bad = R.check_too_long(texts[i], s.max_chars)
            if bad:
                rejects[i] = bad
        live[:] = [i for i in live if i not in rejects]
    timer.lap("too_long")
    flagged = [i for i in live if R.needs_repair(texts[i])]
    for i in flagged:
        texts[i], n = R.repair_surrogates(texts[i])
        if n:
            counts["surrogates_removed"] += n
            counts["docs_with_surrogates"] += 1
    timer.lap("repair_surrogates")
    if s.fix_mojibake:
        for i in flagged:
            texts[i], n = R.repair_mojibake(texts[i])
            counts["mojibake_repaired"] += n
    timer.lap("repair_mojibake")
    if s.normalization != "none":
        for i in live:
            texts[i] = R.normalize_unicode(texts[i], s.normalization)
    timer.lap("normalize_unicode")
    for i in flagged:
        texts[i], n = R.strip_control_chars(texts[i])
        counts["control_chars_removed"] += n
    timer.lap("strip_control_chars")
    for i in flagged:
        texts[i] = R.normalize_whitespace(texts[i])
    timer.lap("normalize_whitespace")
    if s.extract_metadata:
        for i in live:
            texts[i], metas[i], n = R.extract_metadata(texts[i], metas[i], s.max_header_lines)
            if n:
                counts["meta_lines_extracted"] += n
                counts["docs_meta_extracted"] += 1
                meta_moved.add(i)
    timer.lap("extract_metadata")


_raw_decode = json.JSONDecoder().raw_decode  # json.loads minus its wrapper: ~15% less per record


def _read_batches(path: Path):
    """Batches of (raw line as bytes without newline, parsed record) from one shard."""
    batch = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip(b"\r\n")
            if not line.strip():
                continue
            try:
                rec = _raw_decode(line.decode("utf-8"))[0]
            except (ValueError, UnicodeDecodeError):
                try:
                    rec = json.loads(line)  # leading whitespace and the like; a real error names the line
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise ValueError(f"{path}:{n}: not a JSON record ({e})") from e
            batch.append((line, rec if isinstance(rec, dict) else {"text": rec}))
            if len(batch) >= BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def _clean_meta(meta, form: str) -> dict:
    if not isinstance(meta, dict):
        return {}
    return {k: R.clean_meta_value(v, form) for k, v in meta.items()}


def _clean_special(rec: dict, s: CleanSettings) -> None:
    """sft/dpo/grpo string fields get the repair rules (no filters: the record's text stands for them)."""
    def fix(v):
        if not isinstance(v, str) or not R.needs_repair(v):
            return v
        v, _ = R.repair_surrogates(v)
        if s.fix_mojibake:
            v, _ = R.repair_mojibake(v)
        v = R.normalize_unicode(v, s.normalization)
        v, _ = R.strip_control_chars(v)
        return v
    for k in SPECIAL_TEXT_KEYS:
        if k not in rec:
            continue
        v = rec[k]
        if isinstance(v, str):
            rec[k] = fix(v)
        elif isinstance(v, list):
            rec[k] = [{**t, "content": fix(t.get("content"))} if isinstance(t, dict) else fix(t) for t in v]


def _prepare_batch(batch: list, s: CleanSettings, timer: Timer, counts: Counter) -> list:
    """Rules 0-6 on a batch of (raw line, record). Returns per record [new record or None (unchanged: the input
    line is the output line), text, reject or None, input length, input text when changed, kind of change]."""
    texts = [_coerce_text(rec.get("text")) for _, rec in batch]
    originals = list(texts)
    metas = [rec.get("meta") if isinstance(rec.get("meta"), dict) else {} for _, rec in batch]
    live = list(range(len(batch)))
    rejects: dict[int, tuple] = {}
    meta_moved: set[int] = set()
    _repair_batch(texts, metas, live, s, timer, counts, rejects, meta_moved)
    entries = []
    for i, (line, rec) in enumerate(batch):
        reject = rejects.get(i)
        if reject is not None:
            entries.append([{"id": rec.get("id"), "source": rec.get("source")}, "", reject, len(originals[i]),
                            None, None])
            continue
        meta = metas[i]
        if meta and R.meta_value_needs_cleaning("\n".join(v for v in meta.values() if isinstance(v, str)) + "\n.",
                                                 s.normalization):
            meta = _clean_meta(meta, s.normalization)
        changed = texts[i] is not originals[i] and texts[i] != originals[i]
        changed = changed or (meta is not rec.get("meta") and meta != rec.get("meta"))
        special = [k for k in SPECIAL_TEXT_KEYS if k in rec] if len(rec) > 4 else ()
        new = None
        if changed or special:
            new = {"id": rec.get("id"), "text": texts[i], "meta": meta, "source": rec.get("source")}
            for k, v in rec.items():
                if k not in new:
                    new[k] = v
            if special:
                before = {k: rec[k] for k in special}
                _clean_special(new, s)
                changed = changed or any(new[k] != v for k, v in before.items())
        entries.append([new if changed else None, texts[i], None, len(originals[i]),
                        originals[i] if changed else None, "metadata" if i in meta_moved else "repair"])
    timer.lap("assemble_records")
    return entries


def _filters(s: CleanSettings):
    """Rule 8, in order: (timer name, check)."""
    limits = s.ngram_limits()
    return (("filter_empty", R.check_empty),
            ("filter_too_short", lambda t: R.check_too_short(t, s.min_chars)),
            ("filter_placeholder_glyphs", lambda t: R.check_placeholder_glyphs(t, s.max_placeholder_ratio)),
            ("filter_repetition", lambda t: R.check_repetition(t, s.max_dup_line_frac, s.max_dup_line_char_frac,
                                                               limits)))


def _first_failure(text: str, filters) -> tuple | None:
    for _, check in filters:
        bad = check(text)
        if bad:
            return bad
    return None


def _rejected_line(rec: dict, reject: tuple, extra: str = "") -> bytes:
    reason, detail = reject
    return dumps({"id": rec.get("id"), "source": rec.get("source"), "reason": reason,
                  "detail": detail + extra}).encode("utf-8")


class Examples:
    """A few before/after examples per kind of change (boilerplate, metadata, repair)."""

    def __init__(self, n: int):
        self.n, self.by_kind = n, {}

    def add(self, kind: str, rec: dict, before: str, after: str) -> None:
        shelf = self.by_kind.setdefault(kind, [])
        if len(shelf) < self.n:
            b, a = _diff_window(before, after)
            shelf.append({"id": rec.get("id"), "kind": kind, "before": b, "after": a,
                          "meta": {k: _short(str(v)) for k, v in list((rec.get("meta") or {}).items())[:4]}})


def _hist(lengths: list[int]) -> list[int]:
    if not lengths:
        return [0] * len(LENGTH_BUCKETS)
    idx = np.searchsorted(np.array(LENGTH_BUCKETS[1:]), np.array(lengths), side="right")
    return np.bincount(idx, minlength=len(LENGTH_BUCKETS)).tolist()


def _short(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + "…"


def _diff_window(before: str, after: str) -> tuple[str, str]:
    """Short excerpts of before/after around their first difference (a repair deep in a long text shows)."""
    i = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    start = max(0, i - EXAMPLE_CHARS // 4)
    pre = "…" if start else ""
    # lone surrogates of the input cannot go into _stats.json: shown as U+FFFD
    before = R.SURROGATE_RE.sub("\ufffd", before[start:start + EXAMPLE_CHARS + 1])
    return pre + _short(before), pre + _short(after[start:])


# --------------------------------------------------------------------------------------------- the passes

def prepare_task(args: tuple) -> dict:
    """Pass 1 on one shard: rules 0-6, rule 8 on the text as it is, line statistics; stages per batch (marshal)
    what pass 2 needs: each record's output line (bytes), its rejected line if a filter failed, and the hashes
    of its lines. Pass 2 then touches only the records that hold a boilerplate line."""
    path, stage_path, s = args
    timer, counts = Timer(), Counter()
    stats = LineStats(s.bp_edge_frac)
    filters = _filters(s)
    examples = Examples(s.examples)
    len_in, chars_in = [], 0
    with open(stage_path, "wb") as stage:
        for batch in _read_batches(Path(path)):
            timer.lap("read_json")
            entries = _prepare_batch(batch, s, timer, counts)
            live = [e for e in entries if e[2] is None]
            for name, check in filters:
                keep = []
                for e in live:
                    bad = check(e[1])
                    if bad:
                        e[2] = bad
                    else:
                        keep.append(e)
                live = keep
                timer.lap(name)
            hashes, n_lines = [], []
            for e in entries:
                hs = stats.add_document(e[1]) if (s.boilerplate and e[1]) else ()
                hashes += hs
                n_lines.append(len(hs))
            timer.lap("line_stats")
            out_lines, rej_lines, len_out = [], [], []
            for (line, rec), e in zip(batch, entries):
                new, text, reject, n_in, before, kind = e
                len_in.append(n_in)
                chars_in += n_in
                if new is not None and text:
                    out_lines.append(dumps(new).encode("utf-8"))
                    if reject is None:
                        examples.add(kind, new, before, text)
                else:
                    out_lines.append(line)
                rej_lines.append(None if reject is None else _rejected_line(new or rec, reject))
                len_out.append(len(text))
            timer.lap("write_json")
            marshal.dump((out_lines, rej_lines, len_out, n_lines, np.array(hashes, np.uint64).tobytes()), stage)
            timer.lap("stage_io")
    return {"counts": dict(counts), "chars_in": chars_in, "hist_in": _hist(len_in), "seconds": timer.sec,
            "arrays": stats.arrays(), "examples": examples.by_kind}


def finish_task(args: tuple) -> dict:
    """Pass 2 on one shard: rule 7 on the records that hold a candidate boilerplate line (found by one vectorized
    lookup per batch), rule 8 again on those, then writes the shard and its rejected side file."""
    stage_path, out_path, rej_path, s, merged = args
    timer = Timer()
    table = BoilerplateTable(merged, s.bp_threshold) if merged is not None and len(merged["hash"]) else None
    wanted = merged["hash"] if table is not None else None
    filters = _filters(s)
    examples = Examples(s.examples)
    reasons, strip_hist, stripped = Counter(), Counter(), {}
    len_all = []
    docs_in = docs_out = chars_out = 0
    with JsonlWriter(out_path) as out, JsonlWriter(rej_path) as rej, open(stage_path, "rb") as stage:
        out_b, rej_b = out.buffer, rej.buffer  # the staged lines are bytes already
        while True:
            try:
                out_lines, rej_lines, len_out, n_lines, hash_bytes = marshal.load(stage)
            except EOFError:
                break
            timer.lap("stage_io")
            n = len(out_lines)
            docs_in += n
            hit_docs = []
            if wanted is not None and hash_bytes:
                all_hashes = np.frombuffer(hash_bytes, np.uint64)
                hits = np.isin(all_hashes, wanted)
                if hits.any():
                    owner = np.repeat(np.arange(n), n_lines)
                    hit_docs = np.unique(owner[hits]).tolist()
                    ends = np.cumsum(n_lines).tolist()
            n_stripped = {}
            for i in hit_docs:
                rec = json.loads(out_lines[i])
                text, gone = table.strip(rec["text"], all_hashes[ends[i] - n_lines[i]:ends[i]].tolist())
                if not gone:
                    continue
                n_stripped[i] = len(gone)
                for h, line, info in gone:
                    entry = stripped.get(h)
                    if entry is None:
                        stripped[h] = [1, line, info]
                    else:
                        entry[0] += 1
                before, rec["text"] = rec["text"], text
                reject = _first_failure(text, filters)
                out_lines[i] = dumps(rec).encode("utf-8")
                len_out[i] = len(text)
                extra = f" (after stripping {len(gone)} boilerplate lines)"
                rej_lines[i] = None if reject is None else _rejected_line(rec, reject, extra)
                if reject is None:
                    examples.add("boilerplate", rec, before, text)
            timer.lap("strip_boilerplate")
            for i in range(n):
                r = rej_lines[i]
                if r is not None:
                    reasons[json.loads(r)["reason"]] += 1
                    rej_b.write(r)
                    rej_b.write(b"\n")
                    rej.count += 1
                    continue
                out_b.write(out_lines[i])
                out_b.write(b"\n")
                out.count += 1
                docs_out += 1
                chars_out += len_out[i]
                len_all.append(len_out[i])
                strip_hist[min(n_stripped.get(i, 0), 5)] += 1
            timer.lap("write_json")
    os.unlink(stage_path)
    return {"docs_in": docs_in, "docs_out": docs_out, "reasons": dict(reasons), "chars_out": chars_out,
            "hist_out": _hist(len_all), "examples": examples.by_kind, "stripped": stripped,
            "strip_hist": dict(strip_hist), "seconds": timer.sec}


# --------------------------------------------------------------------------------------------- the stage

def _pick_examples(by_kind: dict, n: int) -> list:
    """Up to n examples, taken in turn from each kind of change (boilerplate, metadata, repair)."""
    order = [k for k in ("boilerplate", "metadata", "repair") if k in by_kind]
    out, i = [], 0
    while len(out) < n and any(i < len(by_kind[k]) for k in order):
        out += [by_kind[k][i] for k in order if i < len(by_kind[k])]
        i += 1
    return out[:n]


def _bucket_labels() -> list[str]:
    edges = list(LENGTH_BUCKETS) + [None]
    return [f"{a}-{b - 1}" if b is not None else f"{a}+" for a, b in zip(edges, edges[1:])]


def clean_corpus(in_dir: Path, out_dir: Path, settings: CleanSettings = CleanSettings(), workers: int | None = None,
                 log=None) -> dict:
    """Cleans every `in_dir/part-*.jsonl` into `out_dir` (same shard names) with `_rejected.jsonl` and
    `_stats.json`; returns the stats. See the module docstring for the rules and their order."""
    t0 = time.perf_counter()
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    if not in_dir.is_dir():
        raise FileNotFoundError(f"cleaned_jsonl: input folder does not exist: {in_dir} (materialize raw_records first)")
    shards = record_shards(in_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = settings
    seconds = dict.fromkeys(RULES, 0.0)
    # per shard: input, staged records (pass 1 -> pass 2), output shard, rejected side file
    paths = [(str(p), str(out_dir / f".stage-{p.stem}.marshal"), str(out_dir / p.name),
              str(out_dir / f".rejected-{p.stem}.part")) for p in shards]

    counts, strip_hist, reasons = Counter(), Counter(), Counter()
    hist_in = np.zeros(len(LENGTH_BUCKETS), np.int64)
    hist_out = np.zeros(len(LENGTH_BUCKETS), np.int64)
    docs_in = docs_out = chars_in = chars_out = 0
    examples, stripped, parts = {}, {}, []
    merged, docs_seen = None, 0
    try:
        progress = Progress("cleaned_jsonl pass 1 (repair, metadata, filters, line statistics)", total=len(shards),
                            unit="shards", log=log)
        small = sum(p.stat().st_size for p in shards) < PASS1_POOL_MIN_BYTES  # not worth starting processes
        for res in map_ordered(prepare_task, [(src, st, s) for src, st, _, _ in paths], 1 if small else workers):
            counts.update(res["counts"])
            chars_in += res["chars_in"]
            hist_in += res["hist_in"]
            for k, v in res["seconds"].items():
                seconds[k] += v
            for kind, shelf in res["examples"].items():
                examples.setdefault(kind, []).extend(shelf)
            parts.append(res["arrays"])
            docs_seen += res["arrays"]["docs"]
            progress.advance(1)
        progress.finish()
        t_merge = time.perf_counter()
        pass_seconds = {"pass1": round(t_merge - t0, 3)}
        if s.boilerplate:
            merged = prune_candidates(merge_line_stats(parts, s.bp_min_df), s.bp_threshold)
        del parts
        seconds["merge_line_stats"] = time.perf_counter() - t_merge
        t_pass2 = time.perf_counter()
        pass_seconds["merge"] = round(t_pass2 - t_merge, 3)

        progress = Progress("cleaned_jsonl pass 2 (boilerplate, write)", total=len(shards), unit="shards", log=log)
        # pass 2 is light (bytes in, bytes out, a few records stripped): below PASS2_POOL_MIN records, or with
        # nothing to strip, starting worker processes (~1 s each: interpreter, numpy) costs more than it saves
        light = merged is None or not len(merged["hash"]) or docs_seen < PASS2_POOL_MIN
        for res in map_ordered(finish_task, [(st, out, rej, s, merged) for _, st, out, rej in paths],
                               1 if light else workers):
            docs_in += res["docs_in"]
            docs_out += res["docs_out"]
            chars_out += res["chars_out"]
            reasons.update(res["reasons"])
            strip_hist.update(res["strip_hist"])
            hist_out += res["hist_out"]
            for kind, shelf in res["examples"].items():
                examples.setdefault(kind, []).extend(shelf)
            for h, (n, line, info) in res["stripped"].items():
                if h in stripped:
                    stripped[h][0] += n
                else:
                    stripped[h] = [n, line, info]
            for k, v in res["seconds"].items():
                seconds[k] += v
            progress.advance(1)
        progress.finish()
        concat_files([rej for *_, rej in paths], out_dir / REJECTED_FILE)
        pass_seconds["pass2"] = round(time.perf_counter() - t_pass2, 3)
    finally:
        for _, st, _, rej in paths:
            Path(st).unlink(missing_ok=True)
            Path(rej).unlink(missing_ok=True)

    top = sorted(stripped.values(), key=lambda e: (-e[0], e[1]))[:50]
    work = sum(seconds.values()) or 1.0
    n_rejected = sum(reasons.values())
    stats = {
        "docs_in": docs_in,
        "docs_out": docs_out,
        **{f"dropped_{r}": reasons.get(r, 0) for r in REASONS},
        "rejected": n_rejected,
        "rejected_by_reason": dict(sorted(reasons.items())),
        "mojibake_repaired": counts.get("mojibake_repaired", 0),
        "surrogates_removed": counts.get("surrogates_removed", 0),
        "control_chars_removed": counts.get("control_chars_removed", 0),
        "docs_meta_extracted": counts.get("docs_meta_extracted", 0),
        "meta_lines_extracted": counts.get("meta_lines_extracted", 0),
        "chars_in": chars_in,
        "chars_out": chars_out,
        "boilerplate": {
            "enabled": s.boilerplate,
            "candidates": int(merged["candidates"]) if merged is not None and "candidates" in merged else 0,
            "strippable_candidates": len(merged["hash"]) if merged is not None else 0,
            "lines_stripped": sum(e[0] for e in stripped.values()),
            "distinct_lines_stripped": len(stripped),
            "docs_touched": sum(v for k, v in strip_hist.items() if k),
            "docs_by_lines_stripped": {("5+" if k == 5 else str(k)): strip_hist[k] for k in sorted(strip_hist)},
            "top_lines": [{"line": line, "count": n, **info} for n, line, info in top],
        },
        "length_buckets": _bucket_labels(),
        "length_hist_before": hist_in.tolist(),
        "length_hist_after": hist_out.tolist(),
        "examples": _pick_examples(examples, s.examples),
        "shards": len(shards),
        "pass_seconds": pass_seconds,
        "workers": default_workers() if workers is None else workers,
        "rule_seconds": {k: round(v, 4) for k, v in seconds.items()},
        "rule_share": {k: round(v / work, 4) for k, v in seconds.items()},
        "settings": asdict(s),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if docs_in != docs_out + n_rejected:  # a bug, never expected: say so loudly rather than lose records
        raise RuntimeError(f"cleaned_jsonl: {docs_in} in != {docs_out} out + {n_rejected} rejected")
    atomic_write_json(out_dir / STATS_FILE, stats)
    return stats
