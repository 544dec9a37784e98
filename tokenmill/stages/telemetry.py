"""The whole-run funnel, built from the `_stats.json` each stage wrote (never by re-reading the data), as typed
counts: `Funnel` holds the run's `StageCounts` in total and per source batch (`BatchCounts`), and `to_json` /
`Funnel.from_json` are the one way it is written to and read from `funnel_telemetry/funnel.json`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill.batches import FUNNEL_FILE, read_registry
from tokenmill.common.io import STATS_FILE, TIMINGS_FILE, batch_folders, read_json
from tokenmill.errors import StaleUpstreamError
from tokenmill.stages.registry import record_stages

# code_version of funnel_telemetry (Dagster shows what an older one built as stale): the date of the last
# change to the output's bytes; bump it with such a change, not with a refactor that keeps them byte-identical.
VERSION = "2026-12-04"

# (asset key, funnel label) in pipeline order; each stage reports docs_in, docs_out, dropped_<reason>.
RECORD_STAGES = record_stages()
# cleaned_jsonl's quality-model step, a funnel row of its own, and the reason it drops by (model_scores.py)
QUALITY_STEP, QUALITY_STEP_REASON = "quality_model", "quality_score"


def _json_fields(kind: type, data: dict) -> dict[str, Any]:
    """The constructor arguments of dataclass `kind` that `data` (its JSON) holds: a derived field is computed
    again, an absent optional one keeps its default."""
    return {f.name: data[f.name] for f in dataclasses.fields(kind) if f.init and f.name in data}


@dataclass(frozen=True, kw_only=True)
class StageCounts:
    """One funnel row: a stage's records in, out and dropped per reason, in total or for one source batch."""

    stage: str
    """Asset key (RECORD_STAGES)."""
    label: str
    """What the chart and the UI call the records after this stage."""
    docs_in: int
    docs_out: int
    dropped: dict[str, int]
    """Records dropped per reason: each `dropped_<reason>` of the stage's stats, by reason (0s included)."""
    linked: bool
    """The stage saw every record the stage before kept (docs_in = its docs_out); True for the first stage."""
    dropped_total: int = field(init=False)
    conserved: bool = field(init=False)
    """The stage accounted for every record it saw: docs_in = docs_out + dropped_total."""

    def __post_init__(self) -> None:
        # derived, so that no row states a total its reasons do not add up to
        object.__setattr__(self, "dropped_total", sum(self.dropped.values()))
        object.__setattr__(self, "conserved", self.docs_in == self.docs_out + self.dropped_total)

    @property
    def conserved_and_linked(self) -> bool:
        return self.conserved and self.linked

    @classmethod
    def from_json(cls, data: dict) -> StageCounts:
        return cls(**_json_fields(cls, data))


@dataclass(frozen=True, kw_only=True)
class BatchCounts:
    """The funnel of one source batch."""

    batch: str
    stages: tuple[StageCounts, ...]
    """Its rows in pipeline order; a stage that has not run the batch has none."""
    tokens: int
    """Tokens tokenized_bins encoded from the batch."""

    @property
    def conserved(self) -> bool:
        return all(s.conserved_and_linked for s in self.stages)

    @classmethod
    def from_json(cls, data: dict) -> BatchCounts:
        return cls(**{**_json_fields(cls, data), "stages": tuple(StageCounts.from_json(s) for s in data["stages"])})


@dataclass(frozen=True, kw_only=True)
class TokenCounts:
    """The tokens tokenized_bins wrote: supervised ones are trained on, masked ones (label -100) are not."""

    total: int
    supervised: int
    masked: int
    isolated_punctuation_share: float | None = None
    """Share of the tokens that are a punctuation mark standing alone; None where not measured."""
    supervised_share: float = field(init=False)
    masked_share: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "supervised_share", self.supervised / self.total if self.total else 0.0)
        object.__setattr__(self, "masked_share", self.masked / self.total if self.total else 0.0)

    @classmethod
    def from_json(cls, data: dict) -> TokenCounts:
        return cls(**_json_fields(cls, data))


@dataclass(frozen=True, kw_only=True)
class LanguageCounts:
    """One meta.language: the records cleaning kept, the records and tokens tokenized_bins encoded."""

    language: str
    records_cleaned: int
    records_tokenized: int
    tokens: int
    token_share: float
    """Its share of all tokens, rounded to 4 places."""

    @classmethod
    def from_json(cls, data: dict) -> LanguageCounts:
        return cls(**_json_fields(cls, data))


@dataclass(frozen=True, kw_only=True)
class Funnel:
    """The whole run: stage rows in total and per source batch, drops per reason and per language, tokens, split
    and bytes, with the source and the generation the data root was built from."""

    source: str | None
    generation: int
    stages: tuple[StageCounts, ...]
    """Each record stage's stats, summed over its batches, in pipeline order."""
    batches: tuple[BatchCounts, ...]
    """The live batches in order (a retired batch is in no stage)."""
    tokens: TokenCounts
    split: dict[str, dict]
    """tokenized_bins' figures of the train and val splits as its stats hold them ({} where absent)."""
    records_with_metadata: int | None
    metadata_dropout: float | None
    bytes_on_disk: dict[str, int]
    """Each record stage's data files (see `folder_bytes`)."""
    pii_masked: dict[str, int] = field(default_factory=dict)
    """Values cleaning masked per PII kind (its stats' `pii_<kind>`)."""
    languages: tuple[LanguageCounts, ...] = ()
    """Most tokens first; () when language identification was off."""
    dropped_by_language: dict[str, dict[str, int]] = field(default_factory=dict)
    """{language: {reason: records}} cleaning dropped; {} when its stats do not break drops down by language."""
    conserved: bool = field(init=False)
    """Every row conserved and linked, in total and in each batch."""

    def __post_init__(self) -> None:
        conserved = all(s.conserved_and_linked for s in self.stages) and all(b.conserved for b in self.batches)
        object.__setattr__(self, "conserved", conserved)

    def to_json(self) -> dict:
        """What funnel.json holds (written with sorted keys: the field order does not show in the file)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Funnel:
        return cls(
            **{
                **_json_fields(cls, data),
                "stages": tuple(StageCounts.from_json(s) for s in data["stages"]),
                "batches": tuple(BatchCounts.from_json(b) for b in data["batches"]),
                "tokens": TokenCounts.from_json(data["tokens"]),
                "languages": tuple(LanguageCounts.from_json(r) for r in data.get("languages", ())),
            }
        )


def read_funnel(data_root: Path) -> Funnel:
    """The funnel funnel_telemetry last published (`funnel_telemetry/funnel.json`)."""
    return Funnel.from_json(read_json(Path(data_root) / FUNNEL_FILE))


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


def with_step_rows(per_stage: list[tuple[str, str, dict]]) -> list[tuple[str, str, dict]]:
    """cleaned_jsonl's quality-model step as a row of its own after the rules' (the stats count its drops under
    `dropped_quality_score`): the rules' row hands it the records they kept."""
    rows = []
    for key, label, s in per_stage:
        model_drops = s.get(f"dropped_{QUALITY_STEP_REASON}") if key == "cleaned_jsonl" else None
        if model_drops is None:
            rows.append((key, label, s))
            continue
        rules = {k: v for k, v in s.items() if k != f"dropped_{QUALITY_STEP_REASON}"}
        scored = int(s["docs_out"]) + int(model_drops)
        rows.append((key, "cleaned (rules)", {**rules, "docs_out": scored}))
        step = {"docs_in": scored, "docs_out": s["docs_out"], f"dropped_{QUALITY_STEP_REASON}": model_drops}
        rows.append((QUALITY_STEP, label, step))
    return rows


def stage_rows(per_stage: list[tuple[str, str, dict]]) -> tuple[StageCounts, ...]:
    """One funnel row per (key, label, stats), each linked to the stage before (a stage must see every record the
    previous one kept); a stage's step with a row of its own after it (with_step_rows)."""
    rows: list[StageCounts] = []
    for key, label, s in with_step_rows(per_stage):
        docs_in = int(s["docs_in"])
        linked = not rows or docs_in == rows[-1].docs_out
        rows.append(
            StageCounts(
                stage=key,
                label=label,
                docs_in=docs_in,
                docs_out=int(s["docs_out"]),
                dropped=dropped_counts(s),
                linked=linked,
            )
        )
    return tuple(rows)


def per_batch_funnel(data_root: Path, keys: list[str], tokenized: dict) -> tuple[BatchCounts, ...]:
    """The funnel of each source batch: its stage rows (tokenized_bins' from the per-batch counts it records)."""
    per_stage = {key: batch_stats(data_root, key) for key, _ in RECORD_STAGES}
    per_stage["tokenized_bins"] = tokenized.get("batches", {})
    return tuple(
        BatchCounts(
            batch=batch,
            stages=stage_rows(
                [(key, label, per_stage[key][batch]) for key, label in RECORD_STAGES if batch in per_stage[key]]
            ),
            tokens=int(per_stage["tokenized_bins"].get(batch, {}).get("tokens", 0)),
        )
        for batch in keys
    )


def build_funnel(data_root: Path) -> Funnel:
    """Stage counts, drops per reason, token figures and conservation (in = out + dropped) per stage, in total and
    per source batch, with the source the data root was built from."""
    data_root = Path(data_root)
    stages = stage_rows([(key, label, stage_stats(data_root, key)) for key, label in RECORD_STAGES])
    tok = stage_stats(data_root, "tokenized_bins")
    registry = read_registry(data_root)
    cleaned = stage_stats(data_root, "cleaned_jsonl")
    tokens = int(tok.get("tokens", 0))
    supervised = int(tok.get("supervised_tokens", tokens))
    return Funnel(
        source=registry.source,
        generation=registry.generation,
        stages=stages,
        batches=per_batch_funnel(data_root, registry.live_keys, tok),  # a retired batch is in no stage
        pii_masked={k.removeprefix("pii_"): v for k, v in sorted(cleaned.items()) if k.startswith("pii_")},
        records_with_metadata=tok.get("records_with_metadata"),
        metadata_dropout=tok.get("metadata_dropout"),
        tokens=TokenCounts(
            total=tokens,
            supervised=supervised,
            masked=int(tok.get("masked_tokens", tokens - supervised)),
            isolated_punctuation_share=tok.get("isolated_punctuation_share"),
        ),
        split={name: tok.get(name, {}) for name in ("train", "val")},
        languages=language_rows(data_root, tok),
        dropped_by_language=dropped_by_language(data_root),
        bytes_on_disk={key: folder_bytes(data_root / key) for key, _ in RECORD_STAGES if (data_root / key).exists()},
    )


def language_rows(data_root: Path, tokenized: dict) -> tuple[LanguageCounts, ...]:
    """Per meta.language, most tokens first: records cleaning kept (summed over cleaned_jsonl's batches), records
    and tokens tokenized_bins encoded; () when language identification was off ("und": no meta.language)."""
    cleaned = batch_stats(data_root, "cleaned_jsonl").values() or [stage_stats(data_root, "cleaned_jsonl")]
    kept: dict[str, int] = {}
    for stats in cleaned:
        for language, figures in stats.get("languages", {}).items():
            kept[language] = kept.get(language, 0) + figures["records"]
    encoded = tokenized.get("languages", {})
    if not kept and set(encoded) <= {"und"}:
        return ()
    total = sum(e["tokens"] for e in encoded.values()) or 1
    rows = [
        LanguageCounts(
            language=language,
            records_cleaned=kept.get(language, 0),
            records_tokenized=encoded.get(language, {}).get("records", 0),
            tokens=encoded.get(language, {}).get("tokens", 0),
            token_share=round(encoded.get(language, {}).get("tokens", 0) / total, 4),
        )
        for language in set(kept) | set(encoded)
    ]
    return tuple(sorted(rows, key=lambda r: (-r.tokens, -r.records_cleaned, r.language)))


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


def history_row(funnel: Funnel) -> dict:
    """The per-stage counts of one funnel, keyed like the chart's labels (stored as run metadata)."""
    row = {"input": funnel.stages[0].docs_in}
    row.update({s.label: s.docs_out for s in funnel.stages})
    return row
