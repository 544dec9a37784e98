"""Resources: where the corpus comes from and where every asset writes (both settable from the environment)."""
from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

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
            raise FileNotFoundError(f"TOKENMILL_SOURCE does not exist: {p} (set TOKENMILL_SOURCE to a file or folder)")
        return p.resolve()


class DataRoot(dg.ConfigurableResource):
    """The data root: every asset writes under <root>/<asset key>/."""

    root: str = Field(description="Folder for all asset outputs; env TOKENMILL_DATA, default ./data in the repo")

    def path(self, asset_key: str) -> Path:
        return Path(self.root).expanduser().resolve() / asset_key


def source_from_env() -> CorpusSource:
    return CorpusSource(path=os.environ.get("TOKENMILL_SOURCE", str(DEFAULT_SOURCE)))


def data_root_from_env() -> DataRoot:
    return DataRoot(root=os.environ.get("TOKENMILL_DATA", str(DEFAULT_DATA)))
