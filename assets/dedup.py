"""dedup_report, dedup_index and deduped_jsonl: two-level deduplication (exact key hash, then MinHash + LSH + exact
Jaccard) of each source batch within itself and against every record kept from the batches before it."""

import dagster as dg

from assets.batches import SOURCE_BATCHES, batch_output, registered_batch
from assets.checks import (
    DEDUP_REPORT_QUALITY,
    DEDUPED_NO_EXACT_DUPLICATES,
    dedup_report_quality,
    deduped_no_exact_duplicates,
    publish_only_if_passed,
)
from assets.clean import cleaned_jsonl
from assets.metadata import compute_metadata, dedup_report_metadata, deduped_jsonl_metadata, disk_metadata
from resources import Compute, DataRoot
from tokenmill.batches import read_registry
from tokenmill.common.disk import records_bytes
from tokenmill.common.io import REMOVED_FILE, gather_batch_files, read_json, shards_version, staged_output
from tokenmill.errors import StaleUpstreamError
from tokenmill.stages import dedup
from tokenmill.stages.dedup import CLUSTERS_FILE, REPORT_FILE, DedupSettings, dedup_batch, write_deduped
from tokenmill.stages.registry import DEDUP_REPORT

# said on each per-batch asset's page: its Overview holds one batch only
PER_BATCH_PAGES = (
    "One materialization per source batch: Overview shows the latest batch's; every batch's is under Partitions "
    "(select the batch) and Events."
)


class DedupConfig(DedupSettings, dg.Config):
    """dedup_report run config: the DedupSettings fields (validated before the run starts)."""


@dg.multi_asset(
    name="dedup_report",  # the op's run config stays `ops: dedup_report: config: ...`
    specs=[
        dg.AssetSpec(
            "dedup_report",
            group_name="dedup",
            kinds={"python", "numpy"},
            deps=[cleaned_jsonl],
            code_version=dedup.VERSION,
            description="Which records of one batch are duplicates, and of which record: exact (SHA-256 of a "
            "normalized key) and near (shingles, MinHash, LSH bands chosen for the threshold, every candidate "
            "verified by exact Jaccard), within the batch by the keep rule and against every record kept from "
            "earlier batches (first seen wins: a kept record is never removed later). `report.json` and "
            "`clusters.jsonl` hold the full report; `deduped_jsonl` applies it. " + PER_BATCH_PAGES,
        ),
        dg.AssetSpec(
            "dedup_index",
            group_name="dedup",
            kinds={"numpy"},
            deps=[cleaned_jsonl],
            code_version=dedup.VERSION,
            description="The persistent dedup index, one segment per batch: exact-key digests, LSH band hashes and "
            "what verification needs for every record the batch kept, so later batches are deduplicated against "
            "them without re-reading earlier batches. " + PER_BATCH_PAGES,
        ),
    ],
    partitions_def=SOURCE_BATCHES,
    check_specs=[DEDUP_REPORT_QUALITY],
)
def dedup_batch_assets(context: dg.AssetExecutionContext, config: DedupConfig, data_root: DataRoot, compute: Compute):
    key = registered_batch(context, data_root).key
    earlier = [data_root.path("dedup_index") / k for k in read_registry(data_root.path("")).earlier(key)]
    if missing := [p.name for p in earlier if not p.exists()]:
        raise StaleUpstreamError(
            f"dedup of batch {key} needs the dedup index of every earlier batch; materialize {', '.join(missing)} first"
        )
    report_dir, index_dir = batch_output(data_root, "dedup_report", key), batch_output(data_root, "dedup_index", key)
    with (
        compute.activated(context, data_root) as usage,
        staged_output(report_dir) as report_out,
        staged_output(index_dir) as index_out,
    ):
        result = dedup_batch(
            data_root.path("cleaned_jsonl") / key, earlier, report_out, index_out, config, log=context.log
        )
        report = read_json(report_out / REPORT_FILE)
        quality = dedup_report_quality(report, config.quality_blocking)
        if config.quality_blocking:
            yield from publish_only_if_passed(quality)
    yield dg.MaterializeResult(
        asset_key="dedup_report",
        metadata={
            **dedup_report_metadata(result, report, report_dir, CLUSTERS_FILE, REPORT_FILE),
            **compute_metadata(usage),
        },
        check_results=[quality],
    )
    yield dg.MaterializeResult(
        asset_key="dedup_index",
        metadata={
            "path": dg.MetadataValue.path(str(index_dir)),
            "earlier_segments": len(earlier),
            **disk_metadata(index_dir),
        },
    )


@dg.asset(
    group_name="dedup",
    kinds={"python", "jsonl"},
    deps=[DEDUP_REPORT.key, cleaned_jsonl],
    code_version=dedup.VERSION,
    partitions_def=SOURCE_BATCHES,
    check_specs=[DEDUPED_NO_EXACT_DUPLICATES],
)
def deduped_jsonl(context: dg.AssetExecutionContext, data_root: DataRoot, compute: Compute):
    """One batch of cleaned records minus the duplicates `dedup_report` found (lines copied unchanged, same shard
    names); `removed.jsonl` names, for every removed id, the id it duplicates, the level and the similarity (the
    stage folder's `removed.jsonl` gathers every batch's).

    One materialization per source batch: Overview shows the latest batch's; every batch's is under Partitions
    (select the batch) and Events."""
    key = registered_batch(context, data_root).key
    folder = batch_output(data_root, "deduped_jsonl", key)
    report_dir = data_root.path("dedup_report") / key
    cleaned = data_root.path("cleaned_jsonl") / key
    with compute.activated(context, data_root) as usage, staged_output(folder, records_bytes(cleaned)) as out:
        applied = write_deduped(cleaned, report_dir, out, log=context.log)
        check = deduped_no_exact_duplicates(out, report_dir)
        yield from publish_only_if_passed(check)
    gather_batch_files(data_root.path("deduped_jsonl"), REMOVED_FILE)
    yield dg.MaterializeResult(
        metadata={**deduped_jsonl_metadata(applied, folder, REMOVED_FILE), **compute_metadata(usage)},
        check_results=[check],
        data_version=dg.DataVersion(shards_version(folder)),
    )
