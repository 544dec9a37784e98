"""The tokenmill code location: one Definitions for `dagster dev`, `dagster ... -m definitions` and `dg`."""

from collections.abc import Iterable

import dagster as dg

import assets
from assets.exports import EXPORT_ASSETS
from assets.publish import publish_dataset_job, publish_schedules_from_env
from automation import daily_refresh, retire_source_batch_job, source_sensor, whole_graph_job
from resources import Compute, CorpusSource, DataRoot, compute_from_env, data_root_from_env, source_from_env
from tokenmill.errors import ConfigError
from tokenmill.stages import registry


def stage_assets(found: Iterable[object]) -> list[dg.AssetsDefinition]:
    """The assets of the registry's stages among `found` (what `load_assets_from_package_module` found), in the
    registry's order (a multi-asset once, at its first stage); a stage that no asset produces, or an asset that is
    neither a stage nor an export, is a ConfigError."""
    registry.check_registry()
    by_key = {
        key.to_user_string(): asset for asset in found if isinstance(asset, dg.AssetsDefinition) for key in asset.keys
    }
    exports = {key.to_user_string() for asset in EXPORT_ASSETS for key in asset.keys}
    keys = registry.stage_keys()
    if missing := [key for key in keys if key not in by_key]:
        raise ConfigError(f"stage registry: no asset produces {', '.join(missing)}")
    if unregistered := sorted(set(by_key) - set(keys) - exports):
        raise ConfigError(f"assets {', '.join(unregistered)} are no stage of tokenmill/stages/registry.py")
    ordered: list[dg.AssetsDefinition] = []
    for key in keys:
        if not any(asset is by_key[key] for asset in ordered):
            ordered.append(by_key[key])
    return ordered


ASSETS = stage_assets(dg.load_assets_from_package_module(assets))


def build_defs(source: CorpusSource, data_root: DataRoot, compute: Compute | None = None) -> dg.Definitions:
    """The code location for one source, data root and compute engine (tests build their own)."""
    return dg.Definitions(
        assets=[*ASSETS, *EXPORT_ASSETS],
        jobs=[whole_graph_job(str(data_root.path("")), source.path), retire_source_batch_job, publish_dataset_job],
        schedules=[daily_refresh, *publish_schedules_from_env()],  # publish's: when TOKENMILL_PUBLISH_TO is set
        sensors=[source_sensor(source.path)],
        resources={"source": source, "data_root": data_root, "compute": compute or Compute()},
        # one process per run, whatever launches it (job, UI "Materialize all", dg launch, schedule, sensor):
        # each stage fans out over its own workers, and the data root's lock is held by that one process
        executor=dg.in_process_executor,
    )


defs = build_defs(source_from_env(), data_root_from_env(), compute_from_env())
