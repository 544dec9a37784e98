"""tokenmill_loader: memory-mapped datasets, resumable sampling, packing, mixing and GPU prefetch
for tokenmill token shards (docs/format.md). Depends on numpy and torch only.

Names are imported on first use, so `tokenmill_loader.format` (numpy only) loads without torch: tokenmill's
writer imports it in every worker process.
"""

from __future__ import annotations

import importlib

from .format import DatasetError

_SOURCES = {
    "open_store": ".store",
    "Store": ".store",
    "TokenDataset": ".datasets",
    "RecordDataset": ".datasets",
    "pad_collate": ".datasets",
    "batched_collate": ".datasets",
    "IGNORE_INDEX": ".datasets",
    "ResumableSampler": ".sampler",
    "DataLoader": ".loader",
    "PackingLoader": ".packing",
    "MixedLoader": ".mixing",
    "DevicePrefetcher": ".prefetch",
    "trace_step": ".trace",
    "find_windows": ".trace",
}
__all__ = ["DatasetError", *_SOURCES]
__version__ = "0.2.0"


def __getattr__(name: str):
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_SOURCES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
