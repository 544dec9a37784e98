"""`tokenmill update`: register the source's new files as a batch, run every pending batch through the graph in
this process, print one line per problem a user can fix and a summary at the end.

Dagster's console log is kept to warnings: the runs' events are in the instance (`dagster dev` shows them).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from tokenmill.batches import PARTITIONS_NAME, read_registry, register_new_files, start_generation
from tokenmill.common.io import read_json, remove_stage
from tokenmill.common.lock import DataRootLock
from tokenmill.common.parallel import workers_kept
from tokenmill.errors import ConfigError, SourceError, TokenmillError
from tokenmill.stages.raw.discover import source_state
from tokenmill_loader.format import DATASET_FILE

FUNNEL_FILE = Path("funnel_telemetry") / "funnel.json"
# A rebuild starts these again from the source; tokenized_bins keeps its versions for running readers and the
# funnel its history.
REBUILT_STAGES = ("raw_records", "cleaned_jsonl", "dedup_report", "dedup_index", "deduped_jsonl", "tokenizer")


def pending_batches(data_root: Path) -> list[str]:
    """Registered batches, in order, that the funnel does not list yet (not yet through the whole graph)."""
    registry = read_registry(data_root)
    funnel_path = Path(data_root) / FUNNEL_FILE
    done = set()
    if funnel_path.exists():
        funnel = read_json(funnel_path)
        if funnel.get("generation") == registry.generation:
            done = {b["batch"] for b in funnel.get("batches", [])}
    return [k for k in registry.keys if k not in done]


def register_batches(instance, data_root: Path, source: Path, rebuild: bool = False) -> list[str]:
    """Registers the source's new files as a batch (with `rebuild`, every file as the first batch of a new
    generation, the per-batch outputs and the tokenizer removed) and adds the batches to the instance's dynamic
    partitions; returns the pending batches. SourceChangedError when ingested files changed and no rebuild."""
    state = source_state(source, exclude=data_root)
    if not state:
        raise SourceError(f"TOKENMILL_SOURCE has no .jsonl, .json, .txt or .csv file (or .gz of these): {source}")
    if rebuild:
        funnel = data_root / FUNNEL_FILE
        with DataRootLock(data_root).acquire("tokenmill update --rebuild"):
            start_generation(data_root, source, state, after=read_json(funnel)["generation"] if funnel.exists() else 0)
            for stage in REBUILT_STAGES:
                remove_stage(data_root / stage)
    else:
        register_new_files(data_root, source, state)
    keys = read_registry(data_root).keys
    known = instance.get_dynamic_partitions(PARTITIONS_NAME)
    if rebuild:  # the earlier generations' batches leave the instance's partitions
        for key in sorted(set(known) - set(keys)):
            instance.delete_dynamic_partition(PARTITIONS_NAME, key)
    instance.add_dynamic_partitions(PARTITIONS_NAME, [k for k in keys if k not in known])
    return pending_batches(data_root)


def summary(data_root: Path) -> str:
    """Records per stage, tokens, batches and where the shards are (funnel_telemetry/funnel.json, dataset.json)."""
    funnel = read_json(data_root / FUNNEL_FILE)
    lines = [
        f"  {s['stage']:<15} {s['docs_out']:>10,} records  (dropped {s['dropped_total']:,})" for s in funnel["stages"]
    ]
    tokens = funnel["tokens"]
    lines.append(f"  tokens          {tokens['total']:>10,}  ({100 * tokens['supervised_share']:.1f}% supervised)")
    lines.append(f"  batches         {len(funnel['batches']):>10,}  (generation {funnel['generation']})")
    manifest = data_root / "tokenized_bins" / "train" / DATASET_FILE
    version = read_json(manifest).get("version") if manifest.exists() else None
    lines.append(
        f"  shards          {data_root / 'tokenized_bins'}/{{train,val}}  version {version} "
        "(tokenmill_loader.open_store)"
    )
    return "\n".join(lines)


TOKENMILL_ERRORS = {"TokenmillError", *(cls.__name__ for cls in TokenmillError.__subclasses__())}


def failure_reason(error) -> str:
    """The TokenmillError at the root of a step failure (one line a user can act on), else the outermost error."""
    outer = error
    while error is not None:
        if error.cls_name in TOKENMILL_ERRORS:
            return error.message.strip()  # Dagster records it as "<module>.<class>: <message>"
        error = error.cause
    return outer.message.strip()


def load_run_config(config_path: str | None) -> dict:
    """The run config YAML given with -c (a mapping), or a ConfigError naming the file."""
    import yaml

    if not config_path:
        return {}
    try:
        run_config = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"run config {config_path}: {' '.join(str(e).split())}") from None
    if not isinstance(run_config, dict):
        raise ConfigError(
            f"run config {config_path}: expected a mapping (ops: <asset>: config: ...), got {type(run_config).__name__}"
        )
    return run_config


def run_failure(result) -> str:
    import dagster as dg

    failures = [
        e.event_specific_data.error
        for e in result.all_events
        if e.event_type in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RESOURCE_INIT_FAILURE)
    ]
    return "; ".join(failure_reason(err) for err in failures) or "see the run log"


def run_batches(job, instance, keys: list[str], run_config: dict | None = None, raise_on_error: bool = False):
    """Runs `job` (tokenmill_all) for each batch in order in this process; yields (batch key, result) and stops
    after the first failure (a later batch is deduplicated against this one)."""
    for key in keys:
        result = job.execute_in_process(
            run_config=run_config or {}, instance=instance, partition_key=key, raise_on_error=raise_on_error
        )
        yield key, result
        if not result.success:
            return


def update(config_path: str | None = None, rebuild: bool = False) -> int:
    # One worker pool for every batch's run, spawning while Dagster and the definitions import (~2 s); a Ray run's
    # tasks go to the cluster, not to local workers.
    ray = bool(os.environ.get("TOKENMILL_RAY_ADDRESS"))
    with contextlib.nullcontext() if ray else workers_kept():
        return _update(config_path, rebuild)


def _update(config_path: str | None, rebuild: bool) -> int:
    import dagster as dg

    instance = dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()
    try:
        from definitions import defs
        from resources import data_root_from_env, source_from_env

        source = source_from_env().resolved()
        data_root = data_root_from_env().path("")
        run_config = load_run_config(config_path)
        run_config.setdefault("loggers", {"console": {"config": {"log_level": "WARNING"}}})
        job = defs.resolve_job_def("tokenmill_all")
        dg.validate_run_config(job, run_config)  # before anything is registered or written
        pending = register_batches(instance, data_root, source, rebuild)
    except TokenmillError as e:
        print(f"tokenmill update: {e}", file=sys.stderr)
        return 2
    except dg.DagsterInvalidConfigError as e:  # a setting Dagster's schema refuses (an unknown choice or field)
        print(f"tokenmill update: {config_path}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if not pending:
        print(f"tokenmill update: {source} -> {data_root}: up to date, no new files\n{summary(data_root)}")
        return 0
    for key, result in run_batches(job, instance, pending, run_config):
        if not result.success:
            print(f"tokenmill update: batch {key}: run {result.run_id} failed: {run_failure(result)}", file=sys.stderr)
            return 1
        files = len(read_registry(data_root).batch(key).files)
        print(f"tokenmill update: batch {key} ({files} files): run {result.run_id}")
    print(f"tokenmill update: {source} -> {data_root}\n{summary(data_root)}")
    return 0
