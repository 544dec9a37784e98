"""Clean orchestration: pass 1 over every shard, the corpus-wide boilerplate merge, pass 2, the stats and the
shards' figures (SHARDS_FILE: what cleaned_records_valid reads instead of re-parsing the shards)."""

from __future__ import annotations

import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenmill.common.io import (
    REJECTED_FILE,
    SHARDS_FILE,
    DistinctValues,
    JsonlWriter,
    atomic_write_json,
    dumps,
    record_shards,
    shard_figures,
)
from tokenmill.common.parallel import default_workers, hash_ranges, map_ordered
from tokenmill.common.progress import Progress
from tokenmill.common.results import StageResult, flattened, run_fact, write_result
from tokenmill.common.samples import ReasonSamples
from tokenmill.errors import StaleUpstreamError
from tokenmill.stages.clean.boilerplate import MergeTask, merge_task
from tokenmill.stages.clean.decontam import CACHE_DIR as DECONTAM_CACHE
from tokenmill.stages.clean.decontam import CONTAMINATION_REASON, ContaminationIndex, prepare_indexes
from tokenmill.stages.clean.filters import filter_reasons
from tokenmill.stages.clean.finish import FinishResult, FinishTask, finish_task
from tokenmill.stages.clean.language import LANGUAGE_REASON
from tokenmill.stages.clean.line_stats import LineTable
from tokenmill.stages.clean.model_scores import QUALITY_SCORE_REASON, ModelStep, SelectResult, run_model_step
from tokenmill.stages.clean.pii import KINDS as PII_KINDS
from tokenmill.stages.clean.prepare import PrepareResult, PrepareTask, prepare_task
from tokenmill.stages.clean.quality import QUALITY_REASONS, ProfileChoice, c4_lines_removed, choose_profile
from tokenmill.stages.clean.report import LENGTH_BUCKETS, bucket_labels, length_hist, pick_examples, rule_names
from tokenmill.stages.clean.settings import CleanSettings

LANGUAGE_REASONS = (LANGUAGE_REASON,)
CONTAMINATION_REASONS = (CONTAMINATION_REASON,)


def declared_reasons() -> tuple[str, ...]:
    """Every reason a rule declares, in the order `dropped` lists them: rule 0 and the record filters (from their
    declarations in filters.py), language, contamination, the web quality rules (read when called)."""
    return tuple(dict.fromkeys((*filter_reasons(), *LANGUAGE_REASONS, *CONTAMINATION_REASONS, *QUALITY_REASONS)))


REASONS = declared_reasons()  # as declared at import; the stage calls declared_reasons()


def dropped_counts(reasons: Counter, also: tuple[str, ...] = ()) -> dict[str, int]:
    """Records dropped per reason: every declared one (0 when unseen) and those of the steps that ran (`also`),
    then any other reason a rule returned, sorted, so no rejection is ever left out of the counts."""
    declared = (*declared_reasons(), *also)
    seen = sorted(set(reasons) - set(declared))
    return {r: reasons.get(r, 0) for r in (*declared, *seen)}


# input size from which both passes run on the workers (below it, starting a pool costs more than it saves;
# above it, pass 2 finds the pool pass 1 started: 0.9 s in this process vs 0.5 s on 2 workers for 355k poems)
POOL_MIN_BYTES = 8 << 20
# distinct-line rows of every shard together per merge task (48 bytes each): the merge is split into hash ranges
# so no process holds the whole corpus's line statistics
MERGE_ROWS = 2_000_000
TOP_LINES = 50  # stripped lines listed in _stats.json


@dataclass(frozen=True, kw_only=True)
class ShardPaths:
    shard: Path
    """The input shard."""
    stage: Path
    """Staged records from pass 1 to pass 2 (in out_dir, removed at the end)."""
    lines: Path
    """Line statistics from pass 1 to the merge (in out_dir, removed at the end)."""
    out: Path
    rejected: Path
    """The shard's rejected side file."""

    @classmethod
    def of(cls, shard: Path, out_dir: Path) -> ShardPaths:
        return cls(
            shard=shard,
            stage=out_dir / f".stage-{shard.stem}.marshal",
            lines=out_dir / f".lines-{shard.stem}.npy",
            out=out_dir / shard.name,
            rejected=out_dir / f".rejected-{shard.stem}.part",
        )


@dataclass(kw_only=True)
class Totals:
    """Pass results summed over shards, in shard order."""

    seconds: dict = field(default_factory=lambda: dict.fromkeys(rule_names(), 0.0))
    examples: dict = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    strip_hist: Counter = field(default_factory=Counter)
    stripped: dict = field(default_factory=dict)
    hist_in: np.ndarray = field(default_factory=lambda: np.zeros(len(LENGTH_BUCKETS), np.int64))
    hist_out: np.ndarray = field(default_factory=lambda: np.zeros(len(LENGTH_BUCKETS), np.int64))
    docs_in: int = 0
    docs_out: int = 0
    chars_in: int = 0
    chars_out: int = 0
    line_rows: int = 0
    """Distinct-line rows of every shard's line statistics (what the merge reads)."""
    pass_seconds: dict = field(default_factory=dict)
    samples: list = field(default_factory=list)
    """Each shard's FinishResult.samples, in shard order."""
    rejected_samples: dict = field(default_factory=dict)
    """reason -> the batch's first rejected entries with their text (as written in _rejected.jsonl)."""
    shards: list = field(default_factory=list)
    """Each shard's entry in SHARDS_FILE, in shard order."""
    ids: DistinctValues | None = field(default_factory=DistinctValues)
    """The shards' record ids (uint64), None once a shard has a line without one."""
    languages: dict = field(default_factory=dict)
    """language -> [records, characters] written."""
    drops_by_language: Counter = field(default_factory=Counter)
    """(language, reason) -> records rejected."""

    def _add_ids(self, ids: np.ndarray | None) -> None:
        if self.ids is None or ids is None:
            self.ids = None
        else:
            self.ids.add(ids)

    def add_selected(self, k: int, name: str, res: SelectResult) -> None:
        """Shard k as pass 3 rewrote it: its drops taken out of the records, characters, lengths and languages
        pass 2 counted, and counted as drops."""
        dropped = self.shards[k]["records"] - res.docs_out
        self.shards[k] = shard_figures(name, res.size, res.docs_out, res.crc32)
        self._add_ids(res.ids)
        self.docs_out -= dropped
        self.chars_out -= sum(res.dropped_lengths)
        self.hist_out -= np.array(length_hist(res.dropped_lengths), np.int64)
        self.reasons[QUALITY_SCORE_REASON] += dropped
        for language, n in res.dropped_languages.items():
            self.drops_by_language[language, QUALITY_SCORE_REASON] += n
            if language in self.languages:
                self.languages[language][0] -= n
                self.languages[language][1] -= res.dropped_chars_by_language[language]
        for reason, items in res.samples.items():
            self.samples[k].setdefault(reason, []).extend(items)

    def _add_common(self, res: PrepareResult | FinishResult) -> None:
        for k, v in res.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        for kind, shelf in res.examples.items():
            self.examples.setdefault(kind, []).extend(shelf)

    def add_prepared(self, res: PrepareResult) -> None:
        self._add_common(res)
        self.counts.update(res.counts)
        self.chars_in += res.chars_in
        self.hist_in += res.hist_in
        self.line_rows += res.line_rows

    def add_finished(self, res: FinishResult, name: str, with_ids: bool = True) -> None:
        """A shard pass 2 wrote; `with_ids` False when pass 3 rewrites it and adds its ids (add_selected)."""
        self._add_common(res)
        self.shards.append(shard_figures(name, res.size, res.docs_out, res.crc32))
        if with_ids:
            self._add_ids(res.ids)
        self.docs_in += res.docs_in
        self.docs_out += res.docs_out
        self.chars_out += res.chars_out
        self.reasons.update(res.reasons)
        self.strip_hist.update(res.strip_hist)
        self.hist_out += res.hist_out
        self.samples.append(res.samples)
        self.drops_by_language.update(res.drops_by_language)
        for language, (records, chars) in res.languages.items():
            figures = self.languages.setdefault(language, [0, 0])
            figures[0] += records
            figures[1] += chars
        for h, (n, line, info) in res.stripped.items():
            if h in self.stripped:
                self.stripped[h][0] += n
            else:
                self.stripped[h] = [n, line, info]


def run_pass1(
    paths: list[ShardPaths],
    s: CleanSettings,
    totals: Totals,
    workers: int,
    log,
    contamination: ContaminationIndex | None = None,
) -> list[tuple[str, int]]:
    """Rules 0-6 and 8, line statistics, staging; returns each shard's line-statistics file and the documents
    they cover, and adds up their rows in `totals.line_rows`."""
    progress = Progress(
        "cleaned_jsonl pass 1 (repair, metadata, filters, line statistics)", total=len(paths), unit="shards", log=log
    )
    tasks = [
        PrepareTask(shard=str(p.shard), stage=str(p.stage), lines=str(p.lines), settings=s, contamination=contamination)
        for p in paths
    ]
    shards = []
    for task, res in zip(tasks, map_ordered(prepare_task, tasks, workers)):
        totals.add_prepared(res)
        shards.append((task.lines, res.line_docs))
        progress.advance(1)
    progress.finish()
    return shards


def find_boilerplate(shards: list[tuple[str, int]], s: CleanSettings, totals: Totals, workers: int) -> LineTable | None:
    """The corpus-wide candidate lines (merged, pruned), one task per hash range of about MERGE_ROWS rows; None
    when detection is off."""
    if not s.boilerplate:
        return None
    t0 = time.perf_counter()
    ranges = hash_ranges(max(1, math.ceil(totals.line_rows / MERGE_ROWS)))
    tasks = [
        MergeTask(shards=tuple(shards), lo=lo, hi=hi, min_df=s.bp_min_df, threshold=s.bp_threshold) for lo, hi in ranges
    ]
    merged = LineTable.concat(list(map_ordered(merge_task, tasks, workers)))
    totals.seconds["merge_line_stats"] = time.perf_counter() - t0
    return merged


def run_pass2(
    paths: list[ShardPaths],
    out_dir: Path,
    s: CleanSettings,
    merged: LineTable | None,
    totals: Totals,
    workers: int,
    log,
    rewritten: bool,
) -> None:
    """Rule 7, rule 8 on the stripped records, the shards and their rejected side files written (`rewritten`:
    pass 3 rewrites the shards after)."""
    progress = Progress("cleaned_jsonl pass 2 (boilerplate, write)", total=len(paths), unit="shards", log=log)
    table = merged if merged is not None and len(merged) else None
    tasks = [
        FinishTask(stage=str(p.stage), out=str(p.out), rejected=str(p.rejected), settings=s, boilerplate=table)
        for p in paths
    ]
    for p, res in zip(paths, map_ordered(finish_task, tasks, workers)):
        totals.add_finished(res, p.out.name, with_ids=not rewritten)
        progress.advance(1)
    progress.finish()


def write_rejected(parts: list[Path], shard_samples: list[dict], dest: Path) -> dict:
    """`dest`: the shards' rejected side files in order, the batch's first SAMPLES_PER_REASON entries of each
    reason written with their record's text (the others stay short: the file grows with the drops, not with their
    texts); returns those entries by reason. Only the shards that hold a chosen entry are read line by line."""
    chosen = ReasonSamples().merge(
        {reason: [(k, *item) for item in items] for reason, items in samples.items()}
        for k, samples in enumerate(shard_samples)
    )
    texts: dict[int, dict[int, dict]] = {}  # shard -> line index -> entry
    for items in chosen.by_reason.values():
        for k, line, entry in items:
            texts.setdefault(k, {})[line] = entry
    with JsonlWriter(dest) as out:
        for k, part in enumerate(parts):
            with open(part, "rb") as f:
                if k not in texts:
                    shutil.copyfileobj(f, out.buffer)
                    continue
                for line_no, line in enumerate(f):
                    entry = texts[k].get(line_no)
                    out.buffer.write(line if entry is None else (dumps(entry) + "\n").encode("utf-8"))
    return {reason: [entry for *_, entry in items] for reason, items in chosen.as_dict().items()}


def _boilerplate_stats(s: CleanSettings, merged: LineTable | None, totals: Totals) -> dict:
    top = sorted(totals.stripped.values(), key=lambda e: (-e[0], e[1]))[:TOP_LINES]
    return {
        "enabled": s.boilerplate,
        "candidates": merged.candidates if merged is not None else 0,
        "strippable_candidates": len(merged) if merged is not None else 0,
        "lines_stripped": sum(e[0] for e in totals.stripped.values()),
        "distinct_lines_stripped": len(totals.stripped),
        "docs_touched": sum(v for k, v in totals.strip_hist.items() if k),
        "docs_by_lines_stripped": {
            ("5+" if k == 5 else str(k)): totals.strip_hist[k] for k in sorted(totals.strip_hist)
        },
        "top_lines": [{"line": line, "count": n, **info} for n, line, info in top],
    }


def _languages(s: CleanSettings, totals: Totals) -> dict[str, dict[str, int]] | None:
    """Records and characters written per language, most records first (None when identification is off)."""
    if not s.language_id:
        return None
    order = sorted(totals.languages.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return {language: {"records": n, "chars": chars} for language, (n, chars) in order}


def drops_by_language(counts: Counter) -> dict:
    """language -> reason -> records rejected, languages by most drops."""
    table: dict[str, dict[str, int]] = {}
    for (language, reason), n in sorted(counts.items()):
        table.setdefault(language, {})[reason] = n
    return dict(sorted(table.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])))


@dataclass(frozen=True, kw_only=True)
class CleanResult(StageResult):
    """cleaned_jsonl of one batch: records in and out, dropped per rule (`dropped`, also per language), what the
    repairs, boilerplate, PII masking and decontamination did, lengths before and after, examples and timings."""

    rejected: int
    rejected_by_reason: dict[str, int]
    dropped_by_language: dict[str, dict[str, int]]
    rejected_samples: dict[str, list[dict]]
    quality_profile: dict  # the batch's profile and why (ProfileChoice.as_dict)
    c4_lines_removed: dict[str, int]
    mojibake_repaired: int
    surrogates_removed: int
    control_chars_removed: int
    docs_meta_extracted: int
    meta_lines_extracted: int
    docs_pii_masked: int
    pii: dict[str, int] = flattened("pii_")  # addresses masked per kind
    chars_in: int
    chars_out: int
    boilerplate: dict
    flagged_contamination: int
    decontamination: dict  # mode and, per evaluation file, its items, n-grams and hits
    # the quality-model step (model_scores.run_model_step): model, rule, cutoffs, kept share, histogram, means
    # per language and source, extremes; None without quality_model
    quality_model: dict | None = None
    languages: dict[str, dict[str, int]] | None = None  # records and chars per meta.language
    length_buckets: list[str]
    length_hist_before: list[int]
    length_hist_after: list[int]
    examples: list[dict]
    shards: int
    settings: dict
    pass_seconds: dict[str, float] = run_fact()
    workers: int = run_fact()
    rule_seconds: dict[str, float] = run_fact()
    rule_time_share: dict[str, float] = run_fact()


def _result(
    s: CleanSettings,
    merged: LineTable | None,
    totals: Totals,
    shards: int,
    workers: int | None,
    t0: float,
    contamination: ContaminationIndex | None,
    profile: ProfileChoice,
    model_report: dict | None,
) -> CleanResult:
    work = sum(totals.seconds.values()) or 1.0
    reasons, counts = totals.reasons, totals.counts
    return CleanResult(
        docs_in=totals.docs_in,
        docs_out=totals.docs_out,
        dropped=dropped_counts(reasons, also=(QUALITY_SCORE_REASON,) if model_report is not None else ()),
        rejected=sum(reasons.values()),
        rejected_by_reason=dict(sorted(reasons.items())),
        dropped_by_language=drops_by_language(totals.drops_by_language),
        rejected_samples=totals.rejected_samples,
        quality_profile=profile.as_dict(),
        c4_lines_removed=c4_lines_removed(counts),
        mojibake_repaired=counts.get("mojibake_repaired", 0),
        surrogates_removed=counts.get("surrogates_removed", 0),
        control_chars_removed=counts.get("control_chars_removed", 0),
        docs_meta_extracted=counts.get("docs_meta_extracted", 0),
        meta_lines_extracted=counts.get("meta_lines_extracted", 0),
        docs_pii_masked=counts.get("docs_pii_masked", 0),
        pii={kind: counts.get(f"pii_{kind}", 0) for kind in PII_KINDS},
        chars_in=totals.chars_in,
        chars_out=totals.chars_out,
        boilerplate=_boilerplate_stats(s, merged, totals),
        flagged_contamination=counts.get("flagged_contamination", 0),
        decontamination={
            "mode": s.decontaminate_mode,
            "files": contamination.report(counts) if contamination is not None else [],
        },
        quality_model=model_report,
        languages=_languages(s, totals),
        length_buckets=bucket_labels(),
        length_hist_before=totals.hist_in.tolist(),
        length_hist_after=totals.hist_out.tolist(),
        examples=pick_examples(totals.examples, s.examples),
        shards=shards,
        settings=s.model_dump(),
        pass_seconds=totals.pass_seconds,
        workers=default_workers() if workers is None else workers,
        rule_seconds={k: round(v, 4) for k, v in totals.seconds.items()},
        rule_time_share={k: round(v / work, 4) for k, v in totals.seconds.items()},
        seconds=round(time.perf_counter() - t0, 3),
    )


def clean_corpus(
    in_dir: Path,
    out_dir: Path,
    settings: CleanSettings | None = None,
    workers: int | None = None,
    log=None,
    cache_dir: Path | None = None,
) -> CleanResult:
    """Cleans every `in_dir/part-*.jsonl` into `out_dir` (same shard names) with `_rejected.jsonl` and
    its result (`write_result`); returns it. See the package docstring for the rules and their order. The evaluation
    sets' decontamination indexes are cached in `cache_dir` (default: `_decontam_cache` beside `out_dir`, i.e.
    in the stage folder for a batch's output)."""
    t0 = time.perf_counter()
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    if not in_dir.is_dir():
        raise StaleUpstreamError(
            f"cleaned_jsonl: input folder does not exist: {in_dir} (materialize raw_records first)"
        )
    # the plain class, also for the asset's config: workers never import the asset module (dagster)
    s = CleanSettings(**settings.model_dump()) if settings is not None else CleanSettings()
    contamination = prepare_indexes(s, Path(cache_dir or out_dir.parent / DECONTAM_CACHE), log)
    model = ModelStep.of(s) if s.quality_model else None
    model_report = None
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [ShardPaths.of(p, out_dir) for p in record_shards(in_dir)]
    profile = choose_profile([p.shard for p in paths], s.quality)
    run = s.model_copy(update={"quality": profile.profile})  # the passes see the batch's profile, never 'auto'
    totals = Totals(ids=DistinctValues(out_dir))  # spilled, past a few million ids, into the output folder
    pooled = sum(p.shard.stat().st_size for p in paths) >= POOL_MIN_BYTES
    task_workers = (default_workers() if workers is None else workers) if pooled else 1
    try:
        shards = run_pass1(paths, run, totals, task_workers, log, contamination)
        t_merge = time.perf_counter()
        totals.pass_seconds["pass1"] = round(t_merge - t0, 3)
        merged = find_boilerplate(shards, s, totals, task_workers)
        t_pass2 = time.perf_counter()
        totals.pass_seconds["merge"] = round(t_pass2 - t_merge, 3)
        run_pass2(paths, out_dir, run, merged, totals, task_workers, log, rewritten=model is not None)
        totals.pass_seconds["pass2"] = round(time.perf_counter() - t_pass2, 3)
        if model is not None:
            model_report = run_model_step(model, paths, run, totals, task_workers, log, out_dir.parent)
        rejected = [p.rejected for p in paths]
        totals.rejected_samples = write_rejected(rejected, totals.samples, out_dir / REJECTED_FILE)
    finally:
        for p in paths:
            p.stage.unlink(missing_ok=True)
            p.lines.unlink(missing_ok=True)
            p.rejected.unlink(missing_ok=True)
    result = _result(s, merged, totals, len(paths), workers, t0, contamination, profile, model_report)
    # in = out + dropped: every rejected record counted under its reason (a bug, never expected: say so loudly)
    if result.docs_in != result.docs_out + result.dropped_total:
        raise RuntimeError(
            f"cleaned_jsonl: {result.docs_in} in != {result.docs_out} out + {result.dropped_total} dropped"
        )
    write_result(out_dir, result)
    write_shard_figures(out_dir, totals)
    return result


def write_shard_figures(out_dir: Path, totals: Totals) -> None:
    """SHARDS_FILE: each shard's size, CRC-32 and records, and `unique_ids`: every record line starts with its id
    and no two ids are equal (false: the check parses every record and names the problems)."""
    unique = totals.ids is not None and totals.ids.all_distinct()
    atomic_write_json(out_dir / SHARDS_FILE, {"shards": totals.shards, "unique_ids": unique})
