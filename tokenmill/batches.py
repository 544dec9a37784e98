"""Source batches: which source files each batch holds, so a growing corpus is processed one batch at a time.

A batch is the set of ingestible files found new at one point (`tokenmill update`, the sensor, the schedule). The
registry `<data root>/_batches.json` is the one record of them: the source path, the generation and, per batch,
its key and its files with size and mtime. Keys are `g<generation>-b<number>` (zero-padded, so sorting by name is
arrival order); they are also the Dagster dynamic partitions of the per-batch assets.

Files only ever join a batch. A file that changed or disappeared after its batch was registered cannot be taken
back out of the records, the dedup index and the shards built from it: that needs a full rebuild, which starts a
new generation (`tokenmill update --rebuild`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokenmill.common.io import atomic_write_json, read_json
from tokenmill.errors import CorruptOutputError, SourceChangedError

REGISTRY_FILE = "_batches.json"
REGISTRY_LOCK = ".batches.lock"
PARTITIONS_NAME = "source_batch"  # the Dagster dynamic partitions definition of the per-batch assets
REBUILD_HINT = "run `tokenmill update --rebuild` to rebuild every asset from the source as it is now"


# the only form a batch key takes: it names a folder in every per-batch stage, so nothing else (`..`, `/`) may pass
BATCH_KEY_FORM = re.compile(r"g[0-9]+-b[0-9]+")


def batch_key(generation: int, number: int) -> str:
    return f"g{generation}-b{number:06d}"


def is_batch_key(key: str) -> bool:
    """Whether `key` has the form of the keys `batch_key` makes (`g<n>-b<n>`, ASCII digits only)."""
    return BATCH_KEY_FORM.fullmatch(key) is not None


@dataclass
class Batch:
    key: str
    files: dict[str, list[int]]
    """{path relative to the source: [size, mtime_ns]} when the batch was registered."""


@dataclass
class SourceChanges:
    """How the source's ingestible files differ from what the registry holds."""

    new: dict[str, list[int]] = field(default_factory=dict)
    changed: list[tuple[str, str]] = field(default_factory=list)
    """(file, batch key) of registered files whose size or mtime changed."""
    removed: list[tuple[str, str]] = field(default_factory=list)
    """(file, batch key) of registered files no longer in the source."""

    def problem(self) -> str | None:
        """One message naming the changed and removed files and their batches, None when there are none."""
        if not (self.changed or self.removed):
            return None
        parts = []
        for what, items in (("changed", self.changed), ("removed", self.removed)):
            if items:
                shown = ", ".join(f"{f} (batch {b})" for f, b in items[:5])
                more = f" and {len(items) - 5} more" if len(items) > 5 else ""
                parts.append(f"{len(items)} {what}: {shown}{more}")
        return f"source files already ingested were {'; '.join(parts)}; {REBUILD_HINT}"


@dataclass
class Registry:
    source: str | None = None
    generation: int = 0
    batches: list[Batch] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return [b.key for b in self.batches]

    def batch(self, key: str) -> Batch:
        if not is_batch_key(key):
            raise KeyError(f"{key!r} is not a source batch key (g<generation>-b<number>, e.g. {batch_key(1, 1)})")
        for b in self.batches:
            if b.key == key:
                return b
        raise KeyError(f"no source batch {key!r} in {REGISTRY_FILE} (registered: {', '.join(self.keys) or 'none'})")

    def earlier(self, key: str) -> list[str]:
        """The keys registered before `key`, in order."""
        return self.keys[: self.keys.index(self.batch(key).key)]

    def compare(self, source: Path, state: dict[str, list[int]]) -> SourceChanges:
        """New, changed and removed files of `state` (a `source_state`) against the registered batches."""
        if self.source is not None and Path(self.source) != Path(source):
            raise SourceChangedError(
                f"this data root was built from {self.source}, not {source}: point TOKENMILL_DATA at another "
                f"folder for another corpus, or {REBUILD_HINT}"
            )
        registered = {f: (b.key, meta) for b in self.batches for f, meta in b.files.items()}
        changes = SourceChanges(new={f: meta for f, meta in state.items() if f not in registered})
        for f, (key, meta) in sorted(registered.items()):
            if f not in state:
                changes.removed.append((f, key))
            elif state[f] != meta:
                changes.changed.append((f, key))
        return changes


def read_registry(data_root: Path) -> Registry:
    path = Path(data_root) / REGISTRY_FILE
    if not path.exists():
        return Registry()
    try:
        raw = read_json(path)
        registry = Registry(raw["source"], raw["generation"], [Batch(b["key"], b["files"]) for b in raw["batches"]])
        if bad := [b.key for b in registry.batches if not isinstance(b.key, str) or not is_batch_key(b.key)]:
            raise ValueError(f"batch keys not of the form g<generation>-b<number>: {bad[:3]}")
        return registry
    except (ValueError, KeyError, TypeError) as e:  # written atomically by tokenmill: edited or damaged by hand
        raise CorruptOutputError(
            f"{path}: not a source batch registry ({type(e).__name__}: {e}); restore it, or {REBUILD_HINT}"
        ) from None


def _write(data_root: Path, registry: Registry) -> None:
    atomic_write_json(
        Path(data_root) / REGISTRY_FILE,
        {
            "source": registry.source,
            "generation": registry.generation,
            "batches": [{"key": b.key, "files": b.files} for b in registry.batches],
        },
    )


@contextlib.contextmanager
def _registry_lock(data_root: Path):
    """Serializes registry updates (update, sensor and schedule may look for new files at the same time)."""
    Path(data_root).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(data_root) / REGISTRY_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def register_new_files(data_root: Path, source: Path, state: dict[str, list[int]]) -> str | None:
    """Registers the files of `state` not yet in a batch as the next batch; returns its key (None: nothing new).

    Raises SourceChangedError naming the files when registered files changed or were removed, or when the data
    root was built from another source."""
    with _registry_lock(data_root):
        registry = read_registry(data_root)
        changes = registry.compare(source, state)
        if problem := changes.problem():
            raise SourceChangedError(problem)
        if not changes.new:
            return None
        if registry.source is None:
            registry = Registry(str(source), 1)
        key = batch_key(registry.generation, len(registry.batches) + 1)
        registry.batches.append(Batch(key, dict(sorted(changes.new.items()))))
        _write(data_root, registry)
        return key


def start_generation(data_root: Path, source: Path, state: dict[str, list[int]], after: int = 0) -> str:
    """A full rebuild: the next generation (past the registry's and `after`, the latest one other outputs name),
    whose first batch holds every file of `state`; returns its key. A damaged registry is replaced."""
    with _registry_lock(data_root):
        try:
            previous = read_registry(data_root).generation
        except CorruptOutputError:
            previous = 0
        registry = Registry(str(source), max(previous, after) + 1)
        key = batch_key(registry.generation, 1)
        registry.batches.append(Batch(key, dict(sorted(state.items()))))
        _write(data_root, registry)
        return key
