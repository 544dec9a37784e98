"""Publishing a dataset version to object storage: `tokenmill publish --to s3://bucket/prefix` (and the
`publish_dataset` job) uploads tokenized_bins' version K into the prefix in the local layout (docs/format.md), so
`tokenmill_loader.open_store("s3://bucket/prefix/train", cache_dir=...)` reads there what it reads locally.

Order, so that a reader never sees a half-published version: every shard file, each split's tokenizer copy and
tokenizer files, then each split's manifest dataset.v<K>.json, then `current.json` (the commit point: readers
resolve the latest version through it), then each split's dataset.json copy. An object store makes an object
visible only whole (a PUT, or a multipart upload once completed), so a killed publish leaves the previous version
published and some of K's objects in place; run again, it uploads only what is missing (an object there at its
size is complete: a version's file names are never reused with other content, and a manifest found with other
bytes is refused). Files of at least twice `part_bytes` go up as multipart uploads, their parts in parallel; a
kill leaves an incomplete multipart upload, which a lifecycle rule (AbortIncompleteMultipartUpload) removes.
Retention then applies in the prefix as tokenized_bins applies it locally (tokenmill/stages/tokenize/versions.py),
timed by the remote manifests' LastModified: a reader that opened version J there can read it for at least
`retention_hours` after J+1 was published there.

Credentials come from the environment or profile (tokenmill.common.remote): never settings, never in the result,
the logs or an error's text."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill.common.failpoints import failpoint
from tokenmill.common.remote import Retries, filesystem, is_url, mask_secrets
from tokenmill.errors import ConfigError, CorruptOutputError, TokenmillError
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill_loader.format import (
    CURRENT_FILE,
    DATASET_FILE,
    RECORD_IDS_FILE,
    SHARD_DIR,
    SPLITS,
    TOKENIZER_EXTRA_FILES,
    TOKENIZER_FILE,
    VERSION_FILE,
    DatasetError,
    current_version,
    validate_dataset,
    version_file,
)

PART_BYTES = 64 << 20  # multipart part size: S3 allows 10,000 parts, so up to 640 GB per file at this size
UPLOAD_THREADS = 8  # files uploaded at once: one connection to an object store carries far less than a host's link
STAGE = "publish"
# the prefix keeps versions as the data root does, unless told otherwise
RETENTION_HOURS = float(ShardSettings.model_fields["retention_hours"].default)
KEEP_VERSIONS = int(ShardSettings.model_fields["keep_versions"].default)


@dataclass(frozen=True, kw_only=True)
class PublishResult:
    """What one publish did (no credentials: the URL as given, which may not hold any)."""

    url: str
    version: int
    files: int
    """Objects the version needs in the prefix."""
    uploaded: int
    skipped: int
    """Already there, complete (a resumed publish, or shards an earlier version shares)."""
    uploaded_bytes: int
    multipart: int
    """Files uploaded in parts."""
    removed_versions: list[int] = field(default_factory=list)
    removed_objects: int = 0
    retried: int = 0
    seconds: float = 0.0

    def as_metadata(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "removed_versions"} | {
            "removed_versions": ", ".join(map(str, self.removed_versions)) or "none"
        }


@dataclass(frozen=True, kw_only=True)
class Upload:
    local: Path
    key: str
    """Path under the prefix: train/shard-00003/sequence.bin."""


def published_version(bins_dir: Path) -> int:
    """The version tokenized_bins publishes locally (its current.json)."""
    version = current_version(Path(bins_dir) / SPLITS[0])
    if version is None:
        raise ConfigError(
            f"{bins_dir / CURRENT_FILE}: missing: nothing published here to upload (run tokenmill update)"
        )
    return version


def plan(bins_dir: Path, version: int) -> tuple[list[Upload], list[Upload], list[Upload]]:
    """(the version's immutable files, its manifests, the files after the switch: dataset.json copies); each
    local split checked against its manifest first (sizes and meta.json), so no broken version goes up."""
    files, manifests, copies = [], [], []
    for split in SPLITS:
        folder = Path(bins_dir) / split
        if not folder.is_dir():
            continue
        try:
            dataset = validate_dataset(folder, version=version)
        except DatasetError as error:
            raise CorruptOutputError(f"publish: {error}") from None
        for entry in dataset.manifest["shards"]:
            names = [*entry.get("files", {}), RECORD_IDS_FILE]  # record ids: lineage of a published position
            for name in names:
                if (folder / entry["name"] / name).is_file():
                    files.append(Upload(local=folder / entry["name"] / name, key=f"{split}/{entry['name']}/{name}"))
        tokenizer = (dataset.manifest.get("tokenizer") or {}).get("file")
        for name in ([tokenizer] if tokenizer else []) + [TOKENIZER_FILE, *TOKENIZER_EXTRA_FILES]:
            if (folder / name).is_file():
                files.append(Upload(local=folder / name, key=f"{split}/{name}"))
        manifests.append(Upload(local=folder / version_file(version), key=f"{split}/{version_file(version)}"))
        copies.append(Upload(local=folder / version_file(version), key=f"{split}/{DATASET_FILE}"))
    if not manifests:
        raise ConfigError(f"{bins_dir}: no split folder ({', '.join(SPLITS)}) to publish")
    return files, manifests, copies


@dataclass(kw_only=True)
class Prefix:
    """The destination: its filesystem, the path of the prefix inside it, what is there (key -> size)."""

    url: str
    fs: Any
    root: str
    retries: Retries
    sizes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def open(cls, url: str, retries: Retries) -> Prefix:
        if not is_url(url):
            raise ConfigError(f"publish --to {url}: expected an object-storage URL like s3://bucket/prefix")
        if mask_secrets(url) != url:
            raise ConfigError(
                f"publish --to {mask_secrets(url)}: credentials in the URL are not accepted (they would reach run "
                "config and logs): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
            )
        fs, root = filesystem(url.rstrip("/"))
        prefix = cls(url=url.rstrip("/"), fs=fs, root=root.rstrip("/"), retries=retries)
        prefix.refresh()
        return prefix

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def call(self, operation: Callable[[], Any], key: str) -> Any:
        """`operation` retried while it fails transiently; any other error one line naming the object, masked."""
        what = f"{self.url}/{key}" if key else self.url
        try:
            return self.retries.call(operation, what=what)
        except OSError as error:
            raise OSError(mask_secrets(f"{what}: {error}")) from None
        except Exception as error:  # a client error quoting the request: only its masked text goes on
            raise OSError(mask_secrets(f"{what}: {type(error).__name__}: {error}")) from None

    def refresh(self) -> None:
        self.fs.invalidate_cache()  # what other publishers (or a killed run of this one) wrote since
        found = self.call(lambda: self.fs.find(self.root, detail=True), "")  # an empty prefix: {}
        self.sizes = {
            path[len(self.root) + 1 :]: int(info.get("size") or 0)
            for path, info in found.items()
            if info.get("type") == "file" and path.startswith(self.root + "/")
        }

    def read(self, key: str) -> bytes | None:
        if key not in self.sizes:
            return None
        return self.call(lambda: self.fs.cat_file(self.path(key)), key)

    def put(self, upload: Upload, part_bytes: int) -> None:
        # s3fs uploads a file of at least 2 x chunksize in parts of chunksize, in parallel, completing it only
        # once every part is in (aborting it on an error): the object appears whole or not at all
        options = {"chunksize": part_bytes} if self.is_s3 else {}
        self.call(lambda: self.fs.put_file(str(upload.local), self.path(upload.key), **options), upload.key)
        self.sizes[upload.key] = upload.local.stat().st_size

    def put_json(self, key: str, obj: dict) -> None:
        data = json.dumps(obj, sort_keys=True).encode()
        self.call(lambda: self.fs.pipe_file(self.path(key), data), key)
        self.sizes[key] = len(data)

    def remove(self, keys: list[str]) -> None:
        if keys:
            self.call(lambda: self.fs.rm([self.path(k) for k in keys]), keys[0])
            for key in keys:
                self.sizes.pop(key, None)

    def modified(self, key: str) -> float:
        return self.call(lambda: self.fs.modified(self.path(key)), key).timestamp()

    @property
    def is_s3(self) -> bool:
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        return bool({"s3", "s3a"} & set(protocols))


def remote_version(prefix: Prefix) -> int | None:
    data = prefix.read(CURRENT_FILE)
    if data is None:
        return None
    try:
        version = json.loads(data).get("version")
    except (ValueError, AttributeError):
        version = None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CorruptOutputError(f'{prefix.url}/{CURRENT_FILE}: not {{"version": <int >= 1>}}')
    return version


def check_destination(prefix: Prefix, version: int, manifests: list[Upload]) -> int | None:
    """The version the prefix publishes; refuses to roll readers back, or to mix another build's version K in."""
    there = remote_version(prefix)
    if there is not None and there > version:
        raise ConfigError(
            f"{prefix.url}/{CURRENT_FILE}: publishes version {there}, newer than version {version} here: publishing "
            "it would move readers back (publish a newer version, or to another prefix)"
        )
    for manifest in manifests:
        found = prefix.read(manifest.key)
        if found is not None and found != manifest.local.read_bytes():
            raise ConfigError(
                f"{prefix.url}/{manifest.key}: another build's version {version} is there (its manifest differs "
                "from this data root's): publish to another prefix"
            )
    return there


def upload_all(prefix: Prefix, uploads: list[Upload], part_bytes: int) -> tuple[int, int, int]:
    """Uploads, in parallel, those not already there at their size; returns (uploaded, bytes, multipart)."""
    todo = [u for u in uploads if prefix.sizes.get(u.key) != u.local.stat().st_size]

    def one(upload: Upload) -> int:
        prefix.put(upload, part_bytes)
        failpoint(f"{STAGE}:uploaded:{upload.key}")  # the kill tests' crash points, one per file
        return upload.local.stat().st_size

    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        sizes = list(pool.map(one, todo))
    multipart = sum(size >= 2 * part_bytes for size in sizes) if prefix.is_s3 else 0
    return len(todo), sum(sizes), multipart


def apply_remote_retention(prefix: Prefix, hours: float, keep_versions: int, now: float | None = None) -> list[int]:
    """tokenized_bins' retention rule in the prefix: a version older than the newest `keep_versions`, superseded
    (its successor's manifest uploaded) more than `hours` ago, is removed, its manifests first, then every shard
    object and tokenizer copy no remaining manifest names. Returns the versions removed."""
    now = time.time() if now is None else now
    prefix.refresh()
    versions = sorted({int(m.group(1)) for key in prefix.sizes if (m := VERSION_FILE.fullmatch(key.split("/")[-1]))})
    newest = versions[-keep_versions:]
    removed = []
    for older, newer in zip(versions, versions[1:]):
        keys = [f"{s}/{version_file(newer)}" for s in SPLITS if f"{s}/{version_file(newer)}" in prefix.sizes]
        superseded_at = min(prefix.modified(k) for k in keys)
        if older not in newest and now - superseded_at > hours * 3600:
            removed.append(older)
    prefix.remove(
        [f"{s}/{version_file(v)}" for v in removed for s in SPLITS if f"{s}/{version_file(v)}" in prefix.sizes]
    )
    return removed


def remove_unreferenced(prefix: Prefix) -> int:
    """Shard objects and tokenizer copies of each split that no manifest in the prefix names; returns how many."""
    doomed = []
    for split in SPLITS:
        named = {TOKENIZER_FILE, *TOKENIZER_EXTRA_FILES}
        manifests = [k for k in prefix.sizes if k.startswith(f"{split}/") and k.count("/") == 1]
        for key in manifests:
            name = key.split("/")[1]
            if name == DATASET_FILE or VERSION_FILE.fullmatch(name):
                manifest = json.loads(prefix.read(key) or b"{}")
                named.update(sh["name"] for sh in manifest.get("shards", []))
                named.add((manifest.get("tokenizer") or {}).get("file", TOKENIZER_FILE))
        for key in prefix.sizes:
            parts = key.split("/")
            if parts[0] != split or len(parts) < 2 or parts[1] in named:
                continue
            is_copy = parts[1].startswith("tokenizer-") and parts[1].endswith(".json")
            if SHARD_DIR.fullmatch(parts[1]) or is_copy:
                doomed.append(key)
    prefix.remove(sorted(doomed))
    return len(doomed)


def publish_dataset(
    bins_dir: Path,
    to: str,
    *,
    version: int | None = None,
    retention_hours: float = RETENTION_HOURS,
    keep_versions: int = KEEP_VERSIONS,
    part_bytes: int = PART_BYTES,
    log: Callable[[str], None] | None = None,
) -> PublishResult:
    """Uploads version `version` (default: the one tokenized_bins publishes) of `bins_dir` to `to`, the manifest
    and then current.json last, resuming what a killed publish left; then applies retention there."""
    started = time.monotonic()
    bins_dir = Path(bins_dir)
    say = log or (lambda _: None)
    if version is None:
        version = published_version(bins_dir)
    if retention_hours < 0 or keep_versions < 1:
        raise ConfigError(
            f"publish: retention_hours {retention_hours} must be >= 0, keep_versions {keep_versions} >= 1"
        )
    if part_bytes < 5 << 20:
        raise ConfigError(f"publish: part_bytes {part_bytes} is below S3's 5 MiB minimum part size")
    files, manifests, copies = plan(bins_dir, version)
    retries = Retries()
    prefix = Prefix.open(to, retries)
    there = check_destination(prefix, version, manifests)
    uploaded, uploaded_bytes, multipart = upload_all(prefix, files, part_bytes)
    say(
        f"{STAGE}: version {version}: {uploaded} files uploaded ({uploaded_bytes} bytes), {len(files) - uploaded} there"
    )
    more = upload_all(prefix, manifests, part_bytes)
    if there != version:
        prefix.put_json(CURRENT_FILE, {"version": version})  # the commit point: readers switch to version K here
    failpoint(f"{STAGE}:switched")
    rest = upload_all(prefix, copies, part_bytes)
    removed = apply_remote_retention(prefix, retention_hours, keep_versions)
    removed_objects = remove_unreferenced(prefix)
    if removed or removed_objects:
        say(
            f"{STAGE}: retention ({retention_hours} h, newest {keep_versions} kept) removed versions {removed}, "
            f"{removed_objects} objects"
        )
    needed = len(files) + len(manifests) + len(copies) + 1
    done = uploaded + more[0] + rest[0] + (there != version)
    return PublishResult(
        url=prefix.url,
        version=version,
        files=needed,
        uploaded=done,
        skipped=needed - done,
        uploaded_bytes=uploaded_bytes + more[1] + rest[1],
        multipart=multipart + more[2] + rest[2],
        removed_versions=removed,
        removed_objects=removed_objects,
        retried=retries.retried,
        seconds=round(time.monotonic() - started, 3),
    )


def publish_command(bins_dir: Path, to: str, **options: Any) -> int:
    """`tokenmill publish`: the summary on stdout, progress on stderr, a failure in one line (exit status 2)."""
    try:
        result = publish_dataset(bins_dir, to, log=lambda line: print(line, file=sys.stderr), **options)
    except (TokenmillError, DatasetError, OSError, ImportError) as error:
        print(f"tokenmill publish: {mask_secrets(str(error))}", file=sys.stderr)
        return 2
    print(
        f"published version {result.version} to {result.url}: {result.uploaded} objects uploaded "
        f"({result.uploaded_bytes / 2**20:.1f} MiB, {result.multipart} in parts), {result.skipped} already there, "
        f"{result.seconds:.1f} s"
        + (f"; retention removed versions {result.removed_versions}" if result.removed_versions else "")
    )
    print(f'read it: open_store("{result.url}/train", cache_dir="/local/cache")  (docs/publish.md)')
    return 0
