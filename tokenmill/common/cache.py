"""tokenmill's cache folder (TOKENMILL_CACHE, else ~/.cache/tokenmill): things rebuilt from installed packages when
absent (Unicode tables, an unpacked language model), never data. Losing it costs time only."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokenmill.common.io import temporary_path


def cache_folder() -> Path:
    """The cache folder's path (not created)."""
    return Path(os.environ.get("TOKENMILL_CACHE") or Path.home() / ".cache" / "tokenmill")


def cached_arrays(name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays of `build()`, kept in the cache as one .npy file each under the folder `name` (a name that changes
    with whatever the arrays are built from) and memory-mapped read-only from there: every process that reads them
    shares one copy in the page cache. Written to a temporary folder and renamed, so a reader sees all files or none;
    without a usable cache folder the arrays are built in memory each time."""
    folder = cache_folder() / name
    try:
        return {path.stem: np.load(path, mmap_mode="r") for path in sorted(folder.glob("*.npy"))} or _written(
            folder, build()
        )
    except (OSError, ValueError):  # a cache folder that cannot be read or written: build in memory
        return build()


def _written(folder: Path, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    staged = temporary_path(folder)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    try:
        for key, arr in arrays.items():
            np.save(staged / f"{key}.npy", arr)
        os.rename(staged, folder)
    except OSError:
        if not folder.is_dir():  # another process renamed its copy first: that one is as good
            raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return {key: np.load(folder / f"{key}.npy", mmap_mode="r") for key in arrays}
