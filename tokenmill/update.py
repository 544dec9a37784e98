"""`tokenmill update`: the whole graph in this process, one line per problem a user can fix, a summary at the end.

Dagster's console log is kept to warnings: the run's events are in the instance (`dagster dev` shows them).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tokenmill.common.io import read_json
from tokenmill.errors import ConfigError, SourceError, TokenmillError
from tokenmill.stages.raw.discover import source_state

SUMMARY_STAGES = ("raw_records", "cleaned_jsonl", "deduped_jsonl", "tokenized_bins")


def summary(data_root: Path) -> str:
    """Records per stage, tokens, and where the shards are (from funnel_telemetry/funnel.json)."""
    funnel = read_json(data_root / "funnel_telemetry" / "funnel.json")
    lines = [
        f"  {s['stage']:<15} {s['docs_out']:>10,} records  (dropped {s['dropped_total']:,})" for s in funnel["stages"]
    ]
    tokens = funnel["tokens"]
    lines.append(f"  tokens          {tokens['total']:>10,}  ({100 * tokens['supervised_share']:.1f}% supervised)")
    lines.append(f"  shards          {data_root / 'tokenized_bins'}/{{train,val}}  (tokenmill_loader.open_store)")
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


def update(config_path: str | None = None) -> int:
    import dagster as dg

    try:
        from definitions import defs
        from resources import data_root_from_env, source_from_env

        path = source_from_env().resolved()
        if not source_state(path):
            raise SourceError(f"TOKENMILL_SOURCE has no .jsonl, .json, .txt or .csv file (or .gz of these): {path}")
        run_config = load_run_config(config_path)
    except TokenmillError as e:
        print(f"tokenmill update: {e}", file=sys.stderr)
        return 2
    run_config.setdefault("loggers", {"console": {"config": {"log_level": "WARNING"}}})
    instance = dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()
    job = defs.resolve_job_def("tokenmill_all")
    try:
        result = job.execute_in_process(run_config=run_config, instance=instance, raise_on_error=False)
    except dg.DagsterInvalidConfigError as e:  # a setting Dagster's schema refuses (an unknown choice or field)
        print(f"tokenmill update: {config_path}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    data_root = data_root_from_env().path("")
    if not result.success:
        failures = [
            e.event_specific_data.error
            for e in result.all_events
            if e.event_type in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RESOURCE_INIT_FAILURE)
        ]
        reasons = [failure_reason(err) for err in failures]
        print(
            f"tokenmill update: run {result.run_id} failed: " + ("; ".join(reasons) or "see the run log"),
            file=sys.stderr,
        )
        return 1
    print(f"tokenmill update: {path} -> {data_root} (run {result.run_id})\n{summary(data_root)}")
    return 0
