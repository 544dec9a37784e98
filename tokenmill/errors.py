"""The errors tokenmill raises, one class per kind of cause, so callers (and users reading a failed run) can tell
them apart. Every message names the file, line, field or key at fault.

Policy for malformed input:
- A *source* file the user gave us that is unreadable or malformed line by line is not an error: the line is
  quarantined in the stage's ``_rejected.jsonl`` with its reason and the run goes on (raw_records).
- A line of a stage's *own* output that fails to parse (cleaned_jsonl, deduped_jsonl, ...) is corruption:
  the reading stage raises :class:`CorruptOutputError` naming the file and line, and never drops it silently.
"""

from __future__ import annotations


class TokenmillError(Exception):
    """Base class of every error tokenmill raises on purpose."""


class SourceError(TokenmillError):
    """The corpus source is missing, empty or unreadable (TOKENMILL_SOURCE)."""


class ConfigError(TokenmillError, ValueError):
    """A stage setting is invalid; the message names the field (``dedup_report.keep: ...``)."""


class CorruptOutputError(TokenmillError):
    """A file a tokenmill stage wrote does not parse or does not match its manifest (file and line named)."""


class SourceChangedError(TokenmillError):
    """Source files already ingested in a batch changed or disappeared, or the data root holds another corpus:
    only a full rebuild (`tokenmill update --rebuild`) can take them back out (files and batches named)."""


class UnknownBatchError(TokenmillError):
    """A run's partition key is not a source batch of the data root's registry (a key typed into the partition
    dialog, or added through GraphQL or the API): refused before anything touches the disk."""


class StaleUpstreamError(TokenmillError):
    """An upstream stage's output is missing or was built for other inputs/settings: materialize it first."""


class CheckFailedError(TokenmillError):
    """A blocking check failed on a stage's staged output; it was not published and the previous output stays."""


class DataRootBusyError(TokenmillError):
    """Another run holds the data root's lock; the message names the holder run."""


class DiskFullError(TokenmillError):
    """The data root's file system has no room for what a stage writes (the file or folder, the bytes needed when
    known and the bytes free named); the stage's previous output stays published."""


class CapacityError(TokenmillError):
    """A value does not fit the on-disk format (token ids beyond the dtype, offsets beyond int64, ...)."""


class ComputeError(TokenmillError):
    """The compute engine failed a step: a Ray cluster unreachable, a node or worker lost past its retries, a node
    that cannot see the data root (the step, node and address named)."""


TOKENMILL_ERRORS = {"TokenmillError", *(cls.__name__ for cls in TokenmillError.__subclasses__())}


def failure_reason(error) -> str:
    """The TokenmillError at the root of a step failure (one line a user can act on), else the outermost error.
    `error` is Dagster's serialized error (cls_name, message, cause), read by name: this module imports no Dagster."""
    outer = error
    while error is not None:
        if error.cls_name in TOKENMILL_ERRORS:  # Dagster records it as "<module>.<class>: <message>"
            return error.message.strip().removeprefix("tokenmill.errors.")
        error = error.cause
    return outer.message.strip()
