"""Pass 1 on one shard: read each record once, rules 0-6, rule 8 on the text as it stands, line statistics.

It stages per batch (`StagedBatch`) what pass 2 needs, so pass 2 touches only the records that hold a
boilerplate line: each record's output line as bytes (the input line itself when nothing changed), its rejected
line if a filter failed, and the 64-bit hashes of its lines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenmill.common.io import dumps, json_parser
from tokenmill.errors import CorruptOutputError
from tokenmill.stages.clean import repair as R
from tokenmill.stages.clean.decontam import ContaminationIndex
from tokenmill.stages.clean.filters import check_too_long, record_filters
from tokenmill.stages.clean.language import LanguageRule, identify_languages, with_language, with_language_line
from tokenmill.stages.clean.line_stats import LineStats, save_lines
from tokenmill.stages.clean.metadata import extract_metadata
from tokenmill.stages.clean.pii import masker_for
from tokenmill.stages.clean.quality import check_batch
from tokenmill.stages.clean.report import Examples, Timer, length_hist
from tokenmill.stages.clean.settings import CleanSettings
from tokenmill.stages.clean.staging import StagedBatch, rejected_line

BATCH = 2048  # records per column-wise batch: bounded memory, per-rule timing without per-record clock calls
READ_BYTES = 4 << 20  # lines read at a time
SPECIAL_TEXT_KEYS = ("messages", "prompt", "chosen", "rejected", "responses")


@dataclass(frozen=True, kw_only=True)
class PrepareTask:
    shard: str
    """A raw_records shard."""
    stage: str
    """Where its StagedBatch stream goes (removed by pass 2)."""
    lines: str
    """Where its line statistics go (save_lines; read by the merge tasks, removed at the end)."""
    settings: CleanSettings
    contamination: ContaminationIndex | None = None
    """The evaluation sets' cached indexes (paths: each worker maps them), None when decontamination is off."""


@dataclass(kw_only=True)
class PrepareResult:
    counts: dict
    """Repairs: mojibake_repaired, surrogates_removed, control_chars_removed, meta_lines_extracted, ..."""
    chars_in: int
    hist_in: list[int]
    seconds: dict
    line_docs: int
    """Documents the shard's line statistics cover."""
    line_rows: int
    """Distinct lines in them."""
    examples: dict


@dataclass(slots=True)
class Prepared:
    """One record after rules 0-6 (and 8, once the filters ran)."""

    new: dict | None
    """The record as it is written, None when unchanged (the input line is the output line)."""
    text: str
    reject: tuple | None
    """(reason, detail) of the rule that rejected it."""
    chars_in: int
    before: str | None
    """The input text, when the record changed."""
    kind: str | None
    """Kind of change for the examples: "metadata" or "repair"."""
    language: tuple | None = None
    """(code, score) of a record the filters kept, when language identification is on."""


@dataclass(kw_only=True)
class _Batch:
    """Rules 0-6 work column-wise over a batch: texts and metas by position, the live (not rejected) ones."""

    texts: list[str]
    metas: list[dict]
    live: list[int]
    rejects: dict[int, tuple] = field(default_factory=dict)
    meta_moved: set[int] = field(default_factory=set)


def read_batches(path: Path) -> Iterator[list[tuple[bytes, dict]]]:
    """Batches of (raw line as bytes without newline, parsed record) from one raw_records shard."""
    batch, n = [], 0
    with open(path, "rb") as f:
        while lines := f.readlines(READ_BYTES):
            parse = json_parser(b"".join(lines))  # one choice per block: cheaper than per line
            for line in lines:
                n += 1
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue
                try:
                    rec = parse(line)
                except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                    raise CorruptOutputError(f"{path}:{n}: not a JSON record ({e}); rematerialize raw_records") from e
                batch.append((line, rec if isinstance(rec, dict) else {"text": rec}))
                if len(batch) >= BATCH:
                    yield batch
                    batch = []
    if batch:
        yield batch


def coerce_text(value) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return str(value)


def repair_batch(b: _Batch, s: CleanSettings, timer: Timer, counts: Counter) -> None:
    """Rules 0-6 on the live records of a batch, in place."""
    texts, live = b.texts, b.live
    if s.max_chars and max(map(len, texts), default=0) > s.max_chars:  # one C-level pass when none is too long
        for i in live:
            bad = check_too_long(texts[i], s.max_chars)
            if bad:
                b.rejects[i] = bad
        live[:] = [i for i in live if i not in b.rejects]
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
    # a text with an inner run of spaces and nothing else to repair skips the passes above, not this one
    spaced = [i for i in live if "  " in texts[i]] if s.collapse_inner_spaces else []
    for i in sorted({*flagged, *spaced}):
        texts[i] = R.normalize_whitespace(texts[i], s.collapse_inner_spaces)
    timer.lap("normalize_whitespace")
    masker = masker_for(s)  # None unless pii_mask
    if masker is not None:  # before metadata extraction: a header line moves into meta masked
        masker.mask_batch(texts, live, counts)
    timer.lap("mask_pii")
    if s.extract_metadata:
        for i in live:
            texts[i], b.metas[i], n = extract_metadata(texts[i], b.metas[i], s.max_header_lines)
            if n:
                counts["meta_lines_extracted"] += n
                counts["docs_meta_extracted"] += 1
                b.meta_moved.add(i)
    timer.lap("extract_metadata")


def _clean_meta(meta, form: R.NormalizationForm) -> dict:
    if not isinstance(meta, dict):
        return {}
    return {k: R.clean_meta_value(v, form) for k, v in meta.items()}


def _clean_special(rec: dict, s: CleanSettings, counts: Counter) -> None:
    """sft/dpo/grpo string fields get the repair rules (no filters: the record's text stands for them)."""

    masker = masker_for(s)

    def fix(v):
        if not isinstance(v, str):
            return v
        if R.needs_repair(v):
            v, _ = R.repair_surrogates(v)
            if s.fix_mojibake:
                v, _ = R.repair_mojibake(v)
            v = R.normalize_unicode(v, s.normalization)
            v, _ = R.strip_control_chars(v)
        return v if masker is None else masker.mask(v, counts)

    for k in SPECIAL_TEXT_KEYS:
        if k not in rec:
            continue
        v = rec[k]
        if isinstance(v, str):
            rec[k] = fix(v)
        elif isinstance(v, list):
            rec[k] = [{**t, "content": fix(t.get("content"))} if isinstance(t, dict) else fix(t) for t in v]


def _meta_strings(meta: dict) -> str:
    """The string values of a meta joined by newlines (all of them at once when all are strings, the usual case)."""
    try:
        return "\n".join(meta.values())
    except TypeError:
        return "\n".join(v for v in meta.values() if isinstance(v, str))


def _assemble(
    rec: dict, text: str, original: str, meta: dict, moved: bool, s: CleanSettings, counts: Counter
) -> Prepared:
    """The record after rules 1-6: rebuilt (id, text, meta, source, then its other fields) only when it changed."""
    if meta and R.meta_value_needs_cleaning(_meta_strings(meta) + "\n.", s.normalization):
        meta = _clean_meta(meta, s.normalization)
    changed = text is not original and text != original
    changed = changed or (meta is not rec.get("meta") and meta != rec.get("meta"))
    special = [k for k in SPECIAL_TEXT_KEYS if k in rec] if len(rec) > 4 else ()
    new = None
    if changed or special:
        new = {"id": rec.get("id"), "text": text, "meta": meta, "source": rec.get("source")}
        for k, v in rec.items():
            if k not in new:
                new[k] = v
        if special:
            before = {k: rec[k] for k in special}
            _clean_special(new, s, counts)
            changed = changed or any(new[k] != v for k, v in before.items())
    return Prepared(
        new if changed else None,
        text,
        None,
        len(original),
        original if changed else None,
        "metadata" if moved else "repair",
    )


def prepare_batch(batch: list[tuple[bytes, dict]], s: CleanSettings, timer: Timer, counts: Counter) -> list[Prepared]:
    """Rules 0-6 on a batch of (raw line, record)."""
    texts = [coerce_text(rec.get("text")) for _, rec in batch]
    originals = list(texts)
    b = _Batch(
        texts=texts,
        metas=[m if isinstance(m := rec.get("meta"), dict) else {} for _, rec in batch],
        live=list(range(len(batch))),
    )
    repair_batch(b, s, timer, counts)
    entries = []
    for i, (_, rec) in enumerate(batch):
        reject = b.rejects.get(i)
        if reject is not None:
            entries.append(
                Prepared({"id": rec.get("id"), "source": rec.get("source")}, "", reject, len(originals[i]), None, None)
            )
        else:
            entries.append(_assemble(rec, texts[i], originals[i], b.metas[i], i in b.meta_moved, s, counts))
    timer.lap("assemble_records")
    return entries


def _filter(entries: list[Prepared], filters, timer: Timer) -> None:
    """Rule 8 on the entries not yet rejected, filter by filter (each timed)."""
    live = [e for e in entries if e.reject is None]
    for name, check in filters:
        keep = []
        for e in live:
            bad = check(e.text)
            if bad:
                e.reject = bad
            else:
                keep.append(e)
        live = keep
        timer.lap(name)


def _identify(entries: list[Prepared], rule: LanguageRule, timer: Timer) -> None:
    """The language of each entry the filters kept (one call per batch), then the language rule on it."""
    live = [e for e in entries if e.reject is None]
    for e, found in zip(live, identify_languages([e.text for e in live])):
        e.language = found
        e.reject = rule.check(*found)
    timer.lap("identify_language")


def prepare_task(task: PrepareTask) -> PrepareResult:
    """Pass 1 on one shard (see the module docstring)."""
    s = task.settings
    timer = Timer()
    counts: Counter[str] = Counter()
    stats = LineStats(s.bp_edge_frac)
    filters = record_filters(s)
    language = LanguageRule(s.languages, s.min_language_score) if s.language_id else None
    examples = Examples(s.examples, masker_for(s))
    len_in, chars_in = [], 0
    with open(task.stage, "wb") as stage:
        for batch in read_batches(Path(task.shard)):
            timer.lap("read_json")
            entries = prepare_batch(batch, s, timer, counts)
            _filter(entries, filters, timer)
            if language is not None:
                _identify(entries, language, timer)
            if task.contamination is not None:
                task.contamination.screen(batch, entries, counts)
                timer.lap("decontaminate")
            if s.quality == "web":  # the batch's profile, resolved by clean_corpus before pass 1
                check_batch(batch, entries, s, counts)
                timer.lap("web_quality")
            if s.boilerplate:
                hashes, per_doc = stats.add_documents([e.text for e in entries if e.text])
                it = iter(per_doc.tolist())
                n_lines = [next(it) if e.text else 0 for e in entries]
            else:
                hashes, n_lines = np.zeros(0, np.uint64), [0] * len(entries)
            timer.lap("line_stats")
            staged = StagedBatch(
                out_lines=[],
                rej_lines=[],
                len_out=[],
                n_lines=n_lines,
                hashes=hashes.tobytes(),
                languages=[e.language for e in entries],
            )
            for (line, rec), e in zip(batch, entries):
                len_in.append(e.chars_in)
                chars_in += e.chars_in
                if e.language is not None:
                    if e.new is None:
                        staged.out_lines.append(with_language_line(line, rec, *e.language))
                    else:  # the examples show the rules' changes, without the language fields
                        staged.out_lines.append(dumps(with_language(e.new, *e.language)).encode("utf-8"))
                elif e.new is not None and e.text:
                    staged.out_lines.append(dumps(e.new).encode("utf-8"))
                else:
                    staged.out_lines.append(line)
                if e.new is not None and e.text and e.reject is None:
                    assert e.kind is not None and e.before is not None  # set with `new` on a record not rejected
                    examples.add(e.kind, e.new, e.before, e.text, old=rec)
                staged.rej_lines.append(None if e.reject is None else rejected_line(e.new or rec, e.reject))
                staged.len_out.append(len(e.text))
            timer.lap("write_json")
            staged.dump(stage)
            timer.lap("stage_io")
    table = stats.table()
    save_lines(table, task.lines)
    timer.lap("line_stats")
    return PrepareResult(
        counts=dict(counts),
        chars_in=chars_in,
        hist_in=length_hist(len_in),
        seconds=timer.sec,
        line_docs=table.docs,
        line_rows=len(table),
        examples=examples.by_kind,
    )
