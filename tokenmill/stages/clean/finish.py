"""Pass 2 on one shard: rule 7 on the records that hold a candidate boilerplate line (found by one vectorized
lookup per batch), rule 8 again on those only, then the shard and its rejected side file are written, with the
figures the check reads instead of the shard (its size, CRC-32 and record ids).

A record no line was stripped from keeps its pass-1 verdict: same text, same answer, so the filters effectively
run after rule 7.
"""

from __future__ import annotations

import os
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from tokenmill.common.io import JsonlWriter, dumps, line_ids, loads
from tokenmill.common.samples import ReasonSamples, with_text
from tokenmill.stages.clean.boilerplate import BoilerplateTable
from tokenmill.stages.clean.filters import first_failure, record_filters
from tokenmill.stages.clean.language import LanguageRule, identify_languages, relabelled
from tokenmill.stages.clean.line_stats import LineTable
from tokenmill.stages.clean.pii import mask_text
from tokenmill.stages.clean.prepare import coerce_text
from tokenmill.stages.clean.quality import recheck_record
from tokenmill.stages.clean.quality.settings import UNKNOWN_LANGUAGE
from tokenmill.stages.clean.quality.text import language_code
from tokenmill.stages.clean.report import Examples, Timer, length_hist
from tokenmill.stages.clean.settings import CleanSettings
from tokenmill.stages.clean.staging import StagedBatch, rejected_line


@dataclass(frozen=True, kw_only=True)
class FinishTask:
    stage: str
    """The shard's StagedBatch stream from pass 1 (removed once read)."""
    out: str
    """The cleaned shard."""
    rejected: str
    """Its rejected side file, concatenated in shard order into _rejected.jsonl."""
    settings: CleanSettings
    boilerplate: LineTable | None
    """The strippable candidate lines; None when boilerplate detection is off or found nothing."""


@dataclass(kw_only=True)
class FinishResult:
    docs_in: int
    docs_out: int
    reasons: dict
    chars_out: int
    hist_out: list[int]
    examples: dict
    stripped: dict
    """line hash -> [times stripped, the line, its score info]."""
    strip_hist: dict
    """Records by lines stripped from them (capped at 5)."""
    seconds: dict
    samples: dict
    """reason -> [(line index in the rejected side file, the entry with its text)], the shard's first ones."""
    size: int
    crc32: int
    """The shard's bytes and CRC-32, computed as it was written."""
    ids: np.ndarray | None
    """Its records' ids (io.line_ids), None when a line does not start with one."""
    languages: dict
    """language -> [records, characters] of the records written (empty when identification is off)."""
    drops_by_language: dict
    """(language, reason) -> records rejected (drop_languages)."""


@dataclass(kw_only=True)
class _Tally:
    """What finish_task counts of a shard as it writes it: FinishResult's figures but the stripper's (stripped
    lines, examples) and the seconds."""

    docs_in: int = 0
    docs_out: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    chars_out: int = 0
    lengths: list[int] = field(default_factory=list)  # each written record's characters (length_hist)
    strip_hist: Counter[int] = field(default_factory=Counter)
    samples: ReasonSamples = field(default_factory=ReasonSamples)
    size: int = 0
    crc32: int = 0
    ids: list[np.ndarray] | None = field(default_factory=list)  # per batch written; None once a line has no id
    languages: dict[str, list[int]] = field(default_factory=dict)
    drops_by_language: Counter[tuple[str, str]] = field(default_factory=Counter)

    def keep(self, b: StagedBatch, i: int, n_stripped: int) -> None:
        """Record i of the batch, to be written with `n_stripped` boilerplate lines stripped from it."""
        if (identified := b.languages[i]) is not None:
            figures = self.languages.setdefault(identified[0], [0, 0])
            figures[0] += 1
            figures[1] += b.len_out[i]
        self.chars_out += b.len_out[i]
        self.lengths.append(b.len_out[i])
        self.strip_hist[min(n_stripped, 5)] += 1

    def written(self, kept: list[bytes], data: bytes) -> None:
        """A batch's kept lines, written to the shard as `data`."""
        self.size, self.crc32 = self.size + len(data), zlib.crc32(data, self.crc32)
        self.docs_out += len(kept)
        if self.ids is not None:
            batch_ids = line_ids(kept)
            if batch_ids is None:
                self.ids = None
            else:
                self.ids.append(batch_ids)

    def result(self, examples: Examples, stripped: dict, seconds: dict) -> FinishResult:
        return FinishResult(
            docs_in=self.docs_in,
            docs_out=self.docs_out,
            reasons=dict(self.reasons),
            chars_out=self.chars_out,
            hist_out=length_hist(self.lengths),
            examples=examples.by_kind,
            stripped=stripped,
            strip_hist=dict(self.strip_hist),
            seconds=seconds,
            samples=self.samples.by_reason,
            size=self.size,
            crc32=self.crc32,
            ids=None if self.ids is None else np.concatenate(self.ids or [np.zeros(0, np.uint64)]),
            languages=self.languages,
            drops_by_language=dict(self.drops_by_language),
        )


class _Stripper:
    """Rule 7 and rule 8 again on the records of a staged batch that hold a candidate line."""

    def __init__(self, table: LineTable | None, s: CleanSettings):
        self.table = BoilerplateTable(table, s.bp_threshold) if table is not None else None
        self.wanted = table.hash if table is not None else None
        self.filters = record_filters(s)
        self.settings = s
        self.language = LanguageRule(s.languages, s.min_language_score) if s.language_id else None
        self.stripped: dict[int, list] = {}

    def _hit_docs(self, b: StagedBatch) -> tuple[list[int], np.ndarray, list[int]]:
        """Records holding a candidate line, all line hashes, and where each record's hashes end."""
        if self.wanted is None or not b.hashes:
            return [], np.zeros(0, np.uint64), []
        all_hashes = np.frombuffer(b.hashes, np.uint64)
        hits = np.isin(all_hashes, self.wanted)
        if not hits.any():
            return [], all_hashes, []
        owner = np.repeat(np.arange(len(b.out_lines)), b.n_lines)
        return np.unique(owner[hits]).tolist(), all_hashes, np.cumsum(b.n_lines).tolist()

    def strip(self, b: StagedBatch, examples: Examples) -> dict[int, int]:
        """Strips boilerplate lines in place in the batch; returns record index -> lines stripped."""
        if self.table is None:  # no candidate lines: no record holds one
            return {}
        hit_docs, all_hashes, ends = self._hit_docs(b)
        n_stripped = {}
        for i in hit_docs:
            rec = loads(b.out_lines[i])
            text, gone = self.table.strip(rec["text"], all_hashes[ends[i] - b.n_lines[i] : ends[i]].tolist())
            if not gone:
                continue
            n_stripped[i] = len(gone)
            for h, line, info in gone:
                entry = self.stripped.get(h)
                if entry is None:
                    self.stripped[h] = [1, line, info]
                else:
                    entry[0] += 1
            before, rec["text"] = rec["text"], text
            reject = first_failure(text, self.filters)
            if reject is None and self.language is not None:  # identified again on the text as written
                b.languages[i] = found = identify_languages([text])[0]
                rec = relabelled(rec, *found)
                reject = self.language.check(*found)
            if reject is None and self.settings.quality == "web":  # the web rules on the text as written
                rec["text"], reject = recheck_record(rec, text, self.settings)
                text = rec["text"]
            b.out_lines[i] = dumps(rec).encode("utf-8")
            b.len_out[i] = len(text)
            extra = f" (after stripping {len(gone)} boilerplate lines)"
            b.rej_lines[i] = None if reject is None else rejected_line(rec, reject, extra)
            if reject is None:
                examples.add("boilerplate", rec, before, text)
        return n_stripped


def drop_languages(b: StagedBatch, entries: dict[int, dict], identify: bool) -> dict[int, str]:
    """The language each rejected record of the batch is counted under: the one its rule judged it in (web rules,
    `language`), else the one identified for it, else its meta.language, else the one identified on its text as
    the rule saw it (one call for the batch, when identification is on), else UNKNOWN_LANGUAGE."""
    found, unknown = {}, {}
    for i, entry in entries.items():
        if entry.get("language"):
            found[i] = entry["language"]
        elif (identified := b.languages[i]) is not None:
            found[i] = identified[0]
        else:
            rec = loads(b.out_lines[i])
            meta = rec.get("meta")
            code = language_code(meta) if isinstance(meta, dict) else None
            text = coerce_text(rec.get("text"))
            if code:
                found[i] = code
            elif identify and text.strip():
                unknown[i] = text
            else:
                found[i] = UNKNOWN_LANGUAGE
    for i, (code, _) in zip(unknown, identify_languages(list(unknown.values()))):
        found[i] = code
    return dict(sorted(found.items()))


def finish_task(task: FinishTask) -> FinishResult:
    """Pass 2 on one shard (see the module docstring)."""
    timer = Timer()
    stripper = _Stripper(task.boilerplate, task.settings)
    examples = Examples(task.settings.examples)
    tally = _Tally()
    with JsonlWriter(task.out) as out, JsonlWriter(task.rejected) as rej, open(task.stage, "rb") as stage:
        out_b, rej_b = out.buffer, rej.buffer  # the staged lines are bytes already
        for b in StagedBatch.load_all(stage):
            timer.lap("stage_io")
            tally.docs_in += len(b.out_lines)
            n_stripped = stripper.strip(b, examples)
            timer.lap("strip_boilerplate")
            kept = []
            entries = {i: loads(r) for i, r in enumerate(b.rej_lines) if r is not None}
            for i, language in drop_languages(b, entries, task.settings.language_id).items():
                tally.drops_by_language[language, entries[i]["reason"]] += 1
            for i, r in enumerate(b.rej_lines):
                if r is not None:
                    entry = entries[i]
                    tally.reasons[entry["reason"]] += 1
                    if tally.samples.wants(entry["reason"]):  # the text as it stood when the rule rejected it
                        text = coerce_text(loads(b.out_lines[i]).get("text"))
                        text = mask_text(text, task.settings)  # a record rejected before masking holds its input
                        tally.samples.add(entry["reason"], (rej.count, with_text(entry, text)))
                    rej_b.write(r)
                    rej_b.write(b"\n")
                    rej.count += 1
                    continue
                kept.append(b.out_lines[i])
                tally.keep(b, i, n_stripped.get(i, 0))
            if kept:
                data = b"\n".join(kept) + b"\n"
                out_b.write(data)
                out.count += len(kept)
                tally.written(kept, data)
            timer.lap("write_json")
    os.unlink(task.stage)
    return tally.result(examples, stripper.stripped, timer.sec)
