"""A published store in object storage (`s3://bucket/prefix/train`), read through a local cache folder.

`open_store(url, cache_dir=...)` mirrors the split's small files at open: the version's manifest (the version the
prefix's current.json names, resolved once, as for a local folder) and every shard's meta.json, checked against the
manifest's SHA-256. A shard's data files are fetched on its first touch (a batch's missing shards together), each
checked against the manifest's bytes and SHA-256 before it is renamed into place, so the cache never holds a file a
reader accepts half-written or altered. PREFETCH_SHARDS shards keep downloading in the background:

- under tokenmill_loader.DataLoader (a dataset with `shards_of`: TokenDataset, RecordDataset), the shards the
  sampler's next batches need, in the order they first need them: the loader's main process walks its sampler's
  batches ahead (loader.PLAN_BATCHES past those in flight, from wherever it stands, a resume's position included; to
  the epoch's end, not past it) and hands the shards to `plan`, which downloads them into the cache, where its
  workers find them (they prefetch nothing themselves). A bounded cache keeps the shards of the batches in flight,
  then as many planned ones as fit: to make room it evicts only other files, and it never prefetches past the bound;
- otherwise (a Store read directly, PackingLoader), the ones not cached yet in stream order from the first one
  touched (wrapping around), while the cache has room.

The Store then memory-maps the cached files exactly as it maps a local folder's, so the batches, shuffles,
rank x worker shares and resumes are the local store's.

`cache_bytes` bounds the cached data files: past it, the files least recently first touched (their mtime) are
removed, never those of the shards being fetched (nor, in the process that plans, those its plan keeps). A process
keeps its mapping of a file another process removed until its next fetch (then it drops it and fetches the file again
when it touches it), so the bound is exceeded by at most the shards each process has mapped since its last fetch.
Several processes (DataLoader workers, ranks on one host) may share a cache folder: each file is downloaded to a
temporary name and renamed.

Credentials come from where s3fs looks (AWS_* variables, ~/.aws); they never travel in a pickled Store, and
messages have them masked. s3fs is the `tokenmill-loader[s3]` extra, imported only for a URL.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .format import (
    CURRENT_FILE,
    DATASET_FILE,
    PLAIN_NAME,
    SHARD_META_FILE,
    DatasetError,
    load_json,
    version_file,
)

PREFETCH_SHARDS = 4  # shards downloading in the background at once
FETCH_THREADS = 8  # parallel downloads: object stores serve one connection at far less than a host's bandwidth
STALE_TEMP_S = 3600.0  # a download's temporary file untouched this long was left by a killed process
TOUCH_TRIES = 3  # a file another process evicted between its download and its first touch is fetched again
CHUNK_BYTES = 16 << 20  # one ranged GET, hashed while it is written
STARTED_KEPT = 4096  # RemoteSplit.started: the latest downloads only, so a long run's log stays small
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+)://")
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+://)[^/@\s]+@")
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AZURE_STORAGE_KEY")
TEMP_PREFIX = ".fetch-"


def is_url(location) -> bool:
    """True for `scheme://...` other than `file://` (a local path opens as before)."""
    match = _URL.match(os.fspath(location)) if isinstance(location, str | os.PathLike) else None
    return match is not None and match.group("scheme").lower() != "file"


def mask_secrets(text: str) -> str:
    """`text` with this process's credentials and any URL's user:password@ replaced by ***."""
    for name in SECRET_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return _USERINFO.sub(r"\1***@", text)


@dataclass(frozen=True, kw_only=True)
class RemoteSpec:
    """What a pickled Store carries to re-open a remote split in a worker: no credentials, no connection."""

    url: str
    """The split's URL, `s3://bucket/prefix/train`; its parent prefix holds current.json."""
    cache_dir: str
    """The local folder the split is mirrored into (under a folder named after the URL)."""
    cache_bytes: int | None = None
    """Bound on the cached data files (None: no bound)."""
    planned: bool = False
    """Prefetching follows the plan the loader's main process gives (`RemoteSplit.plan`), not the stream: its
    workers then prefetch nothing themselves."""

    @property
    def root(self) -> Path:
        """The cache folder mirroring the URL's parent prefix (the one that holds current.json)."""
        parent = self.url.rstrip("/").rsplit("/", 1)[0]
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", _URL.sub("", parent)).strip("-.")[:80] or "store"
        return Path(self.cache_dir) / f"{slug}-{hashlib.sha256(parent.encode()).hexdigest()[:12]}"

    @property
    def split(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def folder(self) -> Path:
        return self.root / self.split


def remote_spec(url: str, cache_dir, cache_bytes: int | None) -> RemoteSpec:
    if cache_dir is None:
        raise DatasetError(f"{mask_secrets(url)}: a remote store needs a local cache: open_store(url, cache_dir=...)")
    if cache_bytes is not None and cache_bytes < 1:
        raise DatasetError(f"{mask_secrets(url)}: cache_bytes must be >= 1 (or None: no bound), not {cache_bytes}")
    split = url.rstrip("/").rsplit("/", 1)[-1]
    if "/" not in _URL.sub("", url.rstrip("/")) or not PLAIN_NAME.fullmatch(split):
        raise DatasetError(f"{mask_secrets(url)}: expected the URL of a split folder, like s3://bucket/prefix/train")
    return RemoteSpec(url=url.rstrip("/"), cache_dir=os.path.realpath(cache_dir), cache_bytes=cache_bytes)


class RemoteSplit:
    """The local mirror of one remote split: fetches, checks and evicts its files (one per process)."""

    def __init__(self, spec: RemoteSpec):
        self.spec = spec
        self.folder = spec.folder
        self.files: dict[str, dict[str, dict]] = {}  # shard -> file name -> {bytes, sha256} from the manifest
        self.order: list[str] = []  # shard names in stream order
        self._pid = -1  # the process whose threads, client and in-flight downloads _fresh set up
        self._cursor: int | None = None  # the next shard (index into order, wrapping) prefetching considers
        self._walked = 0  # shards prefetching has considered: it stops after every one
        self._cached_bytes = 0  # the cache's data files at the last eviction (a bounded cache)
        # shards whose data files this process started downloading, in order (the last STARTED_KEPT; tests, benchmarks)
        self.started: deque[str] = deque(maxlen=STARTED_KEPT)

    # -- per process: a forked worker gets neither the parent's threads nor its event loop
    def _fresh(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.RLock()  # a done callback may run in the thread holding it
            self._inflight: dict[Path, Future] = {}
            # the plan (this process's own: a forked worker gets none of its parent's)
            self._plan: list[str] = []  # shards the next batches need, first need first
            self._rank: dict[str, int] = {}  # shard -> its place in the plan
            self._keep: set[Path] = set()  # data files of the shards batches in flight or planned need
            self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="tokenmill-fetch")
            self._fs, self._remote_root = _filesystem(self.spec.url.rsplit("/", 1)[0])

    def _remote(self, *parts: str) -> str:
        return "/".join((self._remote_root.rstrip("/"), self.spec.split, *parts))

    def _url(self, *parts: str) -> str:
        return mask_secrets("/".join((self.spec.url, *parts)))

    # -- open: the manifest and every meta.json
    def sync(self, version: int | None) -> int | None:
        """Mirrors the manifest of `version` (None: the one the remote current.json names, else dataset.json) and
        every shard's meta.json; returns the version (None: an unversioned split)."""
        self._fresh()
        self.folder.mkdir(parents=True, exist_ok=True)
        if version is None:
            version = self._published_version()
        if version is None:  # written before versions: dataset.json is the latest, fetched again at each open
            manifest = self._download((DATASET_FILE,), self.folder / DATASET_FILE, None)
        else:
            manifest = self.folder / version_file(version)
            if not manifest.is_file():  # immutable once published: a cached copy is that version
                manifest = self._download((manifest.name,), manifest, None)
        info, _ = load_json(manifest, "dataset description")
        shards = info.get("shards") if isinstance(info, dict) else None
        if not isinstance(info, dict) or not isinstance(shards, list):
            raise DatasetError(f"{manifest}: expected a dataset manifest with a 'shards' list")
        for entry in shards:
            name = entry.get("name") if isinstance(entry, dict) else None
            files = entry.get("files") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or not isinstance(files, dict):
                raise DatasetError(f"{manifest}: shard entry {str(entry)[:120]} has no plain name and files")
            self.files[name] = {
                f: spec for f, spec in files.items() if isinstance(spec, dict) and PLAIN_NAME.fullmatch(f)
            }
            self.order.append(name)
        tokenizer = info.get("tokenizer")
        tokenizer = tokenizer if isinstance(tokenizer, dict) else {}
        self._wait([self._start(name, [SHARD_META_FILE]) for name in self.order] + [self._tokenizer(tokenizer)])
        return version

    def _tokenizer(self, tokenizer: dict) -> list[Future]:
        """The version's tokenizer copy (Store.tokenizer_path), checked against the SHA-256 it was encoded with."""
        name = tokenizer.get("file")
        if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or (self.folder / name).is_file():
            return []
        expected = {"sha256": tokenizer["sha256"]} if isinstance(tokenizer.get("sha256"), str) else None
        return [self._pool.submit(self._download, (name,), self.folder / name, expected)]

    def _published_version(self) -> int | None:
        pointer = self._remote_root.rstrip("/") + "/" + CURRENT_FILE
        try:
            text = self._fs.cat_file(pointer)
        except FileNotFoundError:
            return None
        except Exception as error:
            raise OSError(mask_secrets(f"{self.spec.url.rsplit('/', 1)[0]}/{CURRENT_FILE}: {error}")) from None
        try:
            value = json.loads(text).get("version")
        except (ValueError, AttributeError):
            value = None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            where = mask_secrets(f"{self.spec.url.rsplit('/', 1)[0]}/{CURRENT_FILE}")
            raise DatasetError(f'{where}: expected {{"version": <int >= 1>}}')
        return value

    # -- data files
    def data_files(self, shard: str) -> list[str]:
        """The files of `shard` the Store maps (every listed one but meta.json, which is mirrored at open)."""
        return [f for f in self.files[shard] if f != SHARD_META_FILE]

    def fetch(self, shards: Iterable[str]) -> set[Path]:
        """Makes the data files of `shards` local (fetched together), starts prefetching the shards after the last
        of them, then evicts past the bound; returns the paths evicted."""
        self._fresh()
        shards = sorted(shards, key=lambda name: self._rank.get(name, len(self._rank)))  # planned: first need first
        touched = {self.folder / name / f for name in shards for f in self.data_files(name)}
        for _ in range(TOUCH_TRIES):
            self._wait([self._start(name, self.data_files(name)) for name in shards])
            try:
                for path in touched:
                    os.utime(path)  # the LRU clock: first touch in this process
                break
            except FileNotFoundError:  # another process sharing the cache evicted it meanwhile: fetch it again
                continue
        # the process that plans counts what it downloads (_done): it scans the cache only once past the bound
        planner = self.spec.planned and bool(self._keep)
        over = not planner or self._cached_bytes > (self.spec.cache_bytes or 0)
        evicted = self.evict(protect=touched) if over else set()
        if shards:
            self._prefetch(after=shards[-1])
        return evicted

    def plan(self, upcoming: list[str], in_flight: list[str]) -> None:
        """Prefetching follows `upcoming` (the shards the sampler's next batches need, first need first) from now on.
        A bounded cache keeps `in_flight` (the shards of batches handed out and not read yet), then as much of
        `upcoming` as fits in the bound with them: those are never evicted to make room, the rest of the plan waits."""
        self._fresh()
        limit = self.spec.cache_bytes
        keep: list[str] = []
        for name in dict.fromkeys((*in_flight, *upcoming)):
            size = self._bytes(name, self.data_files(name))
            if limit is not None and size > limit:
                break
            limit = None if limit is None else limit - size
            keep.append(name)
        with self._lock:
            kept = set(keep)
            self._plan = [name for name in upcoming if name in kept]  # replaced whole: the loader walks on from here
            self._rank = {name: i for i, name in enumerate(self._plan)}
            self._keep = {self.folder / n / f for n in keep for f in self.data_files(n)}
        try:  # in a download thread: an eviction's scan of the cache never holds up the training loop
            self._pool.submit(self._prefetch)
        except RuntimeError:  # the pool is shut down: the interpreter is exiting
            pass

    def _bytes(self, shard: str, names: list[str]) -> int:
        """Bytes of the files `names` of `shard`, from the manifest."""
        return sum(int(self.files[shard].get(f, {}).get("bytes") or 0) for f in names)

    def _prefetch(self, after: str | None = None) -> None:
        """Keeps PREFETCH_SHARDS shards downloading: the next ones not cached yet, in stream order from the first shard
        touched, wrapping around (under a shuffle every shard is needed early), while the cache has room for them.
        Each shard is considered once per Store: one evicted later is fetched again when touched."""
        with self._lock:  # called from the reader and from download threads (as each finishes)
            if self.spec.planned:
                self._prefetch_planned()
                return
            if self._cursor is None:
                if after is None:
                    return
                self._cursor = self.order.index(after) + 1
            limit = self.spec.cache_bytes
            room = None if limit is None else limit - self._cached_bytes
            downloading = len({path.parent for path in self._inflight})
            while downloading < PREFETCH_SHARDS and self._walked < len(self.order):
                name = self.order[self._cursor % len(self.order)]
                size = sum(int(self.files[name][f].get("bytes") or 0) for f in self.data_files(name))
                if room is not None and size > room:
                    return  # the cache is full: from here shards are fetched when touched
                self._cursor += 1
                self._walked += 1
                if self._start(name, self.data_files(name)):
                    downloading += 1
                    if room is not None:
                        room -= size
                        self._cached_bytes += size  # counted until the next eviction measures the cache

    def _prefetch_planned(self) -> None:
        """Keeps PREFETCH_SHARDS shards of the plan downloading, the first needed first. A bounded cache makes room
        (one eviction) by removing files the plan does not keep; a shard that still does not fit waits (touched, it is
        fetched)."""
        downloading = {path.parent.name for path in self._inflight}
        chosen: list[tuple[str, list[str], int]] = []  # (shard, its files not cached, their bytes)
        for name in self._plan:
            if len(downloading) + len(chosen) >= PREFETCH_SHARDS:
                break
            missing = (
                []
                if name in downloading
                else [f for f in self.data_files(name) if not (self.folder / name / f).is_file()]
            )
            if missing:
                chosen.append((name, missing, self._bytes(name, missing)))
        limit = self.spec.cache_bytes
        room = None
        if chosen and limit is not None:
            # the downloads running count against the bound until they finish (_done adds them to _cached_bytes)
            pending = sum(self._bytes(path.parent.name, [path.name]) for path in self._inflight)
            need = pending + sum(size for _, _, size in chosen)
            if self._cached_bytes + need > limit:
                self.evict(protect=set(), need=need)
            room = limit - self._cached_bytes - pending
        for name, missing, size in chosen:
            if room is not None:
                if size > room:
                    return  # what the plan keeps fills the cache: from here shards are fetched when touched
                room -= size
            self._start(name, missing)

    def fetch_all(self) -> None:
        self._fresh()
        self._wait([self._start(name, self.data_files(name)) for name in self.order])

    def _start(self, shard: str, names: list[str]) -> list[Future]:
        futures = []
        with self._lock:
            for name in names:
                path = self.folder / shard / name
                if path.is_file():
                    continue
                future = self._inflight.get(path)
                if future is None:
                    if name != SHARD_META_FILE and (not self.started or self.started[-1] != shard):
                        self.started.append(shard)
                    future = self._pool.submit(self._download, (shard, name), path, self.files[shard].get(name))
                    self._inflight[path] = future
                    future.add_done_callback(functools.partial(self._done, path))
                futures.append(future)
        return futures

    def _done(self, path: Path, future: Future) -> None:
        with self._lock:
            self._inflight.pop(path, None)
            if (
                self.spec.planned
                and self.spec.cache_bytes is not None
                and not future.cancelled()
                and not future.exception()
            ):
                self._cached_bytes += self._bytes(path.parent.name, [path.name])  # measured again at the next eviction
            if self._cursor is None and not self._plan:
                return
            try:  # the next shard starts as one finishes, so prefetching goes on between the reader's misses
                self._prefetch()
            except RuntimeError:  # the pool is shut down: the interpreter is exiting
                pass

    @staticmethod
    def _wait(groups: list[list[Future]]) -> None:
        """Every download done (none left running behind an error), then the first failure raised."""
        futures = [future for group in groups for future in group]
        concurrent.futures.wait(futures)
        for future in futures:
            future.result()

    def _download(self, parts: tuple[str, ...], path: Path, expected: dict | None) -> Path:
        """The split's object `parts` into `path` through a temporary file, checked against `expected`
        ({bytes, sha256} from the manifest)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{path.name}")
        digest, size = hashlib.sha256(), 0
        where = self._url(*parts)
        try:
            with open(temp, "wb") as f:
                for chunk in self._chunks(self._remote(*parts), (expected or {}).get("bytes")):
                    digest.update(chunk)
                    size += len(chunk)
                    f.write(chunk)
            if expected is not None:
                if "bytes" in expected and size != expected["bytes"]:
                    raise DatasetError(f"{where}: {size} bytes, the manifest lists {expected['bytes']}")
                if expected.get("sha256") and digest.hexdigest() != expected["sha256"]:
                    raise DatasetError(f"{where}: sha256 differs from the manifest (corrupted or another build)")
            os.replace(temp, path)
        except FileNotFoundError:
            raise DatasetError(f"{where}: not in object storage (not published, or removed by retention)") from None
        except DatasetError:
            raise
        except Exception as error:
            raise OSError(mask_secrets(f"{where}: fetch failed: {error}")) from None
        finally:
            temp.unlink(missing_ok=True)
        return path

    def _chunks(self, remote: str, listed: int | None) -> Iterator[bytes]:
        """The object's bytes, by ranged GETs when its size is listed (no HEAD first; the last range asks for one byte
        more, so an object longer than listed shows), else in one GET (manifests, tokenizer: small)."""
        if not isinstance(listed, int) or listed <= 0:
            yield self._fs.cat_file(remote)
            return
        start = 0
        while start < listed:
            end = min(start + CHUNK_BYTES, listed)
            end += end == listed
            try:
                chunk = self._fs.cat_file(remote, start=start, end=end)
            except OSError as error:
                if error.errno == errno.EINVAL and start:  # 416: the object ends before `start`, short of its listing
                    return
                raise
            yield chunk
            if len(chunk) < end - start:
                return
            start += len(chunk)

    def evict(self, protect: set[Path], need: int = 0) -> set[Path]:
        """Removes the least recently touched data files while the cache's data files exceed the bound less `need`
        bytes (and the temporary files of downloads a killed process left), never those of `protect` or of the
        shards the plan keeps."""
        limit = self.spec.cache_bytes
        if limit is None:
            return set()
        limit -= need
        protect = protect | self._keep if self._pid == os.getpid() else protect
        cached, now = [], time.time()
        for split in self.spec.root.iterdir():
            for shard in split.iterdir() if split.is_dir() else ():
                for entry in os.scandir(shard) if shard.is_dir() else ():
                    try:
                        stat = entry.stat()
                        if entry.name.startswith(TEMP_PREFIX) and now - stat.st_mtime > STALE_TEMP_S:
                            os.unlink(entry.path)
                        elif entry.name != SHARD_META_FILE and not entry.name.startswith(TEMP_PREFIX):
                            cached.append((stat.st_mtime, stat.st_size, Path(entry.path)))
                    except FileNotFoundError:  # another process sharing the cache removed it meanwhile
                        continue
        total = sum(size for _, size, _ in cached)
        evicted = set()
        for _, size, path in sorted(cached, key=lambda item: item[0]):
            if total <= limit:
                break
            if path not in protect:
                path.unlink(missing_ok=True)
                evicted.add(path)
                total -= size
        self._cached_bytes = total
        return evicted


def _filesystem(url: str):
    """(fsspec filesystem, path inside it); a missing s3fs is one line naming the extra."""
    try:
        import fsspec.core

        # its own instance: fsspec's shared ones keep the endpoint and credentials of the environment they met first,
        # and listings cached from before a version was published
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, use_listings_cache=False)
    except ImportError as error:
        raise ImportError(
            f"{mask_secrets(url)}: reading object storage needs s3fs: pip install 'tokenmill-loader[s3]' ({error})"
        ) from None
    return fs, path
