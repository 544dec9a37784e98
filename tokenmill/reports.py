"""A data root's funnel, drops and dedup clusters as pandas DataFrames, for notebooks.

Read from the stage folders alone (the `_stats.json`, `_rejected.jsonl`, `removed.jsonl` and `clusters.jsonl` each
batch folder holds), without Dagster::

    from tokenmill import reports
    reports.funnel("data")                      # per batch, stage and drop reason: records in, out, dropped
    reports.drops("data", stage="cleaned_jsonl", limit=1000)
    reports.dedup_clusters("data")              # kept id, removed ids and their sources

Files are read line by line; `drops(limit=...)` stops after that many rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs installed

from tokenmill.batches import read_registry
from tokenmill.common.io import REJECTED_FILE, REMOVED_FILE, STATS_FILE, batch_folders, iter_jsonl, record_id
from tokenmill.errors import StaleUpstreamError
from tokenmill.explain import DEDUP_CLUSTERS_FILE
from tokenmill.stages.telemetry import RECORD_STAGES, StageCounts, per_batch_funnel, stage_rows, stage_stats

DROP_FILES = {"raw_records": REJECTED_FILE, "cleaned_jsonl": REJECTED_FILE, "deduped_jsonl": REMOVED_FILE}
STAGE_ORDER = [key for key, _ in RECORD_STAGES]
FUNNEL_COLUMNS = [
    "batch",
    "stage",
    "stage_label",
    "records_in",
    "records_out",
    "records_dropped",
    "reason",
    "dropped",
    "conserved",
    "linked",
]
DROP_COLUMNS = [
    "stage",
    "batch",
    "id",
    "reason",
    "records",
    "detail",
    "source_path",
    "source_line",
    "source_index",
    "duplicate_of",
    "text",
    "text_chars",
    "evidence",
]
CLUSTER_COLUMNS = [
    "batch",
    "cluster",
    "level",
    "size",
    "reason",
    "kept_id",
    "kept_role",
    "kept_source_path",
    "kept_source_line",
    "removed_count",
    "removed_ids",
    "removed_sources",
    "removed_similarities",
    "component",
    "component_size",
]
# fields of a drop entry that have their own column; the rest is its evidence (a dict)
_DROP_FIELDS = {"id", "source", "path", "line", "index", "reason", "detail", "text", "snippet", "text_chars"}
_DROP_FIELDS |= {"duplicate_of", "count"}


def _folders(stage_dir: Path) -> list[tuple[str | None, Path]]:
    """(batch, folder) of a stage: its batch folders, or the stage folder itself (batch None) when not batched."""
    folders = batch_folders(stage_dir)
    if folders:
        return [(f.name, f) for f in folders]
    return [(None, stage_dir)] if (stage_dir / STATS_FILE).is_file() else []


def _stage_category(values: list[str]) -> pd.Categorical:
    return pd.Categorical(values, categories=STAGE_ORDER, ordered=True)


def funnel(data_root: str | os.PathLike) -> pd.DataFrame:
    """One row per source batch, stage (pipeline order) and drop reason: the stage's records_in, records_out and
    records_dropped (repeated on each of its reasons' rows), the reason's `dropped` count, and whether the stage
    conserved its records (in = out + dropped) and saw every record the previous one kept (`linked`). Reasons that
    dropped nothing are left out; a stage that dropped nothing has one row, reason <NA>. From the stages'
    `_stats.json` (tokenmill.stages.telemetry)."""
    data_root = Path(data_root)
    try:
        tokenized = stage_stats(data_root, "tokenized_bins")
    except StaleUpstreamError:
        tokenized = {}
    keys = read_registry(data_root).live_keys
    # (batch, its stage rows); a data root built as one folder per stage has one, batch None
    batches: list[tuple[str | None, tuple[StageCounts, ...]]] = [
        (b.batch, b.stages) for b in (per_batch_funnel(data_root, keys, tokenized) if keys else ())
    ]
    if not batches:
        present = [(key, label) for key, label in RECORD_STAGES if (data_root / key / STATS_FILE).is_file()]
        stages = stage_rows([(key, label, stage_stats(data_root, key)) for key, label in present])
        batches = [(None, stages)] if stages else []
    rows = []
    for batch, stages in batches:
        for s in stages:
            common = {
                "batch": batch,
                "stage": s.stage,
                "stage_label": s.label,
                "records_in": s.docs_in,
                "records_out": s.docs_out,
                "records_dropped": s.dropped_total,
            }
            flags = {"conserved": s.conserved, "linked": s.linked}
            reasons: list[tuple[str | None, int]] = [(r, n) for r, n in s.dropped.items() if n] or [(None, 0)]
            for reason, n in reasons:
                rows.append({**common, "reason": reason, "dropped": n, **flags})
    frame = pd.DataFrame(rows, columns=FUNNEL_COLUMNS)
    for col in ("records_in", "records_out", "records_dropped", "dropped"):
        frame[col] = frame[col].astype("int64")
    for col in ("conserved", "linked"):
        frame[col] = frame[col].astype("bool")
    frame["batch"] = frame["batch"].astype("string")
    frame["reason"] = frame["reason"].astype("string")
    frame["stage_label"] = frame["stage_label"].astype("string")
    frame["stage"] = _stage_category(frame["stage"].tolist())
    return frame


def _drop_row(stage: str, batch: str | None, entry: dict) -> dict:
    source: dict = entry["source"] if isinstance(entry.get("source"), dict) else entry  # raw_records: flat
    path, line, index = source.get("path"), source.get("line"), source.get("index")
    rid, records = entry.get("id"), entry.get("count", 1)
    if rid is None and path is not None and records == 1:  # raw_records' entries name the source: the id is theirs
        rid = record_id(path, line=line) if line is not None else record_id(path, index=index)
    text = entry.get("text", entry.get("snippet"))
    return {
        "stage": stage,
        "batch": batch,
        "id": rid,
        "reason": entry.get("reason"),
        "records": records,
        "detail": entry.get("detail"),
        "source_path": path,
        "source_line": line,
        "source_index": index,
        "duplicate_of": entry.get("duplicate_of"),
        "text": text,
        "text_chars": entry.get("text_chars", len(text) if isinstance(text, str) else None),
        "evidence": {k: v for k, v in entry.items() if k not in _DROP_FIELDS},
    }


def iter_drops(data_root: str | os.PathLike, stage: str | None = None) -> Iterator[dict]:
    """drops' rows one at a time, stage by stage (pipeline order), batch by batch, in file order."""
    if stage is not None and stage not in DROP_FILES:
        raise ValueError(f"stage {stage!r}: records are dropped by {', '.join(DROP_FILES)}")
    data_root = Path(data_root)
    for key, name in DROP_FILES.items():
        if stage is not None and key != stage:
            continue
        for batch, folder in _folders(data_root / key):
            if (folder / name).is_file():
                for entry in iter_jsonl(folder / name):
                    yield _drop_row(key, batch, entry)


def drops(data_root: str | os.PathLike, stage: str | None = None, limit: int | None = None) -> pd.DataFrame:
    """Every dropped record, one row each: stage (raw_records, cleaned_jsonl or deduped_jsonl; `stage` keeps one),
    batch, id (computed from the source for raw_records' entries), reason, records (1; for a run of raw_records'
    rejections past a file's quarantine budget, the run's count: its row has no id, its evidence the run's
    last_line and whether it is scattered), detail, source path and line (or index),
    duplicate_of (deduped_jsonl), the text as the entry holds it (raw_records' snippet; cleaned_jsonl's may be cut),
    text_chars and evidence (a dict of the entry's other fields: the rule's figures, dedup level and similarity).
    At most `limit` rows."""
    rows: list[dict] = []
    for row in iter_drops(data_root, stage):
        if limit is not None and len(rows) >= limit:
            break
        rows.append(row)
    frame = pd.DataFrame(rows, columns=DROP_COLUMNS)
    for col in ("batch", "id", "reason", "detail", "source_path", "duplicate_of", "text"):
        frame[col] = frame[col].astype("string")
    for col in ("records", "source_line", "source_index", "text_chars"):
        frame[col] = frame[col].astype("Int64")
    frame["stage"] = _stage_category(frame["stage"].tolist())
    return frame


def _source_text(source: dict | None) -> str | None:
    """PATH:N, how `tokenmill explain` names a record by its source."""
    if not source:
        return None
    n = source.get("line", source.get("index"))
    return f"{source.get('path')}:{n}" if n is not None else source.get("path")


def dedup_clusters(data_root: str | os.PathLike) -> pd.DataFrame:
    """One row per dedup cluster (dedup_report's clusters.jsonl of each batch): batch, cluster number, level, size,
    the keep rule's reason, the kept id with its role ("kept", or "indexed": kept by an earlier batch) and source,
    and lists of the removed members' ids, sources (PATH:N) and similarities to the kept record."""
    rows = []
    for batch, folder in _folders(Path(data_root) / "dedup_report"):
        if not (folder / DEDUP_CLUSTERS_FILE).is_file():
            continue
        for c in iter_jsonl(folder / DEDUP_CLUSTERS_FILE):
            members = c.get("members", [])
            kept: dict = next((m for m in members if m.get("id") == c.get("kept")), {})
            removed = [m for m in members if m.get("role") == "removed"]
            kept_source = kept.get("source") or {}
            rows.append(
                {
                    "batch": batch,
                    "cluster": c.get("cluster"),
                    "level": c.get("level"),
                    "size": c.get("size", len(members)),
                    "reason": c.get("reason"),
                    "kept_id": c.get("kept"),
                    "kept_role": kept.get("role"),
                    "kept_source_path": kept_source.get("path"),
                    "kept_source_line": kept_source.get("line", kept_source.get("index")),
                    "removed_count": len(removed),
                    "removed_ids": [m["id"] for m in removed],
                    "removed_sources": [_source_text(m.get("source")) for m in removed],
                    "removed_similarities": [m.get("similarity") for m in removed],
                    "component": c.get("component"),
                    "component_size": c.get("component_size"),
                }
            )
    frame = pd.DataFrame(rows, columns=CLUSTER_COLUMNS)
    for col in ("batch", "level", "reason", "kept_id", "kept_role", "kept_source_path"):
        frame[col] = frame[col].astype("string")
    for col in ("cluster", "size", "kept_source_line", "removed_count", "component", "component_size"):
        frame[col] = frame[col].astype("Int64")
    return frame
