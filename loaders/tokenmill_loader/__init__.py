"""tokenmill_loader: memory-mapped datasets, resumable sampling, packing, mixing and GPU prefetch
for tokenmill token shards (docs/format.md). Depends on numpy and torch only.
"""
from .datasets import IGNORE_INDEX, RecordDataset, TokenDataset, batched_collate, pad_collate
from .errors import DatasetError
from .loader import DataLoader
from .mixing import MixedLoader
from .packing import PackingLoader
from .prefetch import DevicePrefetcher
from .sampler import ResumableSampler
from .store import Store, open_store

__all__ = ["open_store", "Store", "DatasetError", "TokenDataset", "RecordDataset", "ResumableSampler",
           "DataLoader", "PackingLoader", "MixedLoader", "DevicePrefetcher", "pad_collate", "batched_collate",
           "IGNORE_INDEX"]
__version__ = "0.1.0"
