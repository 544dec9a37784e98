"""Ingest orchestration: tasks of whole files read into private shard folders, then renamed into one sequence."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import time
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from tokenmill.common.io import (
    REJECTED_FILE,
    JsonlWriter,
    concat_files,
    record_id,
    shard_name,
)
from tokenmill.common.parallel import map_ordered
from tokenmill.common.progress import Progress
from tokenmill.common.quarantine import FileQuarantine
from tokenmill.common.remote import RETRIES, Location, RemoteLocation, as_location
from tokenmill.common.results import StageResult, run_fact, write_result
from tokenmill.common.samples import ReasonSamples
from tokenmill.errors import SourceError
from tokenmill.stages.raw.discover import (
    Listing,
    SourceFile,
    list_source,
    plan_tasks,
    reader_kind,
    source_fingerprint,
    source_state,
)
from tokenmill.stages.raw.records import Mapped, map_record
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import TOO_DEEP, Bad, CorruptInput, FileTooLarge, Found, Rejected, Skipped, snip

REASONS = (
    "malformed_json",
    "no_text_field",
    "not_an_object",
    "undecodable_bytes",
    "unreadable_file",
    "malformed_csv_row",
    "bad_fields",
    "record_too_large",
    "file_too_large",
    "not_a_regular_file",
    "outside_source",
    "bad_file_name",
    "corrupt_warc_record",
    "bad_warc_header",
    "warc_length_mismatch",
    "extraction_empty",
    "extraction_failed",
)
# each format's reader, module `tokenmill.stages.raw.<name>`, imported when a file of that format is read: the web and
# Parquet readers load trafilatura, FastWARC and pyarrow (slow imports: docs/profile.md, 'A one-file update of the demo
# corpus'), which a run over JSONL never needs
READERS = {
    "jsonl": "read_jsonl",
    "json": "read_json",
    "txt": "read_txt",
    "csv": "read_csv",
    "parquet": "read_parquet",
    "warc": "read_warc",
    "html": "read_html",
}


def reader(kind: str) -> Callable[[str, str | None, RawSettings], Iterator[Found | Bad | Skipped]]:
    """The reader of files of format `kind` (a key of READERS)."""
    name = READERS[kind]
    return getattr(importlib.import_module(f"tokenmill.stages.raw.{name}"), name)


@dataclass(frozen=True, kw_only=True)
class IngestTask:
    files: list[SourceFile]
    folder: str
    """Private folder of the task: its shards and rejected.jsonl, renamed into place by the parent."""
    settings: RawSettings


@dataclass(kw_only=True)
class FileReport:
    path: str
    records: int = 0
    rejected: int = 0
    bytes: int = 0
    rejected_by_reason: dict = field(default_factory=dict)
    skipped_by_reason: dict = field(default_factory=dict)
    """WARC records that are not documents (request, metadata, non-HTML response, ...): not in docs_in."""
    pages_by_shape: dict = field(default_factory=dict)
    """HTML pages written, by the shape of their main text (prose, list, table, short)."""


@dataclass(kw_only=True)
class TaskResult:
    folder: str
    shards: list[int]
    """Records per shard written by the task, in order."""
    files: list[FileReport]
    samples: dict
    """reason -> the task's first rejected entries (each with its snippet of the bad input)."""
    retries: int = 0
    """Transient errors of remote reads retried (throttling, resets, 5xx), and the backoff waited for them."""
    retry_wait_s: float = 0.0


class _ShardSink:
    """Writes records of one task into numbered shards, rolling over every `per_shard` records."""

    def __init__(self, folder: Path, per_shard: int):
        self.folder, self.per_shard = folder, per_shard
        self.counts: list[int] = []
        self._w: JsonlWriter | None = None

    def write(self, rec: dict) -> None:
        if self._w is None or self._w.count >= self.per_shard:
            self.close()
            self._w = JsonlWriter(self.folder / shard_name(len(self.counts)))
        self._w.write(rec)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self.counts.append(self._w.count)
            self._w = None


class _FileIngest:
    """One source file of a task: its values become records in the sink, its bad input rejected entries."""

    def __init__(self, src: SourceFile, sink: _ShardSink, rejected, samples: ReasonSamples, settings: RawSettings):
        self.src, self.sink, self.samples, self.settings = src, sink, samples, settings
        self.quarantine = FileQuarantine(rejected, src.rel, src.size)
        self.report = FileReport(path=src.rel, bytes=src.size)
        self.reasons: Counter = Counter()
        self.skipped: Counter = Counter()
        self.shapes: Counter = Counter()

    def reject(self, bad: Bad) -> None:
        entry = {
            "path": self.src.rel,
            bad.key: bad.at,
            "reason": bad.reason,
            "detail": bad.detail,
            "snippet": bad.snippet,
        }
        if bad.offset is not None:
            entry["offset"] = bad.offset
        self.quarantine.reject(entry, bad.key, bad.at)
        self.samples.add(bad.reason, entry)
        self.reasons[bad.reason] += 1
        self.report.rejected += 1

    def mapped(self, kind: str, item: Found) -> Mapped | None:
        """The record fields of one value, or None when it is rejected."""
        if kind == "txt":  # the txt reader yields the text itself
            return Mapped(text=cast(str, item.value))
        if isinstance(item.value, Mapped):  # the web readers yield the record fields themselves
            return item.value
        if not isinstance(item.value, dict):
            self.reject(
                Bad(
                    key=item.key,
                    at=item.at,
                    reason="not_an_object",
                    detail=f"JSON value is {type(item.value).__name__}, not an object",
                    snippet=snip(json.dumps(item.value, ensure_ascii=False)),
                )
            )
            return None
        try:
            return map_record(item.value, self.settings)
        except Rejected as e:
            self.reject(
                Bad(
                    key=item.key,
                    at=item.at,
                    reason=e.reason,
                    detail=e.detail,
                    snippet=snip(json.dumps(item.value, ensure_ascii=False)),
                )
            )
            return None

    def write(self, item: Found, m: Mapped) -> None:
        rel = self.src.rel
        rec: dict[str, Any] = {
            "id": record_id(rel, **{item.key: item.at}),
            "text": m.text,
            "meta": m.meta,
            "source": {"path": rel, item.key: item.at},
        }
        if item.where:
            rec["source"].update(item.where)
        if m.special:
            rec.update(m.special)
        try:
            self.sink.write(rec)
        except UnicodeEncodeError as e:  # a JSON "\\ud800" escape: a lone surrogate is not text
            self.reject(
                Bad(
                    key=item.key,
                    at=item.at,
                    reason="undecodable_bytes",
                    detail=f"lone surrogate in the record: {e.reason}",
                    snippet=snip(json.dumps(item.value, ensure_ascii=False)),
                )
            )
            return
        except RecursionError:  # the readers refuse deep nesting; should any slip through, it is malformed input
            self.reject(Bad(key=item.key, at=item.at, reason="malformed_json", detail=TOO_DEEP, snippet=""))
            return
        self.quarantine.kept()
        self.report.records += 1
        if m.shape is not None:
            self.shapes[m.shape] += 1

    def run(self) -> FileReport:
        if self.src.refused is not None:
            self.reject(Bad(key="line", at=None, reason=self.src.refused, detail=self.src.detail, snippet=""))
        else:
            self._read()
        self.quarantine.close()
        self.report.rejected_by_reason = dict(sorted(self.reasons.items()))
        self.report.skipped_by_reason = dict(sorted(self.skipped.items()))
        self.report.pages_by_shape = dict(sorted(self.shapes.items()))
        return self.report

    def _read(self) -> None:
        kind, compression = reader_kind(self.src.rel)
        assert kind is not None, self.src.rel  # list_source lists only files of a known format
        items = reader(kind)(self.src.path, compression, self.settings)
        last: Found | Bad | Skipped | None = None
        while True:
            try:  # only reading fails a file: a failed write of ours (disk full) must stop the run
                item = next(items, None)
            except (OSError, EOFError, zlib.error, FileTooLarge) as e:  # unreadable, truncated, corrupt gzip, bomb
                at = last.at if last is not None and last.key == "line" else None
                reason = "file_too_large" if isinstance(e, FileTooLarge) else "unreadable_file"
                detail = str(e) if isinstance(e, (FileTooLarge, CorruptInput)) else f"{type(e).__name__}: {e}"
                self.reject(
                    Bad(key="line", at=at + 1 if at is not None else None, reason=reason, detail=detail, snippet="")
                )
                break
            if item is None:
                break
            last = item
            if isinstance(item, Bad):
                self.reject(item)
                continue
            if isinstance(item, Skipped):
                self.skipped[item.reason] += 1
                continue
            m = self.mapped(kind, item)
            if m is not None:
                self.write(item, m)


def ingest_task(task: IngestTask) -> TaskResult:
    """Reads the files of one task into its folder (shards + rejected.jsonl); returns per-file counts."""
    folder = Path(task.folder)
    folder.mkdir(parents=True, exist_ok=True)
    sink, samples = _ShardSink(folder, task.settings.records_per_shard), ReasonSamples()
    retried, waited = RETRIES.retried, RETRIES.waited_s  # this process's counter: what this task adds to it
    with open(folder / REJECTED_FILE, "w", encoding="utf-8") as rejected:
        reports = [_FileIngest(src, sink, rejected, samples, task.settings).run() for src in task.files]
    sink.close()
    return TaskResult(
        folder=str(folder),
        shards=sink.counts,
        files=reports,
        samples=samples.by_reason,
        retries=RETRIES.retried - retried,
        retry_wait_s=RETRIES.waited_s - waited,
    )


@dataclass(kw_only=True)
class _Collected:
    shards: int = 0
    reports: list[FileReport] = field(default_factory=list)
    samples: dict = field(default_factory=dict)
    retries: int = 0
    retry_wait_s: float = 0.0


def _collect(results, out_dir: Path, progress: Progress) -> _Collected:
    """Renames each task's shards into one global sequence, in task order; concatenates the rejected parts;
    returns the shard count, the per-file reports, the batch's first rejected entries per reason and the tasks'
    remote retries."""
    n_shard, rejected_parts, reports, samples = 0, [], [], ReasonSamples()
    collected = _Collected()
    for res in results:
        collected.retries += res.retries
        collected.retry_wait_s += res.retry_wait_s
        folder = Path(res.folder)
        for i, _ in enumerate(res.shards):
            os.replace(folder / shard_name(i), out_dir / shard_name(n_shard))
            n_shard += 1
        rejected_parts.append(folder / REJECTED_FILE)
        reports += res.files
        samples.merge([res.samples])
        progress.advance(len(res.files))
    concat_files(rejected_parts, out_dir / REJECTED_FILE)
    progress.finish()
    collected.shards, collected.reports, collected.samples = n_shard, reports, samples.as_dict()
    return collected


@dataclass(frozen=True, kw_only=True)
class RawResult(StageResult):
    """raw_records of one source batch: records read (docs_in) and kept, rejected per reason (`dropped`), with the
    first rejected inputs per reason, per-file figures and the source's fingerprint."""

    rejected: int
    rejected_by_reason: dict[str, int]
    # WARC records that are not documents: outside docs_in, so docs_in = docs_out + rejected still holds
    skipped_records: int
    skipped_records_by_reason: dict[str, int]
    pages_by_shape: dict[str, int]  # HTML pages written, by the shape of their main text (html_text.page_shape)
    rejected_samples: dict[str, list[dict]]
    files_read: int
    files: list[dict]  # a FileReport per file
    skipped_files: list[str]  # not read: unknown extension or a name that is not UTF-8
    bytes_read: int
    shards: int
    source: str
    source_fingerprint: str
    # files rejected whole, unopened (each one rejected record): not malformed input, the rejected-share bound
    # leaves them out
    refused_files: int
    settings: dict
    tasks: int = run_fact()
    # an object-storage source: transient errors (throttling, resets, 5xx) retried while listing and reading, and
    # the seconds their backoff waited
    remote_retries: int = run_fact(default=0)
    remote_retry_wait_s: float = run_fact(default=0.0)


def _result(
    collected: _Collected,
    listing: Listing,
    tasks: int,
    source: Location,
    fingerprint: str,
    settings: RawSettings,
    listing_retries: tuple[int, float],
    t0: float,
) -> RawResult:
    reports = collected.reports
    by_reason: Counter[str] = Counter()
    not_documents: Counter[str] = Counter()
    shapes: Counter[str] = Counter()
    for f in reports:
        by_reason.update(f.rejected_by_reason)
        not_documents.update(f.skipped_by_reason)
        shapes.update(f.pages_by_shape)
    docs_out = sum(f.records for f in reports)
    n_rejected = sum(by_reason.values())
    return RawResult(
        docs_in=docs_out + n_rejected,
        docs_out=docs_out,
        dropped={r: by_reason.get(r, 0) for r in sorted(set(REASONS) | set(by_reason))},
        rejected=n_rejected,
        rejected_by_reason=dict(sorted(by_reason.items())),
        skipped_records=sum(not_documents.values()),
        skipped_records_by_reason=dict(sorted(not_documents.items())),
        pages_by_shape=dict(sorted(shapes.items())),
        rejected_samples=collected.samples,
        files_read=len(reports),
        files=[asdict(f) for f in reports],
        skipped_files=listing.skipped,
        bytes_read=sum(f.bytes for f in reports),
        shards=collected.shards,
        source=str(source),
        source_fingerprint=fingerprint,
        refused_files=sum(f.refused is not None for f in listing.files),
        settings=settings.model_dump(),
        tasks=tasks,
        remote_retries=listing_retries[0] + collected.retries,
        remote_retry_wait_s=round(listing_retries[1] + collected.retry_wait_s, 3),
        seconds=round(time.perf_counter() - t0, 3),
    )


def ingest(
    source: Location | str,
    out_dir: Path,
    settings: RawSettings | None = None,
    workers: int | None = None,
    log=None,
    exclude: Path | None = None,
    only: Collection[str] | None = None,
    refused: Mapping[str, Sequence[str]] | None = None,
) -> RawResult:
    """Reads `source` (a file, or a folder searched recursively; an object, or every object under a prefix) into
    record shards in `out_dir`; with `only`,
    just those files (paths relative to the source: one source batch), ids as in a read of the whole source, and
    `refused` ({path: [reason, detail]}: the batch's files refused or unopenable when it was registered) rejected
    whole without being opened, but for symlinks out of the source when `follow_outside_symlinks` is set.

    Writes part-XXXXX.jsonl, _rejected.jsonl (every bad line/record/file with a reason) and the result
    (`write_result`); returns it. Raises SourceError before any work when `source` does not exist.
    """
    t0 = time.perf_counter()
    source, out_dir = as_location(source), Path(out_dir)
    retried, waited = RETRIES.retried, RETRIES.waited_s  # the listing's, in this process
    if not source.exists():
        raise SourceError(f"corpus source does not exist: {source} (set TOKENMILL_SOURCE to a file or folder)")
    # the plain class, also for the asset's config: workers never import the asset module (dagster)
    settings = RawSettings(**settings.model_dump()) if settings is not None else RawSettings()
    exclude = Path(exclude).resolve() if exclude and not isinstance(source, RemoteLocation) else None
    state = source_state(source, exclude)
    listing = list_source(source, exclude, settings.follow_outside_symlinks)
    if only is not None:
        refused = dict(refused or {})
        # registering never reads outside the source; with follow_outside_symlinks this run does
        followed = {rel for rel, why in refused.items() if why[0] == "outside_source"}
        followed = followed if settings.follow_outside_symlinks else set()
        only = set(only) | followed
        refused = {rel: why for rel, why in refused.items() if rel not in followed}
        if missing := sorted(only - {f.rel for f in listing.files}):
            raise SourceError(f"files of this source batch are gone from {source}: {', '.join(missing[:5])}")
        state = {rel: meta for rel, meta in state.items() if rel in only or rel in refused}
        unopened = [
            SourceFile(rel=rel, path=os.path.join(str(source), rel), size=0, refused=why[0], detail=why[1])
            for rel, why in refused.items()
        ]
        files = sorted([f for f in listing.files if f.rel in only] + unopened, key=lambda f: f.rel)
        listing = Listing(files, listing.skipped)
    fingerprint = source_fingerprint(state)
    if not listing.files:
        raise SourceError(
            f"corpus source has no .jsonl, .json, .txt or .csv file (or .gz, .zst of these), .parquet, .warc, .wet or "
            f".html file: {source} "
            f"({len(listing.skipped)} other files; set TOKENMILL_SOURCE to a file or folder of these)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    if listing.skipped and log is not None:  # info: a README beside the data is normal; metadata lists them
        log.info(
            f"raw_records: skipped {len(listing.skipped)} files (unknown extension or a file name that is "
            f"not UTF-8), e.g. {listing.skipped[:5]}"
        )
    tasks = [
        IngestTask(files=files, folder=str(out_dir / f".task-{i:05d}"), settings=settings)
        for i, files in enumerate(plan_tasks(listing.files, max(1, int(settings.task_mb * 1024 * 1024))))
    ]
    listing_retries = (RETRIES.retried - retried, RETRIES.waited_s - waited)
    progress = Progress("raw_records", total=len(listing.files), unit="files", log=log)
    try:
        collected = _collect(map_ordered(ingest_task, tasks, workers), out_dir, progress)
    finally:
        for t in tasks:
            shutil.rmtree(t.folder, ignore_errors=True)
    result = _result(collected, listing, len(tasks), source, fingerprint, settings, listing_retries, t0)
    write_result(out_dir, result)
    return result
