"""Source batches: which source files each batch holds, so a growing corpus is processed one batch at a time.

A batch is the set of ingestible files found new at one point (`tokenmill update`, or the run a sensor or schedule
tick requested, when it starts). The registry `<data root>/_batches.json` is the one record of them: the source
path, the generation and, per batch, its key, its files with size, mtime and a content hash, and whether it was
retired. Keys are `g<generation>-b<number>` (zero-padded, so sorting by name is arrival order); they are also the
Dagster dynamic partitions of the per-batch assets.

A file is told changed by its content: size, then (only when size or mtime moved) a BLAKE2b hash of its bytes, so a
`touch` changes nothing and a steady source costs one stat per file. An object of a source on object storage
(`s3://bucket/prefix/`) is registered by its URL with its size and ETag, from the listing alone: a new ETag is new
content (the store computes it from the bytes), so nothing is read to register it.

A file that changed or disappeared after its batch was published cannot be taken back out of the records, the dedup
index and the shards built from it: it waits for a full rebuild, which starts a new generation (`tokenmill update
--rebuild`), while new files go on.

A file the readers refuse (a FIFO, a socket, a symlink out of the source) or cannot open when its batch is registered
is listed with the batch's refused files and reported, with its reason, in the batch's `_rejected.jsonl`; it counts as
never read, so once it can be read (made readable, or replaced by a regular file) it comes in with a later batch.
A batch of refused files alone has nothing to read, and an empty batch would fail every stage after raw_records: it is
retired when registered, its refused files listed in its quarantine's `_rejected.jsonl`.

A batch that failed and never published can be retired (`tokenmill update --drop-batch KEY`, or the
retire_source_batch job): its partial outputs are removed (the raw records it rejected are kept in
`raw_records/_quarantine/<key>/`), later batches no longer count it, and its files stay out until they change: a
corrected file comes in as a new batch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from tokenmill.common.io import (
    REJECTED_FILE,
    REMOVED_FILE,
    atomic_write_json,
    atomic_write_text,
    dumps,
    gather_batch_files,
    read_json,
    remove_stage,
)
from tokenmill.common.remote import Location, RemoteLocation, same_location
from tokenmill.errors import CorruptOutputError, SourceChangedError, UnknownBatchError
from tokenmill.stages.raw.discover import examine
from tokenmill.stages.registry import per_batch_keys
from tokenmill_loader.format import manifest_path

REGISTRY_FILE = "_batches.json"
REGISTRY_LOCK = ".batches.lock"
PARTITIONS_NAME = "source_batch"  # the Dagster dynamic partitions definition of the per-batch assets
# Names the wiring gives batches' runs. Runs carry their data root, so the production instance's run queue admits one
# run per data root (deploy/dagster.yaml: tag_concurrency_limits with applyLimitPerUniqueValue). A sensor or
# schedule tick plans the next batch without writing anything (a previewed tick must not register it): its run
# carries the key in PLANNED_BATCH_TAG, and raw_records registers the batch when the run starts.
WHOLE_GRAPH_JOB = "tokenmill_all"
DATA_ROOT_TAG = "tokenmill/data_root"
SOURCE_TAG = "tokenmill/source"
PLANNED_BATCH_TAG = "tokenmill/planned_batch"
REBUILD_HINT = "run `tokenmill update --rebuild` to rebuild every asset from the source as it is now"
PER_BATCH_STAGES = per_batch_keys()
FUNNEL_FILE = Path("funnel_telemetry") / "funnel.json"  # lists the batches through the whole graph
QUARANTINE_DIR = Path("raw_records") / "_quarantine"  # a failed or retired batch's rejected raw records
HASH_BLOCK = 1 << 20


# the only form a batch key takes: it names a folder in every per-batch stage, so nothing else (`..`, `/`) may pass
BATCH_KEY_FORM = re.compile(r"g[0-9]+-b[0-9]+")


def batch_key(generation: int, number: int) -> str:
    return f"g{generation}-b{number:06d}"


def is_batch_key(key: str) -> bool:
    """Whether `key` has the form of the keys `batch_key` makes (`g<n>-b<n>`, ASCII digits only)."""
    return BATCH_KEY_FORM.fullmatch(key) is not None


def retire_hint(key: str) -> str:
    return f"retire it with `tokenmill update --drop-batch {key}` (or the retire_source_batch job)"


def content_hash(path: Path) -> str:
    """32 hex of BLAKE2b over the file's bytes (read block by block)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


@overload
def source_file(source: Path, rel: str) -> Path: ...
@overload
def source_file(source: RemoteLocation, rel: str) -> RemoteLocation: ...
def source_file(source: Location, rel: str) -> Location:
    """The file a `source_state` entry names (a source that is one file lists it by its name; an object by its
    URL)."""
    if isinstance(source, RemoteLocation):
        return RemoteLocation(rel)
    return source if source.is_file() else source / rel


@dataclass(kw_only=True)
class Batch:
    key: str
    files: dict[str, list]
    """{path relative to the source: [size, mtime_ns, content hash]} when the batch was registered (registries
    written before content hashes: [size, mtime_ns]); {object URL: [size, ETag]} for a source on object storage."""
    retired: str | None = None
    """Why the batch was retired (it never published; later batches do not count it), None while it counts."""
    refused: dict[str, list[str]] = field(default_factory=dict)
    """{path relative to the source: [reason, detail]}: files of the batch that were refused or could not be read
    when it was registered; raw_records rejects them whole, unopened, and a later batch takes each once readable."""


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@dataclass(kw_only=True)
class SourceChanges:
    """How the source's ingestible files differ from what the registry holds."""

    new: dict[str, list] = field(default_factory=dict)
    changed: list[tuple[str, str]] = field(default_factory=list)
    """(file, batch key) of registered files whose content changed (size, or content hash)."""
    removed: list[tuple[str, str]] = field(default_factory=list)
    """(file, batch key) of registered files no longer in the source."""
    touched: dict[str, list] = field(default_factory=dict)
    """{file: [size, mtime_ns, hash]} of registered files whose mtime moved with the same content."""

    def waiting(self) -> str | None:
        """One message naming the changed and removed files, their batches and what the user can do; None when
        there are none. New files are registered and run all the same."""
        if not (self.changed or self.removed):
            return None
        parts = []
        for verb, items in (("changed", self.changed), ("was removed", self.removed)):
            if items:
                shown = ", ".join(f"{f} (batch {b})" for f, b in items[:5])
                more = f" and {len(items) - 5} more" if len(items) > 5 else ""
                verb = "were removed" if verb == "was removed" and len(items) > 1 else verb
                parts.append(f"{_plural(len(items), 'file', 'files')} already ingested {verb}: {shown}{more}")
        return (
            f"{'; '.join(parts)}; waiting for your decision, new files are still registered: {REBUILD_HINT} (a "
            "batch that never published can be retired instead with `tokenmill update --drop-batch <batch>`, "
            "and its corrected files come in as a new batch)"
        )


@dataclass(kw_only=True)
class Registry:
    source: str | None = None
    generation: int = 0
    batches: list[Batch] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        """Every batch key, retired ones included (a key is never given twice)."""
        return [b.key for b in self.batches]

    @property
    def live_keys(self) -> list[str]:
        """The keys of the batches that count (not retired), in order."""
        return [b.key for b in self.batches if not b.retired]

    @property
    def next_key(self) -> str:
        return batch_key(self.generation or 1, len(self.batches) + 1)

    def batch(self, key: str) -> Batch:
        if not is_batch_key(key):
            raise KeyError(f"{key!r} is not a source batch key (g<generation>-b<number>, e.g. {batch_key(1, 1)})")
        for b in self.batches:
            if b.key == key:
                return b
        raise KeyError(f"no source batch {key!r} in {REGISTRY_FILE} (registered: {', '.join(self.keys) or 'none'})")

    def earlier(self, key: str) -> list[str]:
        """The batches that count registered before `key`, in order (retired ones left out)."""
        position = self.keys.index(self.batch(key).key)
        return [b.key for b in self.batches[:position] if not b.retired]

    def compare(self, source: Location, state: dict[str, list]) -> SourceChanges:
        """New, changed, removed and touched files of `state` (a `source_state`) against the registered batches.
        A file whose size and mtime are as registered is not read; one whose mtime alone moved is hashed. A file of
        a retired batch is new again once its content changed; one its batch refused or could not open, once it can
        be read."""
        if self.source is not None and not same_location(self.source, source):
            raise SourceChangedError(
                f"this data root was built from {self.source}, not {source}: point TOKENMILL_DATA at another "
                f"folder for another corpus, or {REBUILD_HINT}"
            )
        # file -> (batch key, entry), its latest batch; entry None: refused there
        registered: dict[str, tuple[str, list | None]] = {}
        retired: dict[str, tuple[str, list | None]] = {}
        for b in self.batches:
            held = retired if b.retired else registered
            held.update({f: (b.key, None) for f in b.refused})
            held.update({f: (b.key, meta) for f, meta in b.files.items()})
        changes = SourceChanges()
        for f, now in state.items():
            key, meta = registered.get(f) or retired.get(f) or (None, None)
            if key is None:
                changes.new[f] = now
            elif meta is None:  # never read: new once it can be read
                if _readable(source, f):
                    changes.new[f] = now
            elif f not in registered and _content(source, f, meta, now) is None:
                changes.new[f] = now
        for f, (key, meta) in sorted(registered.items()):
            if meta is None:
                continue
            if f not in state:
                changes.removed.append((f, key))
            elif meta[:2] != state[f]:
                if (same := _content(source, f, meta, state[f])) is None:
                    changes.changed.append((f, key))
                else:
                    changes.touched[f] = same
        return changes


def refusal(source: Location, rel: str) -> list[str] | None:
    """[reason, detail] when the readers refuse the file without opening it (`examine`; a symlink out of the source
    is refused here whatever raw_records' follow_outside_symlinks says: registering never reads outside the
    source), None when it is a regular file inside the source, or an object (there is nothing else in a store)."""
    if isinstance(source, RemoteLocation):
        return None
    root = os.path.realpath(source) if source.is_dir() else None
    found = examine(rel, str(source_file(source, rel)), root, follow_outside_symlinks=False)
    return [found.refused, found.detail] if found.refused else None


def _readable(source: Location, rel: str) -> bool:
    """Whether a file registered as refused or unreadable can be read now (a regular file that opens)."""
    if isinstance(source, RemoteLocation):  # never refused when registered
        return True
    if refusal(source, rel) is not None:
        return False
    try:
        content_hash(source_file(source, rel))
    except OSError:
        return False
    return True


def _content(source: Location, rel: str, registered: list, now: list) -> list | None:
    """The file's entry ([size, mtime_ns, hash]) when its content is the registered one, else None. Hashed only
    when the mtime moved; an entry without a hash (an older registry, an object: [size, ETag]) cannot be told
    apart, so it changed."""
    if registered[:2] == now:
        return list(registered)
    if registered[0] != now[0] or len(registered) < 3 or isinstance(source, RemoteLocation):
        return None
    try:
        digest = content_hash(source_file(source, rel))
    except OSError:  # gone since it was listed: the next look says removed
        return None
    return [*now, digest] if digest == registered[2] else None


def read_registry(data_root: Path) -> Registry:
    path = Path(data_root) / REGISTRY_FILE
    if not path.exists():
        return Registry()
    try:
        raw = read_json(path)
        batches = [
            Batch(key=b["key"], files=b["files"], retired=b.get("retired"), refused=b.get("refused", {}))
            for b in raw["batches"]
        ]
        registry = Registry(source=raw["source"], generation=raw["generation"], batches=batches)
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
            "batches": [
                {
                    "key": b.key,
                    "files": b.files,
                    **({"retired": b.retired} if b.retired else {}),
                    **({"refused": b.refused} if b.refused else {}),
                }
                for b in registry.batches
            ],
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


def new_batch(key: str, source: Location, files: dict[str, list]) -> Batch:
    """Batch `key` of `files` (a `source_state`'s entries), each with its content hash, sorted by path; a file the
    readers refuse, or one that cannot be opened, goes to the batch's refused files with its reason instead, and a
    batch of refused files alone is retired (nothing to read). A file gone since it was listed keeps [size,
    mtime_ns] (its run then names it missing). Objects keep their [size, ETag], nothing read."""
    if isinstance(source, RemoteLocation):
        return Batch(key=key, files={f: list(meta) for f, meta in sorted(files.items())})
    entries, refused = {}, {}
    for f, meta in sorted(files.items()):
        if (why := refusal(source, f)) is not None:
            refused[f] = why
            continue
        try:
            entries[f] = [*meta[:2], content_hash(source_file(source, f))]
        except FileNotFoundError:
            entries[f] = list(meta[:2])
        except OSError as e:  # chmod 000, an I/O error: not read now, tried again by a later batch
            refused[f] = [
                "unreadable_file",
                f"could not be opened when batch {key} was registered ({type(e).__name__}: {e.strerror or e}); a later "
                "batch reads it once it can be opened",
            ]
    batch = Batch(key=key, files=entries, refused=refused)
    if refused and not entries:
        shown = ", ".join(f"{f} ({why[0]})" for f, why in list(refused.items())[:5])
        more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
        batch.retired = (
            f"retired when registered: nothing to read, its {_plural(len(refused), 'file was', 'files were')} "
            f"refused: {shown}{more}; each comes in with a later batch once it can be read"
        )
    return batch


def _list_refused(data_root: Path, batch: Batch) -> None:
    """The refused files of a batch retired when registered, in its quarantine's `_rejected.jsonl` as raw_records
    lists refused files (raw_records never runs for a retired batch)."""
    held = quarantine(data_root, batch.key)
    held.mkdir(parents=True, exist_ok=True)
    entries = [
        dumps({"path": f, "line": None, "reason": why[0], "detail": why[1], "snippet": ""}) + "\n"
        for f, why in sorted(batch.refused.items())
    ]
    atomic_write_text(held / REJECTED_FILE, "".join(entries))


def register_new_files(
    data_root: Path, source: Location, state: dict[str, list], key: str | None = None
) -> tuple[str | None, SourceChanges]:
    """Registers the files of `state` not yet in a batch as the next batch; returns its key (None: nothing new)
    and the changes found. Changed and removed files are left waiting (`SourceChanges.waiting`); touched ones get
    their new mtime. With `key` (the batch a sensor tick planned, registered when its run starts): that batch,
    already registered or registered now as the next one; UnknownBatchError when it is neither.

    Raises SourceChangedError when the data root was built from another source."""
    with _registry_lock(data_root):
        registry = read_registry(data_root)
        if key is not None and key in registry.keys:
            return key, SourceChanges()
        changes = registry.compare(source, state)
        if key is not None and (key != registry.next_key or not changes.new):
            why = f"the next batch is {registry.next_key}" if key != registry.next_key else "no file is new now"
            raise UnknownBatchError(f"batch {key} was planned by a sensor or schedule tick, but {why}")
        if not (changes.new or changes.touched):
            return None, changes
        if registry.source is None:
            registry = Registry(source=str(source), generation=1)
        for batch in registry.batches:
            if not batch.retired:
                batch.files.update({f: meta for f, meta in changes.touched.items() if f in batch.files})
        new_key = None
        if changes.new:
            new_key = registry.next_key
            registry.batches.append(new_batch(new_key, source, changes.new))
            if registry.batches[-1].retired:
                _list_refused(data_root, registry.batches[-1])
        _write(data_root, registry)
        return new_key, changes


def start_generation(data_root: Path, source: Location, state: dict[str, list], after: int = 0) -> str:
    """A full rebuild: the next generation (past the registry's and `after`, the latest one other outputs name),
    whose first batch holds every file of `state`; returns its key. A damaged registry is replaced."""
    with _registry_lock(data_root):
        try:
            previous = read_registry(data_root).generation
        except CorruptOutputError:
            previous = 0
        registry = Registry(source=str(source), generation=max(previous, after) + 1)
        key = batch_key(registry.generation, 1)
        registry.batches.append(new_batch(key, source, state))
        if registry.batches[-1].retired:
            _list_refused(data_root, registry.batches[-1])
        _write(data_root, registry)
        return key


def published_batches(data_root: Path) -> list[str]:
    """The batches in the dataset readers open (tokenized_bins' latest train manifest)."""
    manifest = manifest_path(Path(data_root) / "tokenized_bins" / "train")  # the version current.json names
    return list(read_json(manifest).get("batches", [])) if manifest.exists() else []


def quarantine(data_root: Path, key: str) -> Path:
    """`raw_records/_quarantine/<key>/`: where the rejected raw records of a failed or retired batch stay."""
    return Path(data_root) / QUARANTINE_DIR / key


def retire_batch(data_root: Path, key: str, reason: str) -> list[str]:
    """Retires batch `key`, which never published (hold the data root's lock): marked in the registry, its
    per-batch outputs removed (the raw records it rejected kept in its quarantine) and the stages' gathered
    rejected/removed lists made again without it; returns what was removed. UnknownBatchError when there is no
    such batch or it is in the published dataset (its records are in the shards: only a rebuild takes them out)."""
    data_root = Path(data_root)
    with _registry_lock(data_root):
        registry = read_registry(data_root)
        try:
            batch = registry.batch(key)
        except KeyError as e:
            raise UnknownBatchError(e.args[0]) from None
        if key in published_batches(data_root):
            raise UnknownBatchError(f"batch {key} is in the published dataset, it cannot be retired; {REBUILD_HINT}")
        rejected = data_root / "raw_records" / key / REJECTED_FILE
        if rejected.exists() and not quarantine(data_root, key).exists():
            quarantine(data_root, key).mkdir(parents=True)
            shutil.copyfile(rejected, quarantine(data_root, key) / REJECTED_FILE)
        if not batch.retired:
            batch.retired = reason
            _write(data_root, registry)
    removed = []  # again on a second call: an interrupted retirement finishes
    for stage in PER_BATCH_STAGES:
        if (data_root / stage / key).exists():
            removed.append(f"{stage}/{key}")
        remove_stage(data_root / stage / key)
        for gathered in (REJECTED_FILE, REMOVED_FILE):
            if (data_root / stage / gathered).exists():
                gather_batch_files(data_root / stage, gathered)
    return removed


def pending_batches(data_root: Path) -> list[str]:
    """Registered batches, in order, that the funnel does not list yet (not yet through the whole graph)."""
    registry = read_registry(data_root)
    funnel_path = Path(data_root) / FUNNEL_FILE
    done = set()
    if funnel_path.exists():
        funnel = read_json(funnel_path)
        if funnel.get("generation") == registry.generation:
            done = {b["batch"] for b in funnel.get("batches", [])}
    return [k for k in registry.live_keys if k not in done]
