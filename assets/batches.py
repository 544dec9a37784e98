"""The source batches as Dagster dynamic partitions, and where a batch's output of a per-batch asset goes."""

from pathlib import Path

import dagster as dg

from resources import DataRoot
from tokenmill.batches import PARTITIONS_NAME, REBUILD_HINT, Batch, read_registry
from tokenmill.errors import SourceChangedError

SOURCE_BATCHES = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)


def registered_batch(context: dg.AssetExecutionContext, data_root: DataRoot) -> Batch:
    """The source batch this run materializes, as `tokenmill update` or the sensor registered it."""
    try:
        return read_registry(data_root.path("")).batch(context.partition_key)
    except KeyError as e:
        raise SourceChangedError(
            f"{e.args[0]}: source batches are registered by `tokenmill update` or the source_files_sensor"
        ) from None


def batch_output(data_root: DataRoot, asset_key: str, key: str) -> Path:
    """`<data root>/<asset key>/<batch key>`: the folder one batch's output is published as."""
    stage_dir = data_root.path(asset_key)
    if stage_dir.is_symlink():  # one folder for the whole corpus, written before source batches existed
        raise SourceChangedError(f"{stage_dir} holds a whole-corpus build of an earlier release; {REBUILD_HINT}")
    stage_dir.mkdir(parents=True, exist_ok=True)
    return stage_dir / key
