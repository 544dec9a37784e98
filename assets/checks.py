"""Asset checks: each reports its figure; blocking ones stop a run before bad data flows downstream."""

import dagster as dg

from resources import DataRoot
from tokenmill.common.io import STATS_FILE, iter_jsonl, read_json, record_shards
from tokenmill.stages.dedup.keys import dedup_keys, key_digest
from tokenmill.stages.telemetry import build_funnel
from tokenmill.validate import MAX_PROBLEMS, validate_records, validate_token_shards

MAX_REJECTED_SHARE = 0.2  # above this the source or the reader settings are wrong, not the records


def _problems_md(problems: list[str]) -> dg.MetadataValue:
    shown = "\n".join(f"- {p}" for p in problems[:MAX_PROBLEMS])
    more = f"\n- ... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
    return dg.MetadataValue.md(shown + more or "none")


@dg.asset_check(asset="raw_records", blocking=True, description="At least one record, and rejected share under a bound.")
def raw_records_not_empty(data_root: DataRoot) -> dg.AssetCheckResult:
    stats = read_json(data_root.path("raw_records") / STATS_FILE)
    seen = stats["docs_in"]
    share = (seen - stats["docs_out"]) / seen if seen else 1.0
    return dg.AssetCheckResult(
        passed=stats["docs_out"] > 0 and share <= MAX_REJECTED_SHARE,
        metadata={"records": stats["docs_out"], "rejected_share": round(share, 4), "bound": MAX_REJECTED_SHARE},
    )


@dg.asset_check(asset="cleaned_jsonl", blocking=True,
                description="At least one record survived cleaning, and every line is a valid record with a unique id.")
def cleaned_records_valid(data_root: DataRoot) -> dg.AssetCheckResult:
    result = validate_records(data_root.path("cleaned_jsonl"))
    return dg.AssetCheckResult(
        passed=result["records"] > 0 and not result["problems"],
        metadata={"records": result["records"], "invalid": len(result["problems"]), "problems": _problems_md(result["problems"])},
    )


@dg.asset_check(asset="deduped_jsonl", blocking=True,
                description="No two surviving records share an exact dedup key (the report's key settings).")
def deduped_no_exact_duplicates(data_root: DataRoot) -> dg.AssetCheckResult:
    settings = read_json(data_root.path("dedup_report") / "report.json")["parameters"]["settings"]
    seen, problems, records = {}, [], 0
    for shard in record_shards(data_root.path("deduped_jsonl")):
        batch = list(iter_jsonl(shard))
        records += len(batch)
        keys = dedup_keys([r["text"] for r in batch], settings["strip_symbols"], settings["fold_chinese"])
        for record, key in zip(batch, keys):
            if not key:
                continue  # nothing to compare: the report counts empty keys
            digest = key_digest(key)
            if digest in seen:
                problems.append(f"{record['id']} duplicates {seen[digest]} ({shard.name})")
            else:
                seen[digest] = record["id"]
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"records": records, "duplicate_keys": len(problems), "problems": _problems_md(problems)},
    )


@dg.asset_check(asset="tokenized_bins", blocking=True,
                description="dataset.json consistent with every shard file (sizes, SHA-256, offsets), token ids < "
                            "vocabulary, masks aligned, the upstream tokenizer recorded, and a sample of records "
                            "re-encoded with it equal to the shards.")
def token_shards_consistent(data_root: DataRoot) -> dg.AssetCheckResult:
    result = validate_token_shards(data_root.path("tokenized_bins"), data_root.path("deduped_jsonl"),
                                   data_root.path("tokenizer"))
    return dg.AssetCheckResult(
        passed=not result["problems"],
        metadata={"tokens_checked": result["tokens"], "max_token_id": result["max_token_id"],
                  "vocab_size": result["vocab_size"] or 0, "records_reencoded": result["reencoded_records"],
                  "problems": _problems_md(result["problems"])},
    )


@dg.asset_check(asset="funnel_telemetry", description="Every stage: records in = records out + dropped, and stages link up.")
def funnel_conserved(data_root: DataRoot) -> dg.AssetCheckResult:
    funnel = build_funnel(data_root.path(""))
    broken = [s["stage"] for s in funnel["stages"] if not (s["conserved"] and s["linked"])]
    return dg.AssetCheckResult(
        passed=not broken,
        metadata={"stages_checked": len(funnel["stages"]), "broken_stages": ", ".join(broken) or "none"},
    )
