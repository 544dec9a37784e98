"""Resources: where the corpus comes from and where every asset writes (both settable from the environment)."""
from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field, PrivateAttr

from tokenmill.common.io import recover_data_root
from tokenmill.common.lock import DataRootLock
from tokenmill.errors import SourceError
from tokenmill.settings import validate_run_settings

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO_ROOT / "demo_corpus" / "source"
DEFAULT_DATA = REPO_ROOT / "data"


class CorpusSource(dg.ConfigurableResource):
    """The input corpus: a file or a folder searched recursively (.jsonl, .json, .txt, .csv, and .gz of these)."""

    path: str = Field(description="File or folder to ingest; env TOKENMILL_SOURCE, default the bundled demo corpus")

    def resolved(self) -> Path:
        """The source path, or a clear error before any work starts."""
        p = Path(self.path).expanduser()
        if not p.exists():
            raise SourceError(f"TOKENMILL_SOURCE does not exist: {p} (set TOKENMILL_SOURCE to a file or folder)")
        return p.resolve()


class DataRoot(dg.ConfigurableResource):
    """The data root: every asset writes under <root>/<asset key>/.

    It is also the run's gate to that folder: set up once per run (every job runs in one process), it first
    validates every stage's settings in the run config, then takes the data root's lock for the whole run, so
    two runs on one data root never interleave (the second is refused, naming the holder, or waits)."""

    root: str = Field(description="Folder for all asset outputs; env TOKENMILL_DATA, default ./data in the repo")
    lock_wait_seconds: float = Field(default=0.0, ge=0.0,
                                     description="Wait this long for another run holding the data root "
                                                 "(env TOKENMILL_LOCK_WAIT), then fail naming it")
    _lock: DataRootLock | None = PrivateAttr(default=None)

    def path(self, asset_key: str) -> Path:
        return Path(self.root).expanduser().resolve() / asset_key

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run = context.run
        if run is None:  # built outside a run (tests calling an asset function directly)
            return
        validate_run_settings(run.run_config)
        self._lock = DataRootLock(self.path("")).acquire(run.run_id, wait_seconds=self.lock_wait_seconds)
        for action in recover_data_root(self.path("")):  # what an interrupted run left, now that no run is writing
            context.log.warning(f"recovered {self.path('')}: {action}")

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._lock is not None:
            self._lock.release()


def source_from_env() -> CorpusSource:
    return CorpusSource(path=os.environ.get("TOKENMILL_SOURCE", str(DEFAULT_SOURCE)))


def data_root_from_env() -> DataRoot:
    return DataRoot(root=os.environ.get("TOKENMILL_DATA", str(DEFAULT_DATA)),
                    lock_wait_seconds=float(os.environ.get("TOKENMILL_LOCK_WAIT", "0")))
