"""Object storage and other fsspec URLs (`s3://bucket/prefix/`, `gs://`, `az://`, `https://`, `file://`): telling a
URL from a local path, the filesystem behind it, transient errors retried with backoff and counted, and credentials
kept out of every message.

Credentials come from where the standard clients look (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, AWS_REGION or AWS_DEFAULT_REGION, AWS_PROFILE and ~/.aws); tokenmill never
takes them as settings, so they never reach run config, asset metadata or logs, and `mask_secrets` strips them from
the text of any error that quotes a request."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

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


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for `url`; a missing client package is one line naming what to install."""
    import fsspec.core

    scheme = (_URL.match(url) or _URL.match("file://")).group("scheme").lower()  # type: ignore[union-attr]
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as error:
        package = SCHEME_PACKAGES.get(scheme, f"fsspec's {scheme} backend")
        extra = " (pip install 'tokenmill[s3]')" if package == "s3fs" else ""
        raise ImportError(f"{scheme}:// locations need {package}{extra}: {mask_secrets(str(error))}") from None


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
        the last failure is raised as OSError naming `what`, credentials masked."""
        for attempt in range(1, self.attempts + 1):
            try:
                return operation()
            except Exception as error:
                if not is_transient(error):
                    raise
                if attempt == self.attempts:
                    message = mask_secrets(f"{what}: still failing after {attempt} tries: {error}")
                    raise OSError(message) from None
                delay = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
                self.retried += 1
                self.waited_s += delay
                time.sleep(delay)
        raise AssertionError("unreachable")
