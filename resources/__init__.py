"""Resources: where the corpus comes from, where every asset writes and where the stages compute (all settable from
the environment and, in the UI, from the launchpad)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from pydantic import Field, PrivateAttr

from tokenmill.batches import DATA_ROOT_TAG, SOURCE_TAG, WHOLE_GRAPH_JOB, read_registry
from tokenmill.common.compute import LocalEngine, RayEngine, RayOptions, Usage, activated
from tokenmill.common.failpoints import failpoint
from tokenmill.common.io import recover_data_root
from tokenmill.common.lock import DataRootLock
from tokenmill.common.parallel import local_workers, workers_kept
from tokenmill.common.remote import Location, as_location
from tokenmill.common.staging import STAGING_VARIABLE, DataRootStager, StagingArea
from tokenmill.errors import ConfigError, DataRootBusyError, SourceError
from tokenmill.settings import number_from_env, validate_run_settings

PARTITION_TAG = "dagster/partition"  # the partition key of a run of one partition
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO_ROOT / "demo_corpus" / "source"
DEFAULT_DATA = REPO_ROOT / "data"


def dead_holder_message(holder: dict, data_root: str) -> str:
    return (
        f"run {holder['run_id']}: its process {holder['pid']} on {holder['host']} ended while it held the data root "
        f"{data_root} (since {holder.get('since', '?')}), without finishing the run: killed (kill -9, the OOM killer) "
        "or crashed"
    )


def fail_run_of_dead_holder(
    instance: dg.DagsterInstance, holder: dict, data_root: str, by_run_id: str, warn: Callable[[str], None]
) -> None:
    """Marks failed the run that died holding the data root's lock (`DataRootLock.dead_holder`, found by the run
    `by_run_id` that takes the lock next) when Dagster still shows it in progress."""
    run = instance.get_run_by_id(holder["run_id"]) if holder else None
    if run is None or run.is_finished:
        return
    message = dead_holder_message(holder, data_root)
    instance.report_run_failed(run, f"{message}; marked failed by run {by_run_id}")
    warn(f"marked run {run.run_id} failed: {message}")


class CorpusSource(dg.ConfigurableResource):
    """The input corpus: a file or a folder searched recursively (.jsonl, .json, .txt, .csv, .gz and .zst of these,
    .parquet), or an object or a prefix on object storage (`s3://bucket/prefix/`, any fsspec URL:
    docs/object-storage.md; credentials from the standard variables or profile, never from here)."""

    path: str = Field(
        description="File, folder or URL (s3://bucket/prefix/) to ingest; env TOKENMILL_SOURCE, default the bundled "
        "demo corpus"
    )

    def location(self) -> Location:
        """The source as given: a local Path (`~` expanded, `file://` taken off) or a URL."""
        return as_location(self.path)

    def resolved(self) -> Location:
        """The source path (absolute) or URL, or a clear error before any work starts."""
        p = self.location()
        if not p.exists():
            raise SourceError(
                f"TOKENMILL_SOURCE does not exist: {p} (set TOKENMILL_SOURCE to a file or folder, or an object or "
                "prefix URL)"
            )
        return p.resolve()


class RunConfigRefused(dg.DagsterUserCodeExecutionError):
    """Invalid stage settings found at the run's set-up (a run the instance's launcher did not start: `dagster job
    execute`). Raised as Dagster's own user-code error, it passes the resource boundary as it is: the run's failure
    reads `invalid run config, nothing was run: <asset>.<field>: ...`, not "Error executing resource_fn on
    ResourceDefinition data_root", and the resource-init failure event still carries the ConfigError."""


class DataRoot(dg.ConfigurableResource):
    """The data root: every asset writes under <root>/<asset key>/.

    It is also the run's gate to that folder: set up once per run (every job runs in one process), it first
    validates every stage's settings in the run config and the run's tags (a tokenmill_all run names its batch, its
    data root and its source), then takes the data root's lock for the whole run, so two runs on one data root
    never interleave (the second is refused, naming the holder, or waits)."""

    root: str = Field(description="Folder for all asset outputs; env TOKENMILL_DATA, default ./data in the repo")
    lock_wait_seconds: float = Field(
        default=0.0,
        ge=0.0,
        le=7 * 24 * 3600.0,  # a week: longer is a typo, and inf would wait forever
        description="Wait this long for another run holding the data root "
        "(env TOKENMILL_LOCK_WAIT), then fail naming it",
    )
    _lock: DataRootLock | None = PrivateAttr(default=None)

    def path(self, asset_key: str) -> Path:
        return Path(self.root).expanduser().resolve() / asset_key

    def usable(self, source: Location | None = None) -> Path:
        """The data root, created when missing, or a ConfigError in one line when it cannot be one: a file, a
        folder whose parent does not exist (a typo more often than a wish for a new tree), the folder of `source`
        (or one inside the data root: the stages would ingest their own outputs), or a folder this user cannot
        write."""
        root = self.path("")
        if root.exists() and not root.is_dir():
            raise ConfigError(f"TOKENMILL_DATA {root} is a file, not a folder: point TOKENMILL_DATA at a folder")
        if not root.parent.is_dir():
            raise ConfigError(
                f"TOKENMILL_DATA {root}: its parent folder {root.parent} does not exist (create it, or fix the path)"
            )
        if source is not None and source.resolve().is_relative_to(root):
            raise ConfigError(
                f"TOKENMILL_SOURCE {source} is {'' if source.resolve() == root else 'inside '}the data root "
                f"TOKENMILL_DATA {root}: the stages write their outputs there; keep the corpus outside the data root"
            )
        try:
            root.mkdir(exist_ok=True)
            tempfile.TemporaryFile(dir=root).close()  # a real write: os.access says yes to root where it cannot write
        except OSError as e:
            raise ConfigError(f"TOKENMILL_DATA {root}: cannot write there ({e.strerror or e})") from None
        return root

    def acquire(self, run_id: str, say: Callable[[str], None]) -> DataRootLock:
        """The data root's lock for `run_id`; while another run holds it and lock_wait_seconds allows, says for whom
        it waits. A folder it cannot write is a ConfigError in one line."""
        lock = DataRootLock(self.path(""))
        try:
            try:
                return lock.acquire(run_id)
            except DataRootBusyError as busy:
                if not self.lock_wait_seconds:
                    raise
                say(f"{str(busy).split(';')[0]}: waiting up to {self.lock_wait_seconds:g} s (TOKENMILL_LOCK_WAIT)")
            return lock.acquire(run_id, wait_seconds=self.lock_wait_seconds)
        except OSError as e:
            raise ConfigError(f"TOKENMILL_DATA {self.path('')}: cannot write there ({e.strerror or e})") from None

    def wait_until_free(self, instance: dg.DagsterInstance, say: Callable[[str], None]) -> None:
        """Returns once no other run holds the data root, having waited up to lock_wait_seconds and said for whom
        (DataRootBusyError past that). Holds the lock for an instant, so it fails a run that died holding it, as a
        run taking the lock does (that run would no longer find its name)."""
        holder = f"tokenmill update (pid {os.getpid()})"
        lock = self.acquire(holder, say)
        try:
            fail_run_of_dead_holder(instance, lock.dead_holder, str(self.path("")), holder, say)
        finally:
            lock.release()

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run = context.run
        if run is None:  # built outside a run (tests calling an asset function directly)
            return
        instance, log = context.instance, context.log
        assert instance is not None and log is not None  # a run's resources get both
        try:  # the launcher refuses these runs before their process starts; here for runs it did not launch
            validate_run_settings(run.run_config)
        except ConfigError as e:
            raise RunConfigRefused(str(e), user_exception=e, original_exc_info=sys.exc_info()) from e
        self.check_run_tags(run)
        failpoint("data_root:lock")  # the run STARTED, its data root not yet locked (tests/test_dead_runs.py)
        self._lock = self.acquire(run.run_id, log.warning)
        # a run that died holding the lock stays STARTED in Dagster (and keeps its data root's queue closed)
        fail_run_of_dead_holder(instance, self._lock.dead_holder, str(self.path("")), run.run_id, log.warning)
        for action in recover_data_root(self.path("")):  # what an interrupted run left, now that no run is writing
            log.warning(f"recovered {self.path('')}: {action}")

    def check_run_tags(self, run: dg.DagsterRun) -> None:
        """Before anything is written: the data root and source a tokenmill_all run is tagged with (the code
        location's own) are the ones this run would use, and the run names its source batch."""
        if (moved := self.moved_by_run_config(run)) is not None:
            raise ConfigError(moved)
        tagged_source = run.tags.get(SOURCE_TAG)
        self.usable(Path(tagged_source) if tagged_source else None)
        if (missing := self.missing_batch(run)) is not None:
            raise ConfigError(missing)

    def moved_by_run_config(self, run: dg.DagsterRun) -> str | None:
        """Why the run may not start when its run config moves the data root away from its tag, else None."""
        tagged_root = run.tags.get(DATA_ROOT_TAG)
        if tagged_root and Path(tagged_root).resolve() != self.path(""):
            return (
                f"data_root.root: the run config moves the data root to {self.path('')}, but this run is tagged "
                f"{DATA_ROOT_TAG}={tagged_root}; run config may not change where a tokenmill_all run writes "
                "(set TOKENMILL_DATA where the code location starts)"
            )
        return None

    def missing_batch(self, run: dg.DagsterRun) -> str | None:
        """Why a tokenmill_all run may not start when it names no source batch, else None."""
        if run.job_name != WHOLE_GRAPH_JOB or run.tags.get(PARTITION_TAG) is not None:
            return None
        batches = ", ".join(read_registry(self.path("")).keys[-3:]) or "none yet: run `tokenmill update`"
        tags = json.dumps({PARTITION_TAG: "<batch>"})
        return (
            f"{WHOLE_GRAPH_JOB} runs one source batch (the latest: {batches}): choose it with `dg launch --job "
            f"{WHOLE_GRAPH_JOB} --partition <batch>`, `dagster job execute -m definitions -j {WHOLE_GRAPH_JOB} "
            f"--tags '{tags}'` or the UI's partition dialog, or run `tokenmill "
            "update`, which registers the new files and runs every pending batch"
        )

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._lock is not None:
            self._lock.release()


class Compute(dg.ConfigurableResource):
    """Where every stage runs its task lists: `local` (a process pool on the run's machine, the default) or `ray`
    (Ray tasks on the cluster at `ray_address`, each declaring `task_cpus` and `task_memory_mb`). Either way the
    outputs are byte-identical. Under Ray every node runs the same environment (tokenmill installed) and mounts the
    data root at the same path, or, with `ray_staging`, no node needs it: the tasks' files cross that object-storage
    prefix (docs/scale-out.md, 'Without a shared disk')."""

    engine: Literal["local", "ray"] = Field(
        default="local",
        description="local: process pool on this machine; "
        "ray: the Ray cluster at ray_address (env TOKENMILL_RAY_ADDRESS sets both)",
    )
    workers: int = Field(
        default=0,
        ge=0,
        description="local engine: worker processes per stage; 0: env TOKENMILL_WORKERS, else the usable cores",
    )
    ray_address: str = Field(
        default="",
        description="ray engine: 'auto' (this machine is a node), 'host:port' (the "
        "head's GCS port) or 'ray://host:port' (Ray client)",
    )
    task_cpus: float = Field(default=1.0, gt=0, description="ray engine: CPUs each task declares")
    task_memory_mb: int = Field(default=2048, ge=0, description="ray engine: memory each task declares (MiB)")
    max_retries: int = Field(
        default=3,
        ge=0,
        description="ray engine: re-runs of a task whose worker process or "
        "node died; past them the step fails naming itself",
    )
    ray_staging: str = Field(
        default="",
        description="ray engine without a shared disk: an object-storage prefix (s3://bucket/prefix) through which "
        "each task's input and output files cross between the run's data root and the nodes; empty: every node "
        "mounts the data root (env TOKENMILL_RAY_STAGING)",
    )
    # kept for the run: what one step staged, no later step stages again
    _stager: DataRootStager | None = PrivateAttr(default=None)

    @contextlib.contextmanager
    def activated(self, context: dg.AssetExecutionContext, data_root: DataRoot) -> Iterator[Usage]:
        """Runs the stage's task lists on this engine for the block; yields the Usage for the asset's metadata."""
        label, log = context.op_execution_context.op.name, context.log  # the asset key; a multi-asset's op name
        engine: LocalEngine | RayEngine
        if self.engine == "local":
            engine = LocalEngine(self.workers, label, log)
        else:
            if not self.ray_address:
                raise ConfigError(
                    "compute.ray_address: the ray engine needs the cluster's address ('auto', "
                    "'host:port' or 'ray://host:port'; env TOKENMILL_RAY_ADDRESS)"
                )
            if self.ray_staging and (self._stager is None or self._stager.root != str(data_root.path(""))):
                self._stager = DataRootStager(StagingArea(self.ray_staging), data_root.path(""))
            RayEngine.connect(self.ray_address)  # once per run: yield_for_execution disconnects
            engine = RayEngine(
                RayOptions(
                    address=self.ray_address,
                    task_cpus=self.task_cpus,
                    task_memory_mb=self.task_memory_mb,
                    max_retries=self.max_retries,
                ),
                str(data_root.path("")),
                label,
                log,
                self._stager,
            )
            staging = f", files staged through {self.ray_staging}" if self.ray_staging else ""
            log.info(
                f"ray engine: {engine.usage.nodes} nodes, {engine.usage.cpus:g} CPUs at {self.ray_address}{staging}"
            )
        with activated(engine) as usage:
            yield usage

    @contextlib.contextmanager
    def yield_for_execution(self, context: dg.InitResourceContext) -> Iterator[Compute]:
        """The engine lives as long as the run, whatever launched it. A run that computes locally starts its worker pool
        here, before its first step (the workers spawn and import while Dagster sets the step up: ready sooner than at
        the first task list; docs/profile.md, 'What changed in this round'), and shuts it down when the run ends, failed
        or refused at set-up included: otherwise the run process and its workers outlive the run. A Ray run disconnects
        at the end."""
        if self.engine == "local":
            with workers_kept(local_workers(self.workers)):
                yield self
        else:
            try:
                yield self
            finally:
                RayEngine.disconnect()


def source_from_env() -> CorpusSource:
    return CorpusSource(path=os.environ.get("TOKENMILL_SOURCE", str(DEFAULT_SOURCE)))


def data_root_of_run(run: dg.DagsterRun) -> DataRoot | None:
    """The DataRoot a run sets up: the code location's (its environment) with the run config's fields over it;
    None when the run config's fields are not valid (the run's own set-up says why)."""
    default = data_root_from_env()
    run_config: Mapping[str, Any] = run.run_config or {}
    config = ((run_config.get("resources") or {}).get("data_root") or {}).get("config") or {}
    try:
        return DataRoot(**{"root": default.root, "lock_wait_seconds": default.lock_wait_seconds, **config})
    except (TypeError, ValueError, dg.DagsterError):  # pydantic's ValidationError is a ValueError
        return None


def data_root_from_env() -> DataRoot:
    return DataRoot(
        root=os.environ.get("TOKENMILL_DATA", str(DEFAULT_DATA)),
        lock_wait_seconds=number_from_env("TOKENMILL_LOCK_WAIT", 0.0),
    )


def compute_from_env() -> Compute:
    """TOKENMILL_RAY_ADDRESS selects the ray engine (TOKENMILL_RAY_STAGING its staging prefix); TOKENMILL_WORKERS sizes
    the local one."""
    address = os.environ.get("TOKENMILL_RAY_ADDRESS", "")
    return Compute(
        engine="ray" if address else "local",
        ray_address=address,
        workers=number_from_env("TOKENMILL_WORKERS", 0, int),
        ray_staging=os.environ.get(STAGING_VARIABLE, ""),
    )
