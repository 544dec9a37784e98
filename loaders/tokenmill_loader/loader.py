"""DataLoader: torch's DataLoader with a resumable, consumption-counting state."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
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
from .shared import BatchRing, RingBatch

# a remote store's prefetch plan: the shards of this many batches past those in flight, refreshed every PLAN_EVERY
# batches (a refresh costs two np.searchsorted over the plan's windows; PLAN_EVERY <= PLAN_BATCHES keeps every batch
# in flight inside the last plan, so none of its shards is evicted to make room)
PLAN_BATCHES = 16
PLAN_EVERY = 4


def long_labels_collate(samples, collate_fn):
    """`collate_fn`, then every `*labels` entry as int64."""
    return long_labels(collate_fn(samples))


def attach_ring(worker_id: int, ring: BatchRing, worker_init_fn=None) -> None:
    """worker_init_fn of a DataLoader whose workers read into `ring`: the worker's dataset takes its slots."""
    ring.attach(worker_id)
    info = torch.utils.data.get_worker_info()
    assert info is not None  # called in a DataLoader worker
    dataset: Any = info.dataset  # a tokenmill dataset: it reads into `batch_ring` once set
    dataset.batch_ring = ring
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


class _ResumableBatchSampler:
    """Batches of the sampler's remaining indices, read when an iterator starts (so resume works). With `plan` set
    (a remote store), it also tells the store which shards the batches in flight and the next ones need."""

    def __init__(self, sampler: ResumableSampler, batch_size: int, drop_last: bool):
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.plan: tuple[Any, Any] | None = None  # (dataset, store): a dataset with shards_of over a remote store
        self.in_flight = 0  # batches handed out before the current one and possibly not read yet (workers)

    def __iter__(self):
        bs = self.batch_size
        remaining, plan = self.sampler.remaining(), self.plan
        k = 0  # batches yielded
        for chunk in iter_chunks(remaining, bs * 256):  # whole batches per chunk
            for i in range(0, len(chunk), bs):
                b = chunk[i : i + bs]
                if len(b) < bs and self.drop_last:
                    return
                if plan is not None and k % PLAN_EVERY == 0:
                    self._plan(plan, remaining, k)
                k += 1
                yield b.tolist()

    def _plan(self, plan: tuple[Any, Any], remaining, k: int) -> None:
        """The remote store's prefetch plan from batch k on: the shards of batches k .. k + ahead in the order they
        are first needed, kept with those of the batches in flight before k."""
        dataset, store = plan
        bs = self.batch_size
        ahead = max(PLAN_BATCHES, 2 * self.in_flight)
        begin, end = k * bs, min(len(remaining), (k + ahead) * bs)
        if self.drop_last:  # the epoch's partial last batch is never read
            end -= (end - begin) % bs
        upcoming = dataset.shards_of(np.asarray(remaining[begin:end]))
        in_flight = dataset.shards_of(np.asarray(remaining[max(0, k - self.in_flight) * bs : begin]))
        store.plan(upcoming, in_flight)

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
    - Workers (num_workers > 0) over a dataset with `batch_nbytes` (TokenDataset, default collate) read each
      batch into a slot of a BatchRing, shared memory mapped once before they start, and send only where it
      lies; the batch's tensors view the slot, which is reused once the caller has dropped them
      (benchmarks/bench_loader.py: a fraction of the in-process rate when torch sent every batch as a new
      shared-memory segment; docs/profile.md, 'The loader against Megatron-Core, OLMo-core and LitData').
      Batches are identical to the in-process path's.
    - Over a remote store (`open_store("s3://...", cache_dir=...)`, a dataset with `shards_of`), the main process
      walks its batches PLAN_BATCHES ahead every PLAN_EVERY batches and has the store download the shards they need
      in that order (remote.py), so workers find them cached; the batches are unchanged.
    - num_workers defaults to 0: with vectorized batch reads from the page cache the main process is
      fastest (see benchmarks/bench_loader.py).
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
        # slot size for a BatchRing: only for batches get_batch fills whole (default collate)
        ring_slot_bytes = (
            dataset.batch_nbytes(batch_size)
            if num_workers > 0 and collate_fn is batched_collate and hasattr(dataset, "batch_nbytes")
            else 0
        )
        worker_init_fn = kwargs.pop("worker_init_fn", None)
        batch_sampler = _ResumableBatchSampler(sampler, batch_size, drop_last)
        super().__init__(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            worker_init_fn=worker_init_fn,
            **kwargs,
        )
        self.resumable_sampler = sampler
        store: Any = getattr(dataset, "store", None)
        if callable(getattr(dataset, "shards_of", None)) and getattr(store, "is_remote", False):
            # prefetching follows this loader's batches (walked ahead here, in the main process), not the stream
            store.follow_plan()
            batch_sampler.plan = (dataset, store)
            batch_sampler.in_flight = num_workers * (self.prefetch_factor or 0)
        self._ring_slot_bytes = ring_slot_bytes
        self._user_worker_init_fn = worker_init_fn
        self._ring: BatchRing | None = None
        self.shared_memory_batches = 0  # batches that came through a BatchRing (the rest: torch's own way)
        self._per_batch = batch_size
        self._collate = collate_fn
        self.set_compact_labels(compact_labels)

    def set_compact_labels(self, compact: bool) -> None:
        """Labels in the dataset's compact dtype (True) or int64 (False), from the next iter() on (persistent
        workers keep the collate they started with)."""
        self.compact_labels = bool(compact)
        if compact or self._ring_slot_bytes:  # with a ring, labels widen as they are copied out (__iter__)
            self.collate_fn = self._collate
        else:
            self.collate_fn = functools.partial(long_labels_collate, collate_fn=self._collate)

    def _ring_for_workers(self) -> BatchRing | None:
        """The BatchRing of the workers the next iterator uses: persistent workers keep theirs; workers started
        anew get a new one (an earlier iterator's workers may still be writing into the last)."""
        if not self._ring_slot_bytes:
            return None
        if self._ring is None or not (self.persistent_workers and self._iterator is not None):
            # a slot per batch torch keeps in flight per worker, plus the two a loop holds (the batch in use while
            # the next is fetched) and one spare
            assert self.prefetch_factor is not None  # torch sets it whenever num_workers > 0, which a ring needs
            self._ring = BatchRing(self.num_workers, self.prefetch_factor + 3, self._ring_slot_bytes)
            self.worker_init_fn = functools.partial(
                attach_ring, ring=self._ring, worker_init_fn=self._user_worker_init_fn
            )
        return self._ring

    def __iter__(self):
        s = self.resumable_sampler
        if s.position >= s.num_samples():  # the previous epoch was fully consumed
            s.set_epoch(s.epoch + 1)
        ring = self._ring_for_workers()
        it = super().__iter__()
        epoch = s.epoch
        for batch in it:
            if isinstance(batch, RingBatch):
                assert ring is not None  # only workers reading into a ring send a RingBatch
                batch = ring.open(batch, long_labels=not self.compact_labels, pin=self.pin_memory)
                self.shared_memory_batches += 1
            elif ring is not None and not self.compact_labels:  # a worker found no free slot
                batch = long_labels(batch)
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
