"""Ray tasks on nodes that share no disk with the run: the files a task reads and writes cross a prefix on object
storage (the staging prefix, `compute.ray_staging` / TOKENMILL_RAY_STAGING) instead of a shared data root.

The data root stays a local folder of the run's machine (its lock, its renames and Dagster's view of it are what
they are without Ray). Around each task:

- the run process (`DataRootStager.inputs`) lists the files under every data-root path the task names (a folder:
  everything in it; a file: it, and its siblings named `<file>.<suffix>`, for tasks that name a file stem) and
  uploads those the prefix does not hold yet. Objects are named by the SHA-256 of their bytes, so a file renamed
  or copied is never uploaded twice, and a record of path -> (size, mtime_ns, digest) keeps each unchanged file
  from being read again;
- the node (`run_staged`) builds a private folder for the task, fills it from a node-local cache of the objects
  (TOKENMILL_NODE_CACHE, else the node's temp folder; each object downloaded once per node), runs the task with its
  paths moved from the data root to that folder, uploads what the task wrote or changed, and returns the list of
  it (and of what it removed) with the result, whose paths are moved back;
- the run process (`DataRootStager.publish`) writes those files into the data root before it takes the result, so
  results and files arrive in task order, as on a shared disk.

Every download lands under a temporary name renamed into place once its digest is checked; credentials come from
the standard AWS variables (tokenmill.common.remote) and are masked in every message."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, TypeVar

from tokenmill.common.io import file_sha256
from tokenmill.common.remote import Retries, filesystem, is_url, mask_secrets
from tokenmill.errors import ComputeError, ConfigError

T = TypeVar("T")
R = TypeVar("R")

STAGING_VARIABLE = "TOKENMILL_RAY_STAGING"
NODE_CACHE_VARIABLE = "TOKENMILL_NODE_CACHE"
OBJECTS = "objects"  # <prefix>/objects/<sha256>: content-addressed, shared by every run and data root
TASKS = "tasks"  # <node cache>/tasks/<id>: one task's private copy of the data-root paths it names


@dataclass(frozen=True, kw_only=True)
class StagedFile:
    rel: str
    """Path under the data root (POSIX)."""
    digest: str
    """SHA-256 of its bytes: its object under the staging prefix."""
    size: int
    mtime_ns: int


@dataclass(frozen=True, kw_only=True)
class TaskFiles:
    """What a task finds in its folder (sent with it), or what it changed there (returned with its result)."""

    files: tuple[StagedFile, ...] = ()
    """Sent: every file the task may read. Returned: the files it wrote or changed."""
    folders: tuple[str, ...] = ()
    """Sent: the folders that exist. Returned: the folders it made."""
    removed: tuple[str, ...] = ()
    """Returned: the files it removed."""
    removed_folders: tuple[str, ...] = ()
    """Returned: the folders it removed."""


@dataclass(kw_only=True)
class Traffic:
    """Bytes through the staging prefix: PUT (up) and GET (down), by the run process and the nodes together."""

    up: int = 0
    down: int = 0

    def add(self, other: Traffic) -> None:
        self.up += other.up
        self.down += other.down


@dataclass(frozen=True)
class StagingArea:
    """The staging prefix (`s3://bucket/prefix`, any fsspec URL): objects put and got by digest, transient errors
    retried with backoff (remote.Retries), every other error one line naming the object, credentials masked."""

    url: str

    def __post_init__(self) -> None:
        if not is_url(self.url):
            raise ConfigError(
                f"compute.ray_staging {self.url!r}: an object-storage prefix (s3://bucket/prefix), not a local path "
                "(a folder every node mounts is a shared data root: leave ray_staging empty)"
            )
        if "@" in self.url.split("://", 1)[1].split("/", 1)[0]:
            raise ConfigError(
                f"compute.ray_staging {mask_secrets(self.url)}: credentials in the URL are not accepted; set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) on the run's machine and every node"
            )

    def object_url(self, digest: str) -> str:
        return f"{self.url.rstrip('/')}/{OBJECTS}/{digest}"

    def digests(self, retries: Retries) -> set[str]:
        """The digests of the objects already under the prefix (from an earlier step, run or node)."""
        fs, path = filesystem(self.url.rstrip("/") + f"/{OBJECTS}/", own_retries=True)
        fs.invalidate_cache()
        try:
            keys = self._call(retries, lambda: fs.find(path), self.url)
        except FileNotFoundError:
            return set()
        return {key.rsplit("/", 1)[-1] for key in keys}

    def put(self, path: Path, digest: str, retries: Retries) -> None:
        url = self.object_url(digest)
        fs, key = filesystem(url, own_retries=True)
        self._call(retries, lambda: fs.put_file(str(path), key), url)

    def get(self, digest: str, dest: Path, retries: Retries) -> None:
        """The object into `dest`, whole or not at all: downloaded beside it under a hidden name, its digest
        checked, then renamed over it."""
        url = self.object_url(digest)
        fs, key = filesystem(url, own_retries=True)
        partial = dest.with_name(f".{dest.name}.staging-{uuid.uuid4().hex[:8]}")
        try:
            try:
                self._call(retries, lambda: fs.get_file(key, str(partial)), url)
            except FileNotFoundError:
                raise ComputeError(
                    f"{url}: no such object: the staging prefix was emptied or expired during the run; rerun"
                ) from None
            if (got := file_sha256(partial)) != digest:
                raise ComputeError(f"{url}: its bytes hash to {got}, not to its name (a corrupt or replaced object)")
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)

    @staticmethod
    def _call(retries: Retries, operation: Callable[[], T], url: str) -> T:
        try:
            return retries.call(operation, what=url)
        except FileNotFoundError:
            raise
        except OSError as error:
            raise ComputeError(mask_secrets(f"staging {url}: {type(error).__name__}: {error}")) from None


def _rebuilt(value: Any, move: Callable[[str], str]) -> Any:
    """`value` with `move` applied to every string and path in it (through tuples, lists, sets, dicts, dataclasses
    and partials); anything unchanged is returned as the same object."""
    if isinstance(value, str):
        return move(value)
    if isinstance(value, PurePath):
        text = str(value)
        moved = move(text)
        return value if moved == text else type(value)(moved)
    if isinstance(value, tuple | list | set | frozenset):
        items = [_rebuilt(v, move) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        kind: Any = type(value)
        return kind(*items) if hasattr(value, "_fields") else kind(items)  # a NamedTuple takes fields as arguments
    if type(value) is dict:
        pairs = [(_rebuilt(k, move), _rebuilt(v, move)) for k, v in value.items()]
        if all(k is a and v is b for (k, v), (a, b) in zip(pairs, value.items())):
            return value
        return dict(pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        changed = {name: new for name, old in fields.items() if (new := _rebuilt(old, move)) is not old}
        return dataclasses.replace(value, **changed) if changed else value
    if isinstance(value, functools.partial):
        args, keywords = _rebuilt(value.args, move), _rebuilt(value.keywords, move)
        if args is value.args and keywords is value.keywords:
            return value
        return functools.partial(value.func, *args, **keywords)
    return value


def _under(text: str, root: str) -> bool:
    return text == root or text.startswith(root + "/")


def rebased(value: T, old_root: str, new_root: str) -> T:
    """`value` with every path under `old_root` moved under `new_root`."""
    return _rebuilt(value, lambda text: new_root + text[len(old_root) :] if _under(text, old_root) else text)


def named_paths(value: Any, root: str) -> set[str]:
    """The paths under `root` that `value` (a task, its function) names."""
    found: set[str] = set()

    def note(text: str) -> str:
        if _under(text, root):
            found.add(text)
        return text

    _rebuilt(value, note)
    return found


def _rel(path: str, root: str) -> str:
    return path[len(root) :].lstrip("/")


class DataRootStager:
    """The run process's side: the data root's files staged for the tasks that name them, and the tasks' outputs
    published into it. One per run (its records save re-reading and re-uploading what an earlier step staged)."""

    def __init__(self, area: StagingArea, root: Path, retries: Retries | None = None):
        self.area, self.root = area, str(root)
        self.retries = retries or Retries()
        self.traffic = Traffic()
        self._known: dict[str, tuple[int, int, str]] = {}  # rel -> size, mtime_ns, digest when last staged or published
        self._stored: set[str] | None = None  # digests under the prefix (listed once, then kept up to date)

    def inputs(self, paths: Iterable[str]) -> TaskFiles:
        """The files and folders under `paths` (paths under the data root), each file's object uploaded when the
        prefix does not hold it yet."""
        files: dict[str, StagedFile] = {}
        folders: set[str] = set()
        for path in sorted(set(paths)):
            if os.path.isdir(path):
                for folder, subfolders, names in os.walk(path, followlinks=True):
                    subfolders.sort()
                    folders.add(_rel(folder, self.root))
                    for name in sorted(names):
                        self._add(os.path.join(folder, name), files)
            else:
                parent, stem = os.path.split(path)
                if not os.path.isdir(parent):
                    continue
                folders.add(_rel(parent, self.root))
                for name in sorted(os.listdir(parent)):  # the file, or the files of a stem (`<stem>.<suffix>`)
                    if name == stem or name.startswith(stem + "."):
                        self._add(os.path.join(parent, name), files)
        folders.discard("")
        return TaskFiles(files=tuple(files[rel] for rel in sorted(files)), folders=tuple(sorted(folders)))

    def _add(self, path: str, files: dict[str, StagedFile]) -> None:
        if not os.path.isfile(path):
            return
        rel = _rel(path, self.root)
        stat = os.stat(path)
        known = self._known.get(rel)
        if known is not None and known[:2] == (stat.st_size, stat.st_mtime_ns):
            digest = known[2]
        else:
            digest = file_sha256(Path(path))
            if digest not in self._stored_digests():
                self.area.put(Path(path), digest, self.retries)
                self.traffic.up += stat.st_size
                self._stored_digests().add(digest)
            self._known[rel] = (stat.st_size, stat.st_mtime_ns, digest)
        files[rel] = StagedFile(rel=rel, digest=digest, size=stat.st_size, mtime_ns=stat.st_mtime_ns)

    def _stored_digests(self) -> set[str]:
        if self._stored is None:
            self._stored = self.area.digests(self.retries)
        return self._stored

    def publish(self, outputs: TaskFiles) -> None:
        """What a task changed, applied to the data root: its folders made, its files downloaded (each whole or not
        at all, with the task's time), what it removed removed (a folder only once empty)."""
        root = Path(self.root)
        named = [*outputs.folders, *(f.rel for f in outputs.files), *outputs.removed, *outputs.removed_folders]
        if outside := [rel for rel in named if PurePath(rel).is_absolute() or ".." in PurePath(rel).parts]:
            raise ComputeError(f"a staged task named paths outside the data root {root}: {sorted(outside)[:5]}")
        for rel in outputs.folders:
            (root / rel).mkdir(parents=True, exist_ok=True)
        for staged in outputs.files:
            dest = root / staged.rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.area.get(staged.digest, dest, self.retries)
            self.traffic.down += staged.size
            os.utime(dest, ns=(staged.mtime_ns, staged.mtime_ns))
            self._known[staged.rel] = (staged.size, staged.mtime_ns, staged.digest)
            self._stored_digests().add(staged.digest)
        for rel in outputs.removed:
            (root / rel).unlink(missing_ok=True)
            self._known.pop(rel, None)
        for rel in sorted(outputs.removed_folders, reverse=True):  # the deepest first
            with contextlib.suppress(OSError):  # not empty: it holds files this task never saw
                (root / rel).rmdir()


def node_cache() -> Path:
    """This node's folder for staged objects and task folders: TOKENMILL_NODE_CACHE, else the temp folder's."""
    return Path(os.environ.get(NODE_CACHE_VARIABLE) or Path(tempfile.gettempdir()) / "tokenmill-node-cache")


def run_staged(
    fn: Callable[[T], R], task: T, *, data_root: str, area: StagingArea, inputs: TaskFiles, cache: Path
) -> tuple[R, TaskFiles, Traffic]:
    """On a node: fn(task) in a private folder standing for the data root, filled with `inputs` from the staging
    prefix; returns its result (paths moved back under `data_root`), what it changed (uploaded) and the bytes moved."""
    retries, traffic = Retries(), Traffic()
    (cache / TASKS).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="task-", dir=cache / TASKS))
    try:
        placed = _pull(area, inputs, folder, cache / OBJECTS, retries, traffic)
        moved_fn, moved_task = rebased((fn, task), data_root, str(folder))
        try:
            result = moved_fn(moved_task)
        except Exception as error:  # its message names the data root's paths, as on a shared disk
            _moved_back(error, str(folder), data_root)
            raise
        outputs = _push(area, inputs, placed, folder, cache / OBJECTS, retries, traffic)
        return rebased(result, str(folder), data_root), outputs, traffic
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _moved_back(error: Exception, folder: str, data_root: str) -> None:
    error.args = rebased(error.args, folder, data_root)
    if isinstance(error, OSError):
        error.filename, error.filename2 = rebased((error.filename, error.filename2), folder, data_root)


def _pull(
    area: StagingArea, inputs: TaskFiles, folder: Path, objects: Path, retries: Retries, traffic: Traffic
) -> dict[str, tuple[int, int]]:
    """The task's folder filled in: each file copied from the node's object cache (downloaded there first when
    missing), with the data root's time; returns rel -> (size, mtime_ns) as placed. Copies, not links: a task that
    rewrites an input in place must not change the cached object."""
    objects.mkdir(parents=True, exist_ok=True)
    for rel in inputs.folders:
        (folder / rel).mkdir(parents=True, exist_ok=True)
    placed = {}
    for staged in inputs.files:
        cached = objects / staged.digest
        if not cached.exists():
            area.get(staged.digest, cached, retries)
            traffic.down += staged.size
        dest = folder / staged.rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, dest)
        os.utime(dest, ns=(staged.mtime_ns, staged.mtime_ns))
        placed[staged.rel] = (staged.size, staged.mtime_ns)
    return placed


def _push(
    area: StagingArea,
    inputs: TaskFiles,
    placed: dict[str, tuple[int, int]],
    folder: Path,
    objects: Path,
    retries: Retries,
    traffic: Traffic,
) -> TaskFiles:
    """What the task left in its folder that differs from what it was given: uploaded (and kept in the node's
    cache), and listed."""
    given = {staged.rel: staged.digest for staged in inputs.files}
    known_folders = {""} | {parent for rel in inputs.folders for parent in _with_parents(rel)}
    known_folders |= {parent for rel in placed for parent in _with_parents(os.path.dirname(rel))}
    written, made, seen_files, seen_folders = [], [], set(), set()
    for current, subfolders, names in os.walk(folder):
        subfolders.sort()
        rel_folder = _rel(current, str(folder))
        seen_folders.add(rel_folder)
        if rel_folder not in known_folders:
            made.append(rel_folder)
        for name in sorted(names):
            path = Path(current, name)
            rel = _rel(str(path), str(folder))
            seen_files.add(rel)
            stat = path.stat()
            if placed.get(rel) == (stat.st_size, stat.st_mtime_ns):
                continue
            digest = file_sha256(path)
            if given.get(rel) == digest:
                continue
            area.put(path, digest, retries)
            traffic.up += stat.st_size
            _keep(path, objects / digest)
            written.append(StagedFile(rel=rel, digest=digest, size=stat.st_size, mtime_ns=stat.st_mtime_ns))
    return TaskFiles(
        files=tuple(written),
        folders=tuple(made),
        removed=tuple(sorted(set(placed) - seen_files)),
        removed_folders=tuple(sorted(set(inputs.folders) - seen_folders)),
    )


def _keep(path: Path, cached: Path) -> None:
    """A task's output kept in the node's cache (a later task on this node reads it without a download): linked,
    as the task is done with it and its folder goes."""
    partial = cached.with_name(f".{cached.name}.{uuid.uuid4().hex[:8]}")
    try:
        os.link(path, partial)
    except OSError:  # another file system
        shutil.copyfile(path, partial)
    os.replace(partial, cached)


def _with_parents(rel: str) -> list[str]:
    parts = PurePath(rel).parts
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]
