"""The source batches as Dagster dynamic partitions, and where a batch's output of a per-batch asset goes."""

from pathlib import Path

import dagster as dg

from resources import DataRoot
from tokenmill.batches import PARTITIONS_NAME, REBUILD_HINT, Batch, is_batch_key, read_registry
from tokenmill.errors import SourceChangedError, UnknownBatchError

SOURCE_BATCHES = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)
PER_BATCH_ASSETS = ("raw_records", "cleaned_jsonl", "dedup_report", "dedup_index", "deduped_jsonl")


def registered_batch(context: dg.AssetExecutionContext, data_root: DataRoot) -> Batch:
    """The source batch this run materializes, as `tokenmill update` or the sensor registered it: every per-batch
    asset calls this before it touches the disk. A partition key that is no batch of this data root (typed into
    the partition dialog, added through GraphQL or the API) is refused, and removed from the instance's
    partitions unless some data root's asset was ever materialized for it (one instance may serve several data
    roots, whose batches share the partitions)."""
    key = context.partition_key
    try:
        return read_registry(data_root.path("")).batch(key)
    except KeyError as e:
        removed = ""
        if not is_batch_key(key) or not _ever_materialized(context.instance, key):
            context.instance.delete_dynamic_partition(PARTITIONS_NAME, key)
            removed = f"; partition {key!r} was removed"
        raise UnknownBatchError(
            f"{e.args[0]}{removed}: source batches are registered by `tokenmill update`, the source_files_sensor "
            "or the tokenmill_daily schedule"
        ) from None


def _ever_materialized(instance: dg.DagsterInstance, key: str) -> bool:
    return any(key in instance.get_materialized_partitions(dg.AssetKey(asset)) for asset in PER_BATCH_ASSETS)


def batch_output(data_root: DataRoot, asset_key: str, key: str) -> Path:
    """`<data root>/<asset key>/<batch key>`: the folder one batch's output is published as."""
    if not is_batch_key(key):  # registered_batch refuses such a key first; a path must never be built from one
        raise UnknownBatchError(f"{key!r} is not a source batch key (g<generation>-b<number>)")
    stage_dir = data_root.path(asset_key)
    if stage_dir.is_symlink():  # one folder for the whole corpus, written before source batches existed
        raise SourceChangedError(f"{stage_dir} holds a whole-corpus build of an earlier release; {REBUILD_HINT}")
    stage_dir.mkdir(parents=True, exist_ok=True)
    return stage_dir / key
