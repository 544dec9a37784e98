"""Object storage and other fsspec URLs (`s3://bucket/prefix/`, `gs://`, `az://`, `https://`, `file://`): telling a
URL from a local path, the filesystem behind it, transient errors retried with backoff and counted, and credentials
kept out of every message.

Credentials come from where the standard clients look (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, AWS_REGION or AWS_DEFAULT_REGION, AWS_PROFILE and ~/.aws); tokenmill never
takes them as settings, so they never reach run config, asset metadata or logs, and `mask_secrets` strips them from
the text of any error that quotes a request."""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from tokenmill.errors import SourceError

T = TypeVar("T")

# a scheme of two or more letters (a Windows drive letter `C:` is one) followed by ://
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+)://")
# user:password@ in a URL
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+://)[^/@\s]+@")
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AZURE_STORAGE_KEY")
MASK = "***"
# what each scheme needs installed beyond fsspec (torch brings fsspec; s3fs comes with the s3 extra)
SCHEME_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
# S3 error codes and HTTP statuses worth another try: throttling, timeouts, the server's own failures
TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
                   "InternalError", "ServiceUnavailable", "503", "500", "502", "504"}  # fmt: skip
# the client's own retries off, so `Retries` is the one policy and counts every retry: botocore's per request here,
# s3fs's (5 tries, a class attribute) on the instance `filesystem` returns; that instance is the one for these options
OWN_RETRIES_OPTIONS: dict[str, dict[str, Any]] = {"s3": {"config_kwargs": {"retries": {"total_max_attempts": 1}}}}
OWN_RETRIES_OPTIONS["s3a"] = OWN_RETRIES_OPTIONS["s3"]
READ_BLOCK = 8 << 20  # bytes one ranged GET fetches ahead of a streaming reader


def is_url(location: str | os.PathLike[str]) -> bool:
    """True for `scheme://...` other than a local `file://` path."""
    match = _URL.match(os.fspath(location))
    return match is not None and match.group("scheme").lower() != "file"


def local_path(location: str | os.PathLike[str]) -> Path:
    """A local path, `file://` URLs included."""
    text = os.fspath(location)
    return Path(text[len("file://") :] if text.lower().startswith("file://") else text)


def mask_secrets(text: str) -> str:
    """`text` with the credentials of this process's environment and any URL's user:password@ replaced by ***."""
    for name in SECRET_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, MASK)
    return _USERINFO.sub(rf"\g<scheme>{MASK}@", text)


def scheme_of(url: str) -> str:
    match = _URL.match(url)
    return match.group("scheme").lower() if match else "file"


def filesystem(url: str, *, own_retries: bool = False) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for `url`; a missing client package is one line naming what to install.
    With `own_retries`, the client retries nothing itself: the caller's `Retries` does, and counts."""
    import fsspec.core

    scheme = scheme_of(url)
    try:
        fs, path = fsspec.core.url_to_fs(url, **(OWN_RETRIES_OPTIONS.get(scheme, {}) if own_retries else {}))
    except ImportError as error:
        package = SCHEME_PACKAGES.get(scheme, f"fsspec's {scheme} backend")
        extra = " (pip install 'tokenmill[s3]')" if package == "s3fs" else ""
        raise ImportError(f"{scheme}:// locations need {package}{extra}: {mask_secrets(str(error))}") from None
    if own_retries and hasattr(fs, "retries"):
        fs.retries = 1
    return fs, path


def error_code(error: BaseException) -> str | None:
    """An S3-style error code or HTTP status carried by `error` (botocore's ClientError, s3fs's translations)."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        details = response.get("Error", {})
        code = details.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return None if code is None else str(code)
    cause = error.__cause__ or error.__context__
    return error_code(cause) if cause is not None and cause is not error else None


def is_transient(error: BaseException) -> bool:
    """Throttling, a reset or timed-out connection, a 5xx: worth another try. A missing or forbidden object is not."""
    if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError):
        return False
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    code = error_code(error)
    if code is not None:
        return code in TRANSIENT_CODES
    return type(error).__name__ in {"ClientConnectionError", "ServerDisconnectedError", "ClientPayloadError",
                                    "ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError"}  # fmt: skip


class StillFailing(OSError):
    """A transient error that outlasted every try: its message names what failed, credentials masked."""


@dataclass(kw_only=True)
class Retries:
    """How many transient failures were retried, and how long their backoff waited: a stage reports both."""

    attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    retried: int = 0
    waited_s: float = 0.0

    def call(self, operation: Callable[[], T], *, what: str) -> T:
        """`operation()`, again after an exponential backoff while it fails transiently, at most `attempts` times;
        the last failure is raised as StillFailing (an OSError) naming `what`, credentials masked."""
        for attempt in range(1, self.attempts + 1):
            try:
                return operation()
            except Exception as error:
                if not is_transient(error):
                    raise
                if attempt == self.attempts:
                    message = mask_secrets(f"{what}: still failing after {attempt} tries: {error}")
                    raise StillFailing(message) from None
                delay = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
                self.retried += 1
                self.waited_s += delay
                time.sleep(delay)
        raise AssertionError("unreachable")


RETRIES = Retries()
"""This process's remote reads (the raw stage's tasks, one at a time per process): a task reports what it added."""


@dataclass(frozen=True, kw_only=True)
class RemoteObject:
    url: str
    """scheme://bucket/key, as records name it (never credentials: a URL holding any is refused)."""
    size: int
    identity: str
    """The store's content tag (S3's ETag): a new one is new content, whatever the object's time says."""


def _identity(info: dict) -> str:
    for key in ("ETag", "etag", "md5Hash", "content_md5", "LastModified", "last_modified", "mtime"):
        if info.get(key):
            return str(info[key]).strip('"')
    return ""


def _masked_error(url: str, error: Exception) -> OSError:
    """One line naming the object for a missing or forbidden one (or any error that is not retried)."""
    if isinstance(error, StillFailing):  # names it already
        return error
    if isinstance(error, FileNotFoundError):
        return FileNotFoundError(f"{url}: no such object (removed since it was listed?)")
    if isinstance(error, PermissionError):
        return PermissionError(
            f"{url}: access denied (the credentials in the AWS variables or profile may not read it)"
        )
    return OSError(mask_secrets(f"{url}: {type(error).__name__}: {error}"))


@dataclass(frozen=True)
class RemoteLocation:
    """A source given as a URL, where the stages take a local Path: the same few questions (exists, is_file, is_dir,
    resolve, is_relative_to) answered by the store, so the wiring treats both alike."""

    url: str

    def __post_init__(self) -> None:
        if _USERINFO.match(self.url):
            raise SourceError(
                f"{mask_secrets(self.url)}: credentials in the URL are not accepted (they would be written into "
                "run tags and metadata): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
            )

    def __str__(self) -> str:
        return self.url

    def _fs(self) -> tuple[Any, str]:
        fs, path = filesystem(self.url, own_retries=True)
        fs.invalidate_cache()  # the client keeps listings; objects may have come and gone since
        return fs, path

    def _info(self) -> dict | None:
        fs, path = self._fs()
        try:
            return RETRIES.call(lambda: fs.info(path), what=self.url)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise SourceError(str(_masked_error(self.url, error))) from None

    def exists(self) -> bool:
        return self._info() is not None

    def is_file(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "file"

    def is_dir(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "directory"

    def resolve(self) -> RemoteLocation:
        return self

    def is_relative_to(self, other: str | os.PathLike[str]) -> bool:
        """A URL is never inside a local folder (the data root)."""
        return False


Location = Path | RemoteLocation


def as_location(text: str | os.PathLike[str] | RemoteLocation) -> Location:
    """A URL as a RemoteLocation, anything else (`file://` included) as a local Path."""
    if isinstance(text, RemoteLocation | Path):
        return text
    return RemoteLocation(os.fspath(text)) if is_url(text) else local_path(text).expanduser()


def same_location(a: str | os.PathLike[str] | RemoteLocation, b: str | os.PathLike[str] | RemoteLocation) -> bool:
    """Whether two sources name the same place (a trailing / on a prefix makes no difference)."""
    a, b = as_location(a), as_location(b)
    if isinstance(a, RemoteLocation) and isinstance(b, RemoteLocation):
        return a.url.rstrip("/") == b.url.rstrip("/")
    return a == b


def list_objects(location: RemoteLocation, retries: Retries) -> list[RemoteObject]:
    """Every object under the prefix (recursive, listed page by page by the client), or the one object the URL
    names; sorted by URL. Keys ending in / (folder markers) are left out."""
    fs, path = location._fs()
    try:
        info = retries.call(lambda: fs.info(path), what=location.url)
        found = (
            {path: info}
            if info.get("type") == "file"
            else retries.call(lambda: fs.find(path, detail=True), what=location.url)
        )
    except FileNotFoundError:
        return []
    except OSError as error:
        raise SourceError(str(_masked_error(location.url, error))) from None
    objects = [
        RemoteObject(url=fs.unstrip_protocol(key), size=int(entry.get("size") or 0), identity=_identity(entry))
        for key, entry in found.items()
        if entry.get("type") == "file" and not key.endswith("/")
    ]
    return sorted(objects, key=lambda o: o.url)


class _RetriedReads(io.RawIOBase):
    """A remote file whose reads are retried on transient errors: a failed ranged read moves nothing, so it is read
    again from where it was."""

    def __init__(self, f: Any, retries: Retries, url: str):
        self._f, self._retries, self._url = f, retries, url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._retries.call(lambda: self._f.read(len(buffer)), what=self._url)
        except OSError as error:
            raise _masked_error(self._url, error) from None
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        self._f.close()
        super().close()


@contextlib.contextmanager
def open_object(url: str, retries: Retries = RETRIES, buffer_bytes: int = 1 << 20) -> Iterator[BinaryIO]:
    """The object as a buffered, seekable binary file read by ranged GETs of READ_BLOCK bytes (nothing copied to
    disk); transient errors retried and counted in `retries`, a missing or forbidden object one line naming it."""
    fs, path = filesystem(url, own_retries=True)
    try:
        f = retries.call(lambda: fs.open(path, "rb", block_size=READ_BLOCK, cache_type="readahead"), what=url)
    except OSError as error:
        raise _masked_error(url, error) from None
    with io.BufferedReader(_RetriedReads(f, retries, url), buffer_size=buffer_bytes) as buffered:
        yield buffered
