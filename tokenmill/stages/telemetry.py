"""The whole-run funnel, built from the `_stats.json` each stage wrote (never by re-reading the data)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenmill.batches import read_registry
from tokenmill.common.io import STATS_FILE, TIMINGS_FILE, batch_folders, read_json
from tokenmill.errors import StaleUpstreamError
from tokenmill.stages.registry import record_stages

# code_version of funnel_telemetry (Dagster shows what an older one built as stale): the date of the last
# change to the output's bytes; bump it with such a change, not with a refactor that keeps them byte-identical.
VERSION = "2026-12-04"

# (asset key, funnel label) in pipeline order; each stage reports docs_in, docs_out, dropped_<reason>.
RECORD_STAGES = record_stages()


def stage_stats(data_root: Path, key: str) -> dict:
    """A stage's stats; for a stage partitioned by source batch, the sum over its batches (see `batch_stats`)."""
    batches = batch_stats(data_root, key)
    if batches:
        return summed(batches.values())
    path = Path(data_root) / key / STATS_FILE
    if not path.exists():
        raise StaleUpstreamError(f"{path}: stage '{key}' has not been materialized (no {STATS_FILE})")
    return read_json(path)


def batch_stats(data_root: Path, key: str) -> dict[str, dict]:
    """{batch key: stats} of a stage partitioned by source batch, in batch order ({} for other stages)."""
    return {folder.name: read_json(folder / STATS_FILE) for folder in batch_folders(Path(data_root) / key)}


def summed(stats: list[dict] | Iterable[dict]) -> dict:
    """The record counts (docs_in, docs_out, dropped_<reason>, tokens, pii_<kind> masked) of several batches added
    up."""
    total: dict[str, int] = {}
    for s in stats:
        for k, v in s.items():
            if (k in ("docs_in", "docs_out", "tokens") or k.startswith(("dropped_", "pii_"))) and isinstance(v, int):
                total[k] = total.get(k, 0) + v
    return total


def dropped_counts(stats: dict) -> dict[str, int]:
    return {
        k[len("dropped_") :]: int(v)
        for k, v in sorted(stats.items())
        if k.startswith("dropped_") and isinstance(v, (int, float))
    }


def folder_bytes(folder: Path) -> int:
    """Bytes of a stage's data files (its `_timings.json` varies from run to run, so the funnel would too)."""
    return sum(f.stat().st_size for f in Path(folder).resolve().rglob("*") if f.is_file() and f.name != TIMINGS_FILE)


def stage_rows(per_stage: list[tuple[str, str, dict]]) -> list[dict]:
    """One funnel row per (key, label, stats): counts, drops by reason, conservation and the link to the stage
    before (a stage must account for every record it saw, and see every record the previous one kept)."""
    rows, previous_out = [], None
    for key, label, s in per_stage:
        dropped = dropped_counts(s)
        docs_in, docs_out = int(s["docs_in"]), int(s["docs_out"])
        rows.append(
            {
                "stage": key,
                "label": label,
                "docs_in": docs_in,
                "docs_out": docs_out,
                "dropped": dropped,
                "dropped_total": sum(dropped.values()),
                "conserved": docs_in == docs_out + sum(dropped.values()),
                "linked": previous_out is None or docs_in == previous_out,
            }
        )
        previous_out = docs_out
    return rows


def per_batch_funnel(data_root: Path, keys: list[str], tokenized: dict) -> list[dict]:
    """The funnel of each source batch: its stage rows (tokenized_bins' from the per-batch counts it records)."""
    per_stage = {key: batch_stats(data_root, key) for key, _ in RECORD_STAGES}
    per_stage["tokenized_bins"] = tokenized.get("batches", {})
    out = []
    for batch in keys:
        rows = [(key, label, per_stage[key][batch]) for key, label in RECORD_STAGES if batch in per_stage[key]]
        out.append(
            {
                "batch": batch,
                "stages": stage_rows(rows),
                "tokens": int(per_stage["tokenized_bins"].get(batch, {}).get("tokens", 0)),
            }
        )
    return out


def build_funnel(data_root: Path) -> dict:
    """Stage counts, drops per reason, token figures and conservation (in = out + dropped) per stage, in total and
    per source batch, with the source the data root was built from."""
    data_root = Path(data_root)
    stages = stage_rows([(key, label, stage_stats(data_root, key)) for key, label in RECORD_STAGES])
    tok = stage_stats(data_root, "tokenized_bins")
    registry = read_registry(data_root)
    batches = per_batch_funnel(data_root, registry.live_keys, tok)  # a retired batch is in no stage
    cleaned = stage_stats(data_root, "cleaned_jsonl")
    tokens = int(tok.get("tokens", 0))
    supervised = int(tok.get("supervised_tokens", tokens))
    masked = int(tok.get("masked_tokens", tokens - supervised))
    return {
        "source": registry.source,
        "generation": registry.generation,
        "stages": stages,
        "batches": batches,
        "pii_masked": {k.removeprefix("pii_"): v for k, v in sorted(cleaned.items()) if k.startswith("pii_")},
        "records_with_metadata": tok.get("records_with_metadata"),
        "metadata_dropout": tok.get("metadata_dropout"),
        "tokens": {
            "total": tokens,
            "supervised": supervised,
            "masked": masked,
            "supervised_share": supervised / tokens if tokens else 0.0,
            "masked_share": masked / tokens if tokens else 0.0,
            "isolated_punctuation_share": tok.get("isolated_punctuation_share"),
        },
        "split": {name: tok.get(name, {}) for name in ("train", "val")},
        "languages": language_rows(data_root, tok),
        "dropped_by_language": dropped_by_language(data_root),
        "bytes_on_disk": {key: folder_bytes(data_root / key) for key, _ in RECORD_STAGES if (data_root / key).exists()},
        "conserved": all(s["conserved"] and s["linked"] for s in stages)
        and all(s["conserved"] and s["linked"] for b in batches for s in b["stages"]),
    }


def language_rows(data_root: Path, tokenized: dict) -> list[dict]:
    """Per meta.language, most tokens first: records cleaning kept (summed over cleaned_jsonl's batches), records
    and tokens tokenized_bins encoded; [] when language identification was off ("und": no meta.language)."""
    cleaned = batch_stats(data_root, "cleaned_jsonl").values() or [stage_stats(data_root, "cleaned_jsonl")]
    kept: dict[str, int] = {}
    for stats in cleaned:
        for language, figures in stats.get("languages", {}).items():
            kept[language] = kept.get(language, 0) + figures["records"]
    encoded = tokenized.get("languages", {})
    if not kept and set(encoded) <= {"und"}:
        return []
    total = sum(e["tokens"] for e in encoded.values()) or 1
    rows = [
        {
            "language": language,
            "records_cleaned": kept.get(language, 0),
            "records_tokenized": encoded.get(language, {}).get("records", 0),
            "tokens": encoded.get(language, {}).get("tokens", 0),
            "token_share": round(encoded.get(language, {}).get("tokens", 0) / total, 4),
        }
        for language in set(kept) | set(encoded)
    ]
    return sorted(rows, key=lambda r: (-r["tokens"], -r["records_cleaned"], r["language"]))


def dropped_by_language(data_root: Path) -> dict[str, dict[str, int]]:
    """{language: {reason: records}} cleaning dropped, summed over cleaned_jsonl's batches (their stats'
    `dropped_by_language`); {} when the stats do not break drops down by language."""
    cleaned = batch_stats(data_root, "cleaned_jsonl").values() or [stage_stats(data_root, "cleaned_jsonl")]
    total: dict[str, dict[str, int]] = {}
    for stats in cleaned:
        for language, reasons in stats.get("dropped_by_language", {}).items():
            counts = total.setdefault(language, {})
            for reason, n in reasons.items():
                counts[reason] = counts.get(reason, 0) + int(n)
    return {language: dict(sorted(reasons.items())) for language, reasons in sorted(total.items())}


def history_row(funnel: dict) -> dict:
    """The per-stage counts of one funnel, keyed like the chart's labels (stored as run metadata)."""
    row = {"input": funnel["stages"][0]["docs_in"]}
    row.update({s["label"]: s["docs_out"] for s in funnel["stages"]})
    return row
