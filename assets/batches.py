"""The source batches as Dagster dynamic partitions, and where a batch's output of a per-batch asset goes."""

from pathlib import Path

import dagster as dg

from resources import CorpusSource, DataRoot
from tokenmill.batches import (
    FUNNEL_FILE,
    PARTITIONS_NAME,
    PER_BATCH_STAGES,
    PLANNED_BATCH_TAG,
    REBUILD_HINT,
    Batch,
    Registry,
    is_batch_key,
    pending_batches,
    quarantine,
    read_registry,
    register_new_files,
    retire_batch,
    start_generation,
)
from tokenmill.common.io import REJECTED_FILE, STATS_FILE, read_json, remove_stage
from tokenmill.common.lock import DataRootLock
from tokenmill.common.remote import Location
from tokenmill.errors import ConfigError, SourceChangedError, SourceError, UnknownBatchError
from tokenmill.settings import StageSettings
from tokenmill.stages.clean import CleanSettings
from tokenmill.stages.dedup import DedupSettings
from tokenmill.stages.raw import RawSettings
from tokenmill.stages.raw.discover import source_state
from tokenmill.stages.registry import rebuilt_keys

SOURCE_BATCHES = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)
PER_BATCH_ASSETS = PER_BATCH_STAGES
REBUILT_STAGES = rebuilt_keys()  # a rebuild starts these again from the source

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


def register_batches(
    instance, data_root: Path, source: Location, rebuild: bool = False
) -> tuple[list[str], str | None]:
    """Registers the source's new files as a batch (with `rebuild`, every file as the first batch of a new
    generation, the per-batch outputs and the tokenizer removed) and adds the batches to the instance's dynamic
    partitions; returns the pending batches, and what waits for the user (files already ingested that changed or
    were removed: `SourceChanges.waiting`; new files all refused, whose batch was retired when registered), None
    when nothing does."""
    state = source_state(source, exclude=data_root)
    if not state:
        raise SourceError(
            f"TOKENMILL_SOURCE has no .jsonl, .json, .txt or .csv file (or .gz, .zst of these) or .parquet: {source}"
        )
    if rebuild:
        funnel = data_root / FUNNEL_FILE
        with DataRootLock(data_root).acquire("tokenmill update --rebuild"):
            new_key: str | None = start_generation(
                data_root, source, state, after=read_json(funnel)["generation"] if funnel.exists() else 0
            )
            for stage in REBUILT_STAGES:
                remove_stage(data_root / stage)
        waiting = None
    else:
        new_key, changes = register_new_files(data_root, source, state)
        waiting = changes.waiting()
    registry = read_registry(data_root)
    if new_key is not None and (retired := registry.batch(new_key).retired):  # every new file refused
        held = quarantine(data_root, new_key) / REJECTED_FILE
        refused = f"batch {new_key} {retired}{f' (listed in {held})' if held.exists() else ''}"
        waiting = f"{refused}; {waiting}" if waiting else refused
    keys = registry.live_keys
    known = instance.get_dynamic_partitions(PARTITIONS_NAME)
    if rebuild:  # the earlier generations' batches leave the instance's partitions
        for key in sorted(set(known) - set(keys)):
            instance.delete_dynamic_partition(PARTITIONS_NAME, key)
    instance.add_dynamic_partitions(PARTITIONS_NAME, [k for k in keys if k not in known])
    return pending_batches(data_root), waiting


def retire(instance, data_root: Path, key: str, by: str) -> str:
    """Retires batch `key` (`retire_batch`; hold the data root's lock) and removes its partition from the
    instance; returns one line saying what was removed and where its rejected records are."""
    removed = retire_batch(data_root, key, f"retired by {by}")
    if key in instance.get_dynamic_partitions(PARTITIONS_NAME):
        instance.delete_dynamic_partition(PARTITIONS_NAME, key)
    held = quarantine(data_root, key) / REJECTED_FILE
    return (
        f"batch {key} retired: later batches no longer count it (removed: {', '.join(removed) or 'no output'}"
        f"{f'; its rejected records: {held}' if held.exists() else ''}); its files come in again once they change"
    )
