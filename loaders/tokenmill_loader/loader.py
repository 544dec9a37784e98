"""DataLoader: torch's DataLoader with a resumable, consumption-counting state."""

from __future__ import annotations

import functools

import torch
from torch.utils.data import default_collate

from .datasets import (
    RecordDataset,
    batched_collate,
    check_state_version,
    long_labels,
    pad_collate,
    with_version,
)
from .sampler import ResumableSampler, iter_chunks


def long_labels_collate(samples, collate_fn):
    """`collate_fn`, then every `*labels` entry as int64."""
    return long_labels(collate_fn(samples))


class _ResumableBatchSampler:
    """Batches of the sampler's remaining indices, read when an iterator starts (so resume works)."""

    def __init__(self, sampler: ResumableSampler, batch_size: int, drop_last: bool):
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        bs = self.batch_size
        for chunk in iter_chunks(self.sampler.remaining(), bs * 256):  # whole batches per chunk
            for i in range(0, len(chunk), bs):
                b = chunk[i : i + bs]
                if len(b) < bs and self.drop_last:
                    return
                yield b.tolist()

    def __len__(self) -> int:
        n = self.sampler.num_samples()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class DataLoader(torch.utils.data.DataLoader):
    """torch DataLoader over a map-style dataset with a seeded, sharded, resumable order.

    - Order: ResumableSampler(seed, shuffle, rank, world_size, drop_last); epoch e has its own order.
    - The loader is a cursor: each `iter()` continues where the trainer stopped; when an epoch has been
      fully yielded the next `iter()` starts the next epoch (or call `set_epoch`).
    - DDP (world_size > 1): every rank gets the same number of batches (the epoch's last
      len % world_size samples are left out, see ResumableSampler), so a collective per batch never hangs.
    - `state_dict()` counts batches yielded to the caller (not what workers prefetched), in samples:
      {epoch, position (samples of the epoch's order consumed by all ranks together), ...}, the same on
      every rank, plus the dataset `version` read (versioned datasets). `load_state_dict()` before iterating
      resumes at the next sample exactly, in any process, with any num_workers, batch_size or world_size (each
      rank passes its own rank and world_size); a state saved on another version is refused (DatasetError).
    - Datasets with `get_batch` (TokenDataset) are read one batch per vectorized call; their batches
      are already collated; RecordDataset batches are padded (pad_collate). pin_memory defaults
      to True only when CUDA is available.
    - `labels` (and `chosen_labels`, ...) come as int64, which F.cross_entropy needs when the batch is used
      as it is (CPU). `compact_labels=True` keeps them in the dataset's compact dtype (int32 for uint16
      tokens); DevicePrefetcher sets it while it iterates, since it upcasts on the device after a half-size copy.
    - num_workers defaults to 0: with vectorized batch reads from the page cache the main process is
      fastest (see benchmarks/bench_loader.py: worker processes pay for copying every batch between
      processes).
    """

    def __init__(
        self,
        dataset,
        batch_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool | None = None,
        full_shuffle_max: int = 1 << 22,
        compact_labels: bool = False,
        **kwargs,
    ):
        sampler = ResumableSampler(
            len(dataset),
            batch_size=batch_size,
            seed=seed,
            shuffle=shuffle,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            full_shuffle_max=full_shuffle_max,
        )
        if collate_fn is None:
            if hasattr(dataset, "get_batch"):
                collate_fn = batched_collate
            elif isinstance(dataset, RecordDataset):
                collate_fn = functools.partial(pad_collate, pad_id=dataset.pad_id)
            else:
                collate_fn = default_collate
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        super().__init__(
            dataset,
            batch_sampler=_ResumableBatchSampler(sampler, batch_size, drop_last),
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            **kwargs,
        )
        self.resumable_sampler = sampler
        self._per_batch = batch_size
        self._collate = collate_fn
        self.set_compact_labels(compact_labels)

    def set_compact_labels(self, compact: bool) -> None:
        """Labels in the dataset's compact dtype (True) or int64 (False), from the next iter() on (persistent
        workers keep the collate they started with)."""
        self.compact_labels = bool(compact)
        self.collate_fn = self._collate if compact else functools.partial(long_labels_collate, collate_fn=self._collate)

    def __iter__(self):
        s = self.resumable_sampler
        if s.position >= s.num_samples():  # the previous epoch was fully consumed
            s.set_epoch(s.epoch + 1)
        it = super().__iter__()
        epoch = s.epoch
        for batch in it:
            s.position = min(s.position + self._per_batch, s.num_samples())
            yield batch
        if s.epoch == epoch:
            s.set_epoch(epoch + 1)

    @property
    def epoch(self) -> int:
        return self.resumable_sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        self.resumable_sampler.set_epoch(epoch)

    def state_dict(self) -> dict:
        s = self.resumable_sampler
        if s.position >= s.num_samples():
            return with_version({**s.state_dict(), "epoch": s.epoch + 1, "position": 0}, self.dataset)
        return with_version(s.state_dict(), self.dataset)

    def load_state_dict(self, state: dict) -> None:
        check_state_version(state, self.dataset)
        self.resumable_sampler.load_state_dict(state)
