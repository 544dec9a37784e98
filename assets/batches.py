"""The source batches as Dagster dynamic partitions, and where a batch's output of a per-batch asset goes."""

from pathlib import Path

import dagster as dg

from resources import CorpusSource, DataRoot
from tokenmill.batches import (
    PARTITIONS_NAME,
    PER_BATCH_STAGES,
    REBUILD_HINT,
    Batch,
    Registry,
    is_batch_key,
    read_registry,
    register_new_files,
)
from tokenmill.common.io import STATS_FILE, read_json
from tokenmill.errors import ConfigError, SourceChangedError, UnknownBatchError
from tokenmill.settings import StageSettings
from tokenmill.stages.clean import CleanSettings
from tokenmill.stages.dedup import DedupSettings
from tokenmill.stages.raw import RawSettings
from tokenmill.stages.raw.discover import source_state

SOURCE_BATCHES = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)
PER_BATCH_ASSETS = PER_BATCH_STAGES
# A sensor or schedule tick plans the next batch without writing anything (a previewed tick must not register it);
# its run carries the key in this tag, and raw_records registers the batch when the run starts.
PLANNED_BATCH_TAG = "tokenmill/planned_batch"

# The settings of the per-batch stages hold for a whole generation: the op whose config they are, where a published
# batch records the ones it was built with, and those that change how the work is split or reported, not the records
# (a batch built with other settings would leave tokenized_bins out of step with the stage outputs).
FROZEN_SETTINGS: dict[type[StageSettings], tuple[tuple[str, ...], frozenset[str]]] = {
    RawSettings: (
        (STATS_FILE, "settings"),
        frozenset({"task_mb", "records_per_shard", "parquet_batch_rows", "max_rejected_share"}),
    ),
    CleanSettings: ((STATS_FILE, "settings"), frozenset({"examples"})),
    DedupSettings: (("report.json", "parameters", "settings"), frozenset({"chunk_bytes", "sample_clusters"})),
}


def registered_batch(
    context: dg.AssetExecutionContext, data_root: DataRoot, source: CorpusSource | None = None
) -> Batch:
    """The source batch this run materializes, as `tokenmill update` registered it, or (with `source`: raw_records,
    the run's first step) as the sensor or schedule tick that requested the run planned it, registered now: every
    per-batch asset calls this before it touches the disk. A partition key that is no batch of this data root
    (typed into the partition dialog, added through GraphQL or the API) is refused, and removed from the instance's
    partitions unless some data root's asset was ever materialized for it (one instance may serve several data
    roots, whose batches share the partitions). A retired batch is refused, and so are settings other than the
    ones the generation's published batches were built with."""
    key = context.partition_key
    root = data_root.path("")
    if source is not None and is_batch_key(key) and context.run.tags.get(PLANNED_BATCH_TAG) == key:
        src = source.resolved()
        register_new_files(root, src, source_state(src, exclude=root), key=key)
    try:
        registry = read_registry(root)
        batch = registry.batch(key)
    except KeyError as e:
        removed = ""
        if not is_batch_key(key) or not _ever_materialized(context.instance, key):
            context.instance.delete_dynamic_partition(PARTITIONS_NAME, key)
            removed = f"; partition {key!r} was removed"
        raise UnknownBatchError(
            f"{e.args[0]}{removed}: source batches are registered by `tokenmill update`, the source_files_sensor "
            "or the tokenmill_daily schedule"
        ) from None
    if batch.retired:
        raise UnknownBatchError(
            f"batch {key} was retired ({batch.retired}): later batches do not count it; its files come in again "
            "as a new batch once they change"
        )
    refuse_other_settings(context, registry, root, key)
    return batch


def refuse_other_settings(context: dg.AssetExecutionContext, registry: Registry, root: Path, key: str) -> None:
    """ConfigError naming each setting of this op that differs from the ones the first published batch of the
    generation was built with (as the frozen tokenizer does): the old and new value, and `--rebuild`."""
    op = context.op_execution_context
    settings_class = next((cls for cls in FROZEN_SETTINGS if cls.asset_key == op.op_def.name), None)
    if settings_class is None:
        return
    (file, *fields), not_frozen = FROZEN_SETTINGS[settings_class]
    wanted = settings_class(**(op.op_config or {})).model_dump(mode="json")
    for built in registry.live_keys:
        path = root / settings_class.asset_key / built / file
        if not path.exists():
            continue
        recorded = read_json(path)
        for name in fields:
            recorded = recorded.get(name) or {}
        changed = sorted(k for k in wanted if k not in not_frozen and k in recorded and recorded[k] != wanted[k])
        if changed:
            shown = ", ".join(f"{k}: {recorded[k]!r} -> {wanted[k]!r}" for k in changed)
            raise ConfigError(
                f"{settings_class.asset_key}: batch {key} would be built with other settings than batch {built} of "
                f"generation {registry.generation} ({shown}); every batch of a generation is built alike, so "
                f"tokenized_bins stays in step with the stages before it: keep those settings, or {REBUILD_HINT} "
                "with the new ones"
            )
        return


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
