"""Errors raised by tokenmill_loader."""
from __future__ import annotations


class DatasetError(ValueError):
    """A dataset on disk does not match its metadata (size, dtype, offsets, shard list, checksum).

    The message always names the offending file.
    """
