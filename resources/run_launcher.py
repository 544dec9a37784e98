"""The instance's run launcher (deploy/dagster.yaml, dagster_home/dagster.yaml).

Runs whose process died: Dagster keeps a killed run STARTED, and the production queue (deploy/dagster.yaml: one
run per data root) then keeps every later run of that data root QUEUED. The data root's lock names the process that
holds it (tokenmill.common.lock), which tells a dead run from a live one; a `tokenmill update` run killed before it
took the lock is told by the process its tags name (resources/instance.py).

Runs refused before any work: Dagster's config schema carries no bounds, so the launchpad accepts `bp_threshold:
1.5`; the launcher checks the settings and ends such a run CANCELED, its process never started, with the one-line
`invalid run config, nothing was run: <asset>.<field>: ...` as the cancel message. A FAILED run would show its
assets red, their checks failed and its partitions Failed until a later run succeeds; a canceled one leaves each as
its last materialization (Dagster marks a partition failed and a planned check "execution failed" only for a run
that ended in FAILURE). Runs the DataRoot would refuse without touching the disk (a tokenmill_all run naming no
batch, run config moving the tagged data root) are canceled the same way."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus  # the launcher API's types

from resources import data_root_from_env, data_root_of_run, dead_holder_message
from resources.instance import gone_process
from tokenmill.batches import DATA_ROOT_TAG
from tokenmill.common.lock import holder_gone, read_holder
from tokenmill.errors import ConfigError
from tokenmill.settings import validate_run_settings

# the modules declaring a stage's settings (tests/test_refused_runs.py checks that none is missing)
SETTINGS_MODULES = (
    "tokenmill.stages.raw.settings",
    "tokenmill.stages.clean.settings",
    "tokenmill.stages.dedup.settings",
    "tokenmill.stages.tokenize.settings",
    "tokenmill.exports.hf_parquet",
)


def refused_settings(run_config: Mapping[str, Any] | None) -> str | None:
    """The one-line ConfigError that `validate_run_settings` raises for this run config, or None when it passes."""
    for module in SETTINGS_MODULES:  # each registers its stage's settings class on import
        importlib.import_module(module)
    try:
        validate_run_settings(run_config)
    except ConfigError as e:
        return str(e)
    return None


def refused_placement(run: dg.DagsterRun) -> str | None:
    """Why the run's DataRoot would refuse it at set-up without touching the disk (run config moving a tagged data
    root; a tokenmill_all run without a batch), else None. Refused here, the run ends canceled, not failed."""
    data_root = data_root_of_run(run)
    if data_root is None:
        return None
    problem = data_root.moved_by_run_config(run) or data_root.missing_batch(run)
    return None if problem is None else f"nothing was run: {problem}"


class DataRootRunLauncher(dg.DefaultRunLauncher):
    """Dagster's default run launcher (a run process per run, started by the code server) that first refuses a run
    whose stage settings are invalid (marked canceled with the one-line message, no process started), with the
    worker health check that run monitoring asks a launcher for (the
    default launcher has none, so monitoring never looks at a STARTED run). A run is failed once the process its
    tags name (a `tokenmill update` run) has ended on this host, or once its data root's lock names it and its
    process has ended: a killed `tokenmill update` or `dagster job execute` (no code server
    watches those processes) or a run whose code server went down with it. Every other run counts as running: the
    code server that launched a run reports its process's death itself, and a run that holds no lock yet is setting
    up or waiting for the lock. The daemon must run on the runs' host to see their processes."""

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        refused = refused_settings(run.run_config) or refused_placement(run)
        if refused is None:
            super().launch_run(context)
            return
        # CANCELED, not FAILURE: nothing ran, so no asset, check or partition may show failed
        self._instance.report_run_canceled(run, message=refused)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        # a `tokenmill update` run (tagged with its process, resources/instance.py) killed before taking the lock
        if (gone := gone_process(run)) is not None:
            return CheckRunHealthResult(WorkerStatus.FAILED, gone)
        # a UI asset selection carries no data-root tag: its code location's data root (the daemon's environment)
        data_root = run.tags.get(DATA_ROOT_TAG) or str(data_root_from_env().path(""))
        holder = read_holder(data_root)
        if holder.get("run_id") == run.run_id and holder_gone(holder):
            return CheckRunHealthResult(WorkerStatus.FAILED, dead_holder_message(holder, data_root))
        return CheckRunHealthResult(WorkerStatus.RUNNING)

    def get_run_worker_debug_info(self, run: dg.DagsterRun, include_container_logs: bool | None = True) -> str | None:
        """What monitoring adds to its failure message: why the run's process is known gone (a run still
        NOT_STARTED when its `tokenmill update` was killed fails at the start timeout with this line)."""
        return gone_process(run)
