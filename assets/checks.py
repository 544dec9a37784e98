"""Asset checks, evaluated by each asset on its *staged* output, before it is published.

A blocking check that fails records its evaluation (with the problems) and fails the step, so the previous good
output stays published and nothing downstream runs on the bad one. The same functions audit any existing folder.
"""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from tokenmill.common.io import read_json
from tokenmill.common.results import read_result
from tokenmill.errors import CheckFailedError
from tokenmill.stages.dedup.checks import validate_exact_keys
from tokenmill.stages.raw import RawResult, RawSettings
from tokenmill.stages.telemetry import Funnel
from tokenmill.stages.tokenize.checks import validate_token_shards
from tokenmill.validate import MAX_PROBLEMS, validate_records


def _problems_md(problems: list[str]) -> dg.MetadataValue:
    shown = "\n".join(f"- {p}" for p in problems[:MAX_PROBLEMS])
    more = f"\n- ... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
    return dg.MetadataValue.md(shown + more or "none")


RAW_RECORDS_NOT_EMPTY = dg.AssetCheckSpec(
    "raw_records_not_empty",
    asset="raw_records",
    blocking=True,
    description="At least one record, and the rejected share of the records read within "
    "raw_records.max_rejected_share (refused files, never opened, are not in it).",
)
CLEANED_RECORDS_VALID = dg.AssetCheckSpec(
    "cleaned_records_valid",
    asset="cleaned_jsonl",
    blocking=True,
    description="At least one record survived cleaning, and every line is a valid record with a unique id.",
)
DEDUPED_NO_EXACT_DUPLICATES = dg.AssetCheckSpec(
    "deduped_no_exact_duplicates",
    asset="deduped_jsonl",
    blocking=True,
    description="No two surviving records share an exact dedup key (the report's key settings).",
)
DEDUP_REPORT_QUALITY = dg.AssetCheckSpec(
    "dedup_report_quality",
    asset="dedup_report",
    blocking=False,  # a warning; with dedup_report's quality_blocking the step refuses to publish instead
    description="Near-duplicate recall estimated on the batch's own records (pairs sampled from the oversized LSH "
    "buckets, compared exactly; a Wilson interval): its lower bound at least 0.95. Warns below; fails the step "
    "with dedup_report's quality_blocking.",
)
TOKEN_SHARDS_CONSISTENT = dg.AssetCheckSpec(
    "token_shards_consistent",
    asset="tokenized_bins",
    blocking=True,
    description="dataset.json consistent with every shard file (sizes, SHA-256, offsets), token ids < vocabulary, "
    "masks aligned, the upstream tokenizer recorded, and a sample of records re-encoded with it equal to "
    "the shards.",
)
FUNNEL_CONSERVED = dg.AssetCheckSpec(
    "funnel_conserved",
    asset="funnel_telemetry",
    blocking=True,
    description="Every stage: records in = records out + dropped, and stages link up (in total and per batch).",
)


def publish_only_if_passed(check: dg.AssetCheckResult) -> Iterator[dg.AssetCheckResult]:
    """In an asset body, inside `staged_output`: a failed check is recorded, then the step fails before the
    staged folder is published (`yield from publish_only_if_passed(check)`)."""
    if not check.passed:
        yield check
        refuse_unless_passed(check)


def refuse_unless_passed(check: dg.AssetCheckResult) -> None:
    """Raises CheckFailedError (the step fails, the staged output is not published) when the check failed."""
    if not check.passed:
        raise CheckFailedError(
            f"check {check.check_name} failed on the staged output, which was not published "
            f"(the previous output stays): { ({k: getattr(v, 'value', v) for k, v in check.metadata.items()}) }"
        )


def raw_records_not_empty(
    folder: Path, max_rejected_share: float = RawSettings.model_fields["max_rejected_share"].default
) -> dg.AssetCheckResult:
    result = read_result(folder, RawResult)
    # the share of the records read: a refused file (a FIFO, a broken symlink) is reported, but no bad input line
    read = result.docs_in - result.refused_files
    share = (read - result.docs_out) / read if read else 1.0
    return dg.AssetCheckResult(
        check_name=RAW_RECORDS_NOT_EMPTY.name,
        passed=result.docs_out > 0 and share <= max_rejected_share,
        metadata={
            "records": result.docs_out,
            "rejected_share": round(share, 4),
            "bound": max_rejected_share,
            "refused_files": result.refused_files,
        },
    )


def cleaned_records_valid(folder: Path) -> dg.AssetCheckResult:
    result = validate_records(folder)
    return dg.AssetCheckResult(
        check_name=CLEANED_RECORDS_VALID.name,
        passed=result["records"] > 0 and not result["problems"],
        metadata={
            "records": result["records"],
            "invalid": len(result["problems"]),
            "problems": _problems_md(result["problems"]),
            "audit": result["audit"],
        },
    )


def deduped_no_exact_duplicates(folder: Path, report_dir: Path) -> dg.AssetCheckResult:
    """A batch of deduped_jsonl against its dedup_report; the batch's dedup_index segment (its sibling in the data
    root) holds the kept records' key digests."""
    report_dir = Path(report_dir)
    settings = read_json(report_dir / "report.json")["parameters"]["settings"]
    result = validate_exact_keys(folder, settings, report_dir.parent.parent / "dedup_index" / report_dir.name)
    problems = result["problems"]
    return dg.AssetCheckResult(
        check_name=DEDUPED_NO_EXACT_DUPLICATES.name,
        passed=not problems,
        metadata={
            "records": result["records"],
            "duplicate_keys": len(problems),
            "problems": _problems_md(problems),
            "audit": result["audit"],
        },
    )


def dedup_report_quality(report: dict, blocking: bool) -> dg.AssetCheckResult:
    """A batch's report.json `quality` (tokenmill.stages.dedup.quality): passes while the recall's lower bound is at
    least its floor; a failure is a warning unless `blocking`."""
    q = report.get("quality") or {}
    low, floor = float(q.get("recall_low", 0.0)), float(q.get("recall_floor", 0.95))
    return dg.AssetCheckResult(
        asset_key=DEDUP_REPORT_QUALITY.asset_key,
        check_name=DEDUP_REPORT_QUALITY.name,
        passed=low >= floor,
        severity=dg.AssetCheckSeverity.ERROR if blocking else dg.AssetCheckSeverity.WARN,
        metadata={
            "recall_estimate": float(q.get("recall", 1.0)),
            "recall_low": low,
            "recall_high": float(q.get("recall_high", 1.0)),
            "floor": floor,
            "direct_precision": float(q.get("direct_precision", 1.0)),
            "sampled_pairs": int(q.get("sampled_pairs", 0)),
            "sampled_missed": int(q.get("sampled_missed", 0)),
        },
    )


def token_shards_consistent(
    folder: Path, deduped_dir: Path | list[Path], tokenizer_dir: Path, version: int | None = None
) -> dg.AssetCheckResult:
    """tokenized_bins' latest version, or `version` (a complete one about to be published); the records re-encoded
    come from `deduped_dir`: the deduped folder, or batch folders of it."""
    result = validate_token_shards(folder, deduped_dir, tokenizer_dir, version=version)
    return dg.AssetCheckResult(
        check_name=TOKEN_SHARDS_CONSISTENT.name,
        passed=not result["problems"],
        metadata={
            "tokens_checked": result["tokens"],
            "max_token_id": result["max_token_id"],
            "vocab_size": result["vocab_size"] or 0,
            "records_reencoded": result["reencoded_records"],
            "problems": _problems_md(result["problems"]),
        },
    )


def funnel_conserved(funnel: Funnel) -> dg.AssetCheckResult:
    broken = [s.stage for s in funnel.stages if not s.conserved_and_linked]
    broken += [f"{s.stage} of batch {b.batch}" for b in funnel.batches for s in b.stages if not s.conserved_and_linked]
    return dg.AssetCheckResult(
        check_name=FUNNEL_CONSERVED.name,
        passed=not broken,
        metadata={"stages_checked": len(funnel.stages), "broken_stages": ", ".join(broken) or "none"},
    )
