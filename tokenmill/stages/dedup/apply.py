"""Step 8: apply the decisions: survivors to `part-*.jsonl` (same shard names as the input, lines copied byte for
byte), every removed record to `removed.jsonl` with the id it duplicates, the level and the measured similarity
(the batch's first SAMPLES_PER_REASON of each level with their text, as the other stages' rejected files),
`_stats.json`, and the shards' figures (SHARDS_FILE: size, CRC-32 and records of each, and a CRC-32 of the kept ids,
which deduped_no_exact_duplicates reads instead of re-parsing the shards). One task per input chunk, reading only
that chunk's decisions. Records in = kept + removed."""

from __future__ import annotations

import dataclasses
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import (
    REMOVED_FILE,
    SHARDS_FILE,
    JsonlWriter,
    atomic_write_json,
    concat_files,
    line_ids,
    read_json,
    record_shards,
    shard_figures,
)
from tokenmill.common.parallel import default_workers, map_ordered
from tokenmill.common.progress import Progress
from tokenmill.common.results import StageResult, write_result
from tokenmill.common.samples import SAMPLES_PER_REASON, with_text
from tokenmill.errors import StaleUpstreamError
from tokenmill.stages.dedup.layout import DECISION_DIR, LEVEL_NAMES, REPORT_FILE, Chunk, chunk_lines, parse


@dataclass(frozen=True, kw_only=True)
class ApplyTask:
    chunk: Chunk
    decisions: Path  # decisions/<stem>.npz (absent: nothing removed from the chunk)
    tmp_dir: Path
    texts: tuple[int, int] = (0, 0)  # removed records of each level (exact, near) whose entry keeps its text


@dataclass(frozen=True, kw_only=True)
class ApplyResult:
    kept: int
    removed: int
    levels: tuple[int, int]  # removed as exact, as near
    kept_path: str
    removed_path: str
    kept_ids: np.ndarray | None  # io.line_ids of the kept lines (None: a line does not start with its id)


def apply_chunk(task: ApplyTask) -> ApplyResult:
    chunk = task.chunk
    removed = _read_decisions(task.decisions)
    kept_path, removed_path = task.tmp_dir / f"{chunk.stem}.kept", task.tmp_dir / f"{chunk.stem}.removed"
    kept, dropped = [], 0
    levels = [0, 0]
    texts = list(task.texts)
    with open(kept_path, "wb") as fk, JsonlWriter(removed_path) as fr:
        for ordinal, line in chunk_lines(chunk):
            hit = removed.get(ordinal)
            if hit is None:
                kept.append(line.rstrip(b"\r"))
                continue
            rec = parse(chunk, ordinal, line)
            entry, lv = _removed_entry(chunk, ordinal, rec, hit), hit[2]
            if texts[lv] > 0 and isinstance(rec.get("text"), str):
                texts[lv] -= 1
                entry = with_text(entry, rec["text"])
            fr.write(entry)
            dropped += 1
            levels[lv] += 1
        if kept:
            fk.write(b"\n".join(kept) + b"\n")
    if dropped != len(removed):
        raise StaleUpstreamError(
            f"{chunk.path}: the dedup report removes {len(removed)} records of chunk "
            f"{chunk.chunk}, {dropped} were found: rematerialize dedup_report"
        )
    return ApplyResult(
        kept=len(kept),
        removed=dropped,
        levels=(levels[0], levels[1]),
        kept_path=str(kept_path),
        removed_path=str(removed_path),
        kept_ids=line_ids(kept),
    )


def _read_decisions(path: Path) -> dict[int, tuple[str, str, int, float]]:
    """{ordinal: (id, kept id, level, similarity)} of a chunk's removed records (none without a decisions file)."""
    if not path.exists():
        return {}
    dec = np.load(path)
    return {
        o: (i.decode("utf-8"), k.decode("utf-8"), lv, float(s))
        for o, i, k, lv, s in zip(
            dec["ordinal"].tolist(),
            dec["id"].tolist(),
            dec["kept_id"].tolist(),
            dec["level"].tolist(),
            dec["similarity"].tolist(),
        )
    }


def _removed_entry(chunk: Chunk, ordinal: int, rec: dict, decision: tuple[str, str, int, float]) -> dict:
    """removed.jsonl's entry of a removed record, once its id is checked against the decision."""
    rid, kept_id, lv, sim = decision
    if str(rec.get("id")) != rid:
        raise StaleUpstreamError(
            f"{chunk.path}: record {ordinal + 1} of chunk {chunk.chunk} has id "
            f"{rec.get('id')!r}, the dedup report expected {rid!r}: cleaned_jsonl "
            "changed since dedup_report was built; rematerialize dedup_report"
        )
    return {
        "id": rid,
        "duplicate_of": kept_id,
        "level": LEVEL_NAMES[lv],
        "similarity": round(sim, 4),
        "reason": f"{LEVEL_NAMES[lv]}_duplicate",
        "source": rec.get("source"),
    }


@dataclass(frozen=True, kw_only=True)
class DedupApplyResult(StageResult):
    """deduped_jsonl of one batch: the records kept and those removed as exact or near duplicates (`dropped`)."""

    shards: int
    removed_samples: list[dict]  # a few clusters of the report: removed texts next to the kept one


def write_deduped(
    in_dir: Path, report_dir: Path, out_dir: Path, workers: int | None = None, log=None
) -> DedupApplyResult:
    """Writes the survivors of `in_dir` to `out_dir` (same shard names) and removed.jsonl, per the report."""
    t_start = time.perf_counter()
    in_dir, report_dir, out_dir = Path(in_dir), Path(report_dir), Path(out_dir)
    workers = default_workers() if workers is None else workers
    report = read_json(report_dir / REPORT_FILE)
    shards, chunks = _report_chunks(in_dir, report)
    tmp_dir = out_dir / ".chunks"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    decisions = [report_dir / DECISION_DIR / f"{c.stem}.npz" for c in chunks]
    tasks = [
        ApplyTask(chunk=c, decisions=d, tmp_dir=tmp_dir, texts=texts)
        for c, d, texts in zip(chunks, decisions, text_quotas(decisions))
    ]
    progress = Progress("dedup: writing survivors", unit="records", log=log)
    results = []
    ids_crc32: int | None = 0  # CRC-32 of the kept ids (uint64, in output order); None: a line without its id
    for r in map_ordered(apply_chunk, tasks, workers):
        ids_crc32 = None if ids_crc32 is None or r.kept_ids is None else zlib.crc32(r.kept_ids.tobytes(), ids_crc32)
        results.append(dataclasses.replace(r, kept_ids=None))  # the batch's ids are never held together
        progress.advance(r.kept + r.removed)
    progress.finish()
    figures = _concat_shards(out_dir, shards, chunks, results)
    tmp_dir.rmdir()
    kept, dropped = sum(r.kept for r in results), sum(r.removed for r in results)
    if dropped != report["counts"]["records_removed"]:
        raise StaleUpstreamError(
            f"removed {dropped} records but the report lists "
            f"{report['counts']['records_removed']}: rematerialize dedup_report"
        )
    result = DedupApplyResult(
        docs_in=kept + dropped,
        docs_out=kept,
        dropped={
            "exact_duplicate": sum(r.levels[0] for r in results),
            "near_duplicate": sum(r.levels[1] for r in results),
        },
        shards=len(shards),
        removed_samples=report["samples"],
        seconds=round(time.perf_counter() - t_start, 3),
    )
    write_result(out_dir, result)
    atomic_write_json(out_dir / SHARDS_FILE, {"shards": figures, "ids_crc32": ids_crc32})
    return result


def _report_chunks(in_dir: Path, report: dict) -> tuple[dict[str, Path], list[Chunk]]:
    """The input shards by name and the chunks the report decided on, once the shards are checked to be those the
    report read."""
    shards = {p.name: p for p in record_shards(in_dir)}
    expected = {s["name"]: s["bytes"] for s in report["input"]["shards"]}
    actual = {name: p.stat().st_size for name, p in shards.items()}
    if expected != actual:
        raise StaleUpstreamError(
            f"cleaned_jsonl shards {sorted(actual)} differ from those dedup_report read "
            f"({sorted(expected)}, or sizes changed): rematerialize dedup_report"
        )
    chunks = [
        Chunk(
            shard=0,
            name=c["name"],
            path=str(shards[c["name"]]),
            start=c["start"],
            end=c["end"],
            chunk=c["chunk"],
            records=c["records"],
        )
        for c in report["input"]["chunks"]
    ]
    return shards, chunks


def _concat_shards(out_dir: Path, shards: dict, chunks: list[Chunk], results: list[ApplyResult]) -> list[dict]:
    """Joins the chunks' survivors into their shards and the removed entries into removed.jsonl; returns the
    shards' figures."""
    by_shard: dict[str, list[ApplyResult]] = {name: [] for name in shards}
    for c, r in zip(chunks, results):
        by_shard[c.name].append(r)
    figures = []
    for name, parts in by_shard.items():  # an empty input shard stays an (empty) output shard
        size, crc = concat_files([r.kept_path for r in parts], out_dir / name)
        figures.append(shard_figures(name, size, sum(r.kept for r in parts), crc))
    concat_files([r.removed_path for r in results], out_dir / REMOVED_FILE)
    return figures


def text_quotas(decisions: list[Path]) -> list[tuple[int, int]]:
    """Per chunk, how many of its exact and near removals keep their text: the batch's first SAMPLES_PER_REASON of
    each level in input order, whatever the worker count (only the chunks' level arrays are read)."""
    left, quotas = [SAMPLES_PER_REASON, SAMPLES_PER_REASON], []
    for path in decisions:
        removed = np.bincount(np.load(path)["level"], minlength=2).tolist() if path.exists() else [0, 0]
        quotas.append((min(left[0], removed[0]), min(left[1], removed[1])))
        left = [left[0] - quotas[-1][0], left[1] - quotas[-1][1]]
    return quotas
