"""The `tokenmill` console script. The Dagster wiring (definitions.py, cli.py, assets/, resources/, ...) is not
installed: it is loaded from the project folder, as workspace.yaml loads it for the UI, so that `pip install`
puts only `tokenmill` and `tokenmill_loader` in site-packages. This is the one module of the library that loads
the wiring, and it does so by name at run time."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

PROJECT_ENV = "TOKENMILL_PROJECT"
PROJECT_MARKERS = ("definitions.py", "cli.py", "workspace.yaml")


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


def main() -> int:
    project = str(find_project())
    if project not in sys.path:
        sys.path.insert(0, project)
    cli = importlib.import_module("cli")
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
