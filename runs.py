"""`tokenmill update`: register the source's new files as a batch, run every pending batch through the graph in
this process, print one line per problem a user can fix and a summary at the end.

Dagster's console log is silenced: a run's warnings are printed after it, one line each; a failed run prints its
failing step, the one-line reason and the file holding its full log (the events are in the instance too). Dagster
and the definitions are imported once the worker pool is spawning (`update`), so both start together.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from tokenmill.batches import FUNNEL_FILE, pending_batches, read_registry
from tokenmill.common import disk
from tokenmill.common.cache import cache_folder
from tokenmill.common.io import REJECTED_FILE, read_json
from tokenmill.common.lock import DataRootLock
from tokenmill.common.parallel import local_workers, workers_kept
from tokenmill.errors import ConfigError, TokenmillError, failure_reason
from tokenmill.settings import validate_run_settings
from tokenmill.stages.telemetry import read_funnel
from tokenmill_loader.format import DATASET_FILE


def summary(data_root: Path) -> str:
    """Records per stage with its bytes on disk and per input byte, tokens, batches, the data root's bytes (each
    file once: tokenmill.common.disk) and where the shards are (funnel_telemetry/funnel.json, dataset.json); a data
    root where no batch has been published yet (every batch so far retired) says so."""
    if not (data_root / FUNNEL_FILE).exists():
        return "  nothing published yet: no batch has come through the graph"
    funnel = read_funnel(data_root)
    sizes, source = disk.stage_bytes(data_root), disk.input_bytes(data_root)

    def on_disk(n: int) -> str:
        return f"{disk.human(n):>9}  {disk.per_input(n, source):.2f} B/input B"

    lines = [
        f"  {s.stage:<15} {s.docs_out:>10,} records  {f'(dropped {s.dropped_total:,})':<16}"
        + (on_disk(sizes[s.stage]) if s.stage in sizes else "")
        for s in funnel.stages
    ]
    tokens = funnel.tokens
    lines.append(f"  tokens          {tokens.total:>10,}  ({100 * tokens.supervised_share:.1f}% supervised)")
    lines.append(f"  batches         {len(funnel.batches):>10,}  (generation {funnel.generation})")
    others = ", ".join(
        f"{k} {disk.human(sizes[k])} ({disk.per_input(sizes[k], source):.2f})"
        for k in disk.STAGES
        if k in sizes and k not in {s.stage for s in funnel.stages}
    )
    total = disk.tree_bytes(data_root)
    lines.append(
        f"  disk            {disk.human(total):>10}  {disk.per_input(total, source):.2f} B/input B for "
        f"{disk.human(source)} of input" + (f" (also {others})" if others else "")
    )
    manifest = data_root / "tokenized_bins" / "train" / DATASET_FILE
    version = read_json(manifest).get("version") if manifest.exists() else None
    lines.append(
        f"  shards          {data_root / 'tokenized_bins'}/{{train,val}}  version {version} "
        "(tokenmill_loader.open_store)"
    )
    return "\n".join(lines)


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
    """`step <step> failed: <reason>` for each failed step (or `run setup failed: ...`), in one line."""
    import dagster as dg

    failures = [
        f"{f'step {e.step_key}' if e.step_key else 'run setup'} failed: {failure_reason(e.event_specific_data.error)}"
        for e in result.all_events
        if e.event_type in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RESOURCE_INIT_FAILURE)
    ]
    return "; ".join(failures) or "see the full log"


def run_warnings(instance, run_id: str) -> list[str]:
    """The warnings the run's steps logged (recoveries, a wait for the data root), in order."""
    import logging

    return [e.user_message for e in instance.all_logs(run_id) if e.level == logging.WARNING and not e.is_dagster_event]


def write_run_log(instance, run_id: str) -> Path:
    """Every event of the run with its full error traces, to `$DAGSTER_HOME/logs/<run id>.log` (without
    DAGSTER_HOME, TOKENMILL_CACHE's `logs/`: the instance keeps nothing)."""
    import logging

    home = os.environ.get("DAGSTER_HOME")
    folder = Path(home) if home else cache_folder()
    lines = []
    for e in instance.all_logs(run_id):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.timestamp))
        what = e.user_message or (e.dagster_event_type.value if e.dagster_event_type else "")
        lines.append(f"{when} {logging.getLevelName(e.level)} {e.step_key or '-'} {what}")
        error = getattr(e.dagster_event.event_specific_data, "error", None) if e.is_dagster_event else None
        if error is not None:
            lines.append(error.to_string())
    path = folder / "logs" / f"{run_id}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def still_pending(data_root, instance, key: str) -> bool:
    """With TOKENMILL_LOCK_WAIT: while another run holds the data root (the DataRoot resource), says for whom it
    waits and waits; then whether batch `key` is still pending (the holder may just have run it)."""

    def say(message: str) -> None:
        print(f"tokenmill update: {message}", file=sys.stderr)

    if data_root.lock_wait_seconds:
        data_root.wait_until_free(instance, say)
    return key in pending_batches(data_root.path(""))


def run_batches(job, instance, keys: list[str], run_config: dict | None = None, raise_on_error: bool = False):
    """Runs `job` (tokenmill_all) for each batch in order in this process; yields (batch key, result) and stops
    after the first failure (a later batch is deduplicated against this one)."""
    from resources.instance import run_process_tags

    for key in keys:
        result = job.execute_in_process(
            run_config=run_config or {},
            instance=instance,
            partition_key=key,
            raise_on_error=raise_on_error,
            tags=run_process_tags(),  # a later update or run monitoring fails the run once this process is gone
        )
        yield key, result
        if not result.success:
            return


def update(config_path: str | None = None, rebuild: bool = False, drop_batches: tuple[str, ...] = ()) -> int:
    # One worker pool for every batch's run, spawning while Dagster and the definitions import (~2 s); a Ray run's
    # tasks go to the cluster, not to local workers.
    ray = bool(os.environ.get("TOKENMILL_RAY_ADDRESS"))
    try:
        pool = contextlib.nullcontext() if ray else workers_kept(local_workers())
    except ConfigError as e:  # TOKENMILL_WORKERS out of bounds
        print(f"tokenmill update: {e}", file=sys.stderr)
        return 2
    with pool:
        return _update(config_path, rebuild, drop_batches)


def _update(config_path: str | None, rebuild: bool, drop_batches: tuple[str, ...]) -> int:
    import dagster as dg

    home = os.environ.get("DAGSTER_HOME")
    if home and not Path(home).is_dir():  # Dagster's own error is a page of traceback
        print(
            f"tokenmill update: DAGSTER_HOME {home} is not a folder: create it with its dagster.yaml "
            f"(mkdir -p {home} && cp dagster_home/dagster.yaml {home}/), or unset DAGSTER_HOME",
            file=sys.stderr,
        )
        return 2
    from resources.instance import fail_runs_of_gone_processes, open_instance, unusable_instance

    def say(message: str) -> None:
        print(f"tokenmill update: {message}", file=sys.stderr)

    try:
        instance = open_instance(home, say) if home else dg.DagsterInstance.ephemeral()
        # runs of an earlier update killed before the data root's lock named them (that lock's holder is failed by
        # the next run taking it)
        fail_runs_of_gone_processes(instance, f"tokenmill update (pid {os.getpid()})", say)
    except TokenmillError as e:
        say(str(e))
        return 2
    try:
        from assets.batches import register_batches, retire
        from definitions import defs
        from resources import data_root_from_env, source_from_env

        source = source_from_env().resolved()
        root = data_root_from_env()
        run_config = load_run_config(config_path)
        run_config.setdefault("loggers", {"console": {"config": {"log_level": "CRITICAL"}}})
        job = defs.resolve_job_def("tokenmill_all")
        dg.validate_run_config(job, run_config)  # before anything is registered or written
        validate_run_settings(run_config)  # the bounds, which Dagster's schema does not carry
        data_root = root.usable(source)
        for key in drop_batches:
            with DataRootLock(data_root).acquire(f"tokenmill update --drop-batch {key}"):
                print(f"tokenmill update: {retire(instance, data_root, key, '`tokenmill update --drop-batch`')}")
        pending, waiting = register_batches(instance, data_root, source, rebuild)
        if waiting:
            print(f"tokenmill update: {waiting}", file=sys.stderr)
    except TokenmillError as e:
        print(f"tokenmill update: {e}", file=sys.stderr)
        return 2
    except dg.DagsterInvalidConfigError as e:  # a setting Dagster's schema refuses (an unknown choice or field)
        print(f"tokenmill update: {config_path}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except Exception as e:  # an instance whose schema is behind: one line naming `dagster instance migrate`
        if (line := unusable_instance(e, home)) is None:
            raise
        say(line)
        return 2
    if not pending:
        print(f"tokenmill update: {source} -> {data_root}: up to date, no new files to read\n{summary(data_root)}")
        return 0
    for key in pending:
        try:
            if not still_pending(root, instance, key):
                print(f"tokenmill update: batch {key}: already run by the run that held the data root")
                continue
        except TokenmillError as e:
            print(f"tokenmill update: {e}", file=sys.stderr)
            return 1
        ((_, result),) = run_batches(job, instance, [key], run_config)
        for warning in run_warnings(instance, result.run_id):
            print(f"tokenmill update: batch {key}: {warning}", file=sys.stderr)
        if not result.success:
            print(
                f"tokenmill update: batch {key}: {run_failure(result)}\n"
                f"  full log: {write_run_log(instance, result.run_id)} (run {result.run_id})",
                file=sys.stderr,
            )
            return 1
        batch = read_registry(data_root).batch(key)
        listed = data_root / "raw_records" / key / REJECTED_FILE
        refused = f", {len(batch.refused)} refused: listed in {listed}" if batch.refused else ""
        print(f"tokenmill update: batch {key} ({len(batch.files)} files{refused}): run {result.run_id}")
    print(f"tokenmill update: {source} -> {data_root}\n{summary(data_root)}")
    return 0
