"""The way in from outside the project folder: the `tokenmill` console script and the instance's run launcher.

The Dagster wiring (definitions.py, cli.py, assets/, resources/, ...) is not installed: it is loaded from the project
folder, as workspace.yaml loads it for the UI, so that `pip install` puts only `tokenmill` and `tokenmill_loader` in
site-packages. Two entries are reached before any code location: the console script, and the run launcher that
dagster.yaml names, which every Dagster process (`dagster dev`, the daemon, `dagster instance migrate`) imports when
it loads the instance. dagster.yaml names it as `tokenmill.launch`, class `DataRootRunLauncher`, and this module
hands over resources/run_launcher.py's class. This is the one module of the library that loads the wiring, and it
does so by name at run time."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

PROJECT_ENV = "TOKENMILL_PROJECT"
PROJECT_MARKERS = ("definitions.py", "cli.py", "workspace.yaml")
# the classes dagster.yaml names in this module, and the project module that defines each
INSTANCE_PLUGINS = {"DataRootRunLauncher": "resources.run_launcher"}


def is_project(folder: Path) -> bool:
    return all((folder / marker).is_file() for marker in PROJECT_MARKERS)


def find_project(start: Path | None = None) -> Path:
    """$TOKENMILL_PROJECT; else the folder holding this package (a source checkout or an editable install); else
    the current folder or the nearest one above it holding the project's files. Raises SystemExit with one line."""
    if PROJECT_ENV in os.environ:
        folder = Path(os.environ[PROJECT_ENV]).expanduser().resolve()
        if not is_project(folder):
            raise SystemExit(f"tokenmill: {PROJECT_ENV}={folder} holds no {', '.join(PROJECT_MARKERS)}")
        return folder
    beside_package = Path(__file__).resolve().parent.parent
    if is_project(beside_package):
        return beside_package
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if is_project(folder):
            return folder
    raise SystemExit(
        f"tokenmill: no project folder found ({', '.join(PROJECT_MARKERS)}) above {here} or beside the installed "
        f"package: run it from the project folder, or set {PROJECT_ENV}"
    )


def load_from_project(module: str) -> Any:
    project = str(find_project())
    if project not in sys.path:
        sys.path.insert(0, project)
    return importlib.import_module(module)


def __getattr__(name: str) -> Any:
    """`tokenmill.launch.DataRootRunLauncher`, as Dagster's instance loads it (module attribute, PEP 562)."""
    if name in INSTANCE_PLUGINS:
        return getattr(load_from_project(INSTANCE_PLUGINS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> int:
    return load_from_project("cli").main()


if __name__ == "__main__":
    sys.exit(main())
