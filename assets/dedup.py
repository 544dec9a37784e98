"""dedup_report and deduped_jsonl: two-level deduplication (exact key hash, then MinHash + LSH + exact Jaccard)."""

import dagster as dg

from assets.checks import DEDUPED_NO_EXACT_DUPLICATES, deduped_no_exact_duplicates, publish_only_if_passed
from assets.metadata import compute_metadata, dedup_report_metadata, deduped_jsonl_metadata
from resources import Compute, DataRoot
from tokenmill.common.io import REMOVED_FILE, read_json, staged_output
from tokenmill.stages.dedup import CLUSTERS_FILE, REPORT_FILE, DedupSettings, build_dedup_report, write_deduped


class DedupConfig(DedupSettings, dg.Config):
    """dedup_report run config: the DedupSettings fields (validated before the run starts)."""


@dg.asset(group_name="dedup", kinds={"python", "numpy"}, deps=["cleaned_jsonl"], code_version="1")
def dedup_report(
    context: dg.AssetExecutionContext, config: DedupConfig, data_root: DataRoot, compute: Compute
) -> dg.MaterializeResult:
    """Which cleaned records are duplicates, and of which record: exact (SHA-256 of a normalized key) and near
    (character shingles, MinHash, LSH bands chosen for the threshold, every candidate verified by exact Jaccard),
    clustered by union-find; one record per cluster is kept by a documented rule. `report.json` and
    `clusters.jsonl` hold the full report; `deduped_jsonl` applies it."""
    with compute.activated(context, data_root) as usage, staged_output(data_root.path("dedup_report")) as out:
        stats = build_dedup_report(data_root.path("cleaned_jsonl"), out, config, log=context.log)
        report = read_json(out / REPORT_FILE)
    return dg.MaterializeResult(
        metadata={
            **dedup_report_metadata(stats, report, data_root.path("dedup_report"), CLUSTERS_FILE, REPORT_FILE),
            **compute_metadata(usage),
        }
    )


@dg.asset(
    group_name="dedup",
    kinds={"python", "jsonl"},
    deps=["dedup_report", "cleaned_jsonl"],
    code_version="1",
    check_specs=[DEDUPED_NO_EXACT_DUPLICATES],
)
def deduped_jsonl(context: dg.AssetExecutionContext, data_root: DataRoot, compute: Compute):
    """The cleaned records minus the duplicates `dedup_report` found (lines copied unchanged, same shard names);
    `removed.jsonl` names, for every removed id, the id it duplicates, the level and the similarity."""
    with compute.activated(context, data_root) as usage, staged_output(data_root.path("deduped_jsonl")) as out:
        stats = write_deduped(data_root.path("cleaned_jsonl"), data_root.path("dedup_report"), out, log=context.log)
        check = deduped_no_exact_duplicates(out, data_root.path("dedup_report"))
        yield from publish_only_if_passed(check)
    yield dg.MaterializeResult(
        metadata={
            **deduped_jsonl_metadata(stats, data_root.path("deduped_jsonl"), REMOVED_FILE),
            **compute_metadata(usage),
        },
        check_results=[check],
    )
