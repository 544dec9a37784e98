"""PackingLoader: pool-based greedy bin packing of variable-length samples (DataPacker semantics)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .datasets import IGNORE_INDEX, check_state_version, long_labels, with_version
from .sampler import ResumableSampler, iter_chunks


class _Items(torch.utils.data.Dataset):
    """Per-item view of a dataset (hides __getitems__ so worker chunks are lists of samples)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i]


class _Chunked:
    """An index sequence (array or LazyIndices) as a sampler, materialized chunk by chunk."""

    def __init__(self, indices):
        self.indices = indices

    def __len__(self):
        return len(self.indices)

    def __iter__(self):
        for chunk in iter_chunks(self.indices, 4096):
            yield from chunk.tolist()


def _list_collate(samples):
    return samples


def _num_tokens(sample) -> int:
    return int(sample["input_ids"].shape[-1])


class PackingLoader:
    """Packs variable-length samples (e.g. RecordDataset sft records) into token-budget batches.

    Source order: ResumableSampler(seed, shuffle, rank, world_size, even=False) over the dataset: the ranks
    together read every sample, and get different numbers of batches (with DDP, stop every rank when the
    first runs out, e.g. an all_reduce of a "done" flag each step). The loader keeps
    a pool of up to `pool_size` samples and forms each batch by greedy bin packing:

    - the oldest sample in the pool starts the batch (no sample waits forever);
    - candidates are added while the batch has fewer than `max_batch_size` samples and the batch
      stays within `max_tokens` (flat: sum of lengths; padded: batch size x longest sample);
      `prefer_closest` (default) adds the candidate closest to the space left (flat: the longest
      sample that fits, i.e. best fit; padded: the length closest to the batch's longest, i.e. least
      padding); `prefer_first` adds the oldest that fits;
    - a sample with at least `long_threshold` tokens is emitted alone as soon as it is read, and a
      sample longer than `max_tokens` always forms a singleton batch: nothing is ever dropped or cut.
      Every batch of two or more samples fits `max_tokens`.

    The pool is refilled after every batch; at the end of the source it is drained, and the epoch ends.
    Packing runs in the calling process: worker processes (num_workers > 0) only read samples in
    source order, so the batches do not depend on num_workers.

    Output `flat` (default): `input_ids`, `labels`, `position_ids` of shape (1, T), `cu_seqlens`
    (int32, num_samples + 1), `max_seqlen`, `indices` (dataset indices of the samples). Labels are
    -100 at the first token of each sample, so the model's single shift never predicts across samples.
    Output `padded`: (B, Lmax) tensors with `attention_mask`, labels -100 and `pad_id` on padding.
    Labels are int64 (what F.cross_entropy takes) unless `compact_labels=True` (DevicePrefetcher sets it
    while it iterates), as in DataLoader.

    Resumable, counting source samples: state = (epoch, source position of the next unread sample,
    source positions of the samples left in the pool); loading it re-reads exactly that pool.
    """

    def __init__(
        self,
        dataset,
        max_tokens: int,
        pool_size: int = 16,
        max_batch_size: int | None = None,
        long_threshold: int | None = None,
        strategy: str = "prefer_closest",
        output: str = "flat",
        pad_id: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        num_tokens: Callable | None = None,
        collate_fn: Callable | None = None,
        pin_memory: bool | None = None,
        read_chunk: int = 32,
        full_shuffle_max: int = 1 << 22,
        compact_labels: bool = False,
    ):
        if strategy not in ("prefer_closest", "prefer_first"):
            raise ValueError(f"strategy must be prefer_closest or prefer_first, not {strategy!r}")
        if output not in ("flat", "padded"):
            raise ValueError(f"output must be flat or padded, not {output!r}")
        if max_tokens < 1 or pool_size < 1:
            raise ValueError("max_tokens and pool_size must be >= 1")
        self.dataset = dataset
        self.max_tokens = int(max_tokens)
        self.pool_size = int(pool_size)
        self.max_batch_size = int(max_batch_size) if max_batch_size else 1 << 30
        self.long_threshold = int(long_threshold) if long_threshold else 1 << 62
        self.strategy = strategy
        self.output = output
        self.pad_id = int(pad_id)
        self.num_workers = int(num_workers)
        self.num_tokens = num_tokens or _num_tokens
        self.collate_fn = collate_fn
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self.read_chunk = int(read_chunk)
        self.compact_labels = bool(compact_labels)
        self.sampler = ResumableSampler(
            len(dataset),
            1,
            seed,
            shuffle,
            rank,
            world_size,
            drop_last=False,
            full_shuffle_max=full_shuffle_max,
            even=False,
        )
        self.epoch = 0
        self._src_pos = 0  # next source position (index into this rank's order) to read
        self._pool_pos: list[int] = []  # source positions of the samples in the pool, pool order

    # ------------------------------------------------------------------ state
    def _epoch_done(self) -> bool:
        return self._src_pos >= self.sampler.num_samples() and not self._pool_pos

    def state_dict(self) -> dict:
        if self._epoch_done():  # everything of this epoch was yielded: resume at the next epoch
            state = {"epoch": self.epoch + 1, "source_position": 0, "pool": []}
        else:
            state = {"epoch": self.epoch, "source_position": self._src_pos, "pool": list(self._pool_pos)}
        return with_version({**state, "seed": self.sampler.seed, "length": self.sampler.length}, self.dataset)

    def load_state_dict(self, state: dict) -> None:
        check_state_version(state, self.dataset)
        if state.get("length", self.sampler.length) != self.sampler.length:
            raise ValueError("packing state is for a dataset of another length")
        self.epoch = int(state["epoch"])
        self._src_pos = int(state["source_position"])
        self._pool_pos = [int(p) for p in state["pool"]]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._src_pos = 0
        self._pool_pos = []

    def set_compact_labels(self, compact: bool) -> None:
        """Labels in the dataset's compact dtype (True) or int64 (False)."""
        self.compact_labels = bool(compact)

    # ------------------------------------------------------------------ source
    def _source(self, order: np.ndarray, start: int):
        """Samples at source positions start, start+1, ... (in order), as (position, sample)."""
        rest = order[start:]
        if self.num_workers <= 0:
            pos = start
            for chunk in iter_chunks(rest, 4096):
                for i in chunk.tolist():
                    yield pos, i, self.dataset[i]
                    pos += 1
            return
        dl = torch.utils.data.DataLoader(
            _Items(self.dataset),
            sampler=_Chunked(rest),
            batch_size=self.read_chunk,
            collate_fn=_list_collate,
            num_workers=self.num_workers,
            prefetch_factor=4,
        )
        pos = start
        idx_iter = iter(_Chunked(rest))
        for chunk in dl:
            for s in chunk:
                yield pos, next(idx_iter), s
                pos += 1

    # ------------------------------------------------------------------ packing
    def _select(self, lens: np.ndarray) -> list[int]:
        """Pool slots (into lens, pool order) of the next batch."""
        n0 = int(lens[0])
        batch = [0]
        if n0 >= self.max_tokens or self.max_batch_size == 1:
            return batch
        avail = np.ones(len(lens), dtype=bool)
        avail[0] = False
        used, longest = n0, n0
        padded = self.output == "padded"
        while len(batch) < self.max_batch_size:
            if padded:
                fits = avail & ((len(batch) + 1) * np.maximum(lens, longest) <= self.max_tokens)
            else:
                fits = avail & (lens <= self.max_tokens - used)
            cand = np.flatnonzero(fits)
            if not len(cand):
                break
            if self.strategy == "prefer_first":
                k = int(cand[0])
            elif padded:
                k = int(cand[np.argmin(np.abs(lens[cand] - longest))])
            else:
                k = int(cand[np.argmax(lens[cand])])  # first maximum: ties go to the oldest
            batch.append(k)
            avail[k] = False
            used += int(lens[k])
            longest = max(longest, int(lens[k]))
        return batch

    def __iter__(self):
        if self._epoch_done():  # the previous epoch was fully yielded (caller stopped at its last batch)
            self.set_epoch(self.epoch + 1)
        order = self.sampler.rank_indices(self.epoch)
        epoch = self.epoch
        # rebuild the pool exactly (resume) from its source positions
        pool = []
        for p in self._pool_pos:
            i = int(order[p])
            s = self.dataset[i]
            pool.append((p, i, s, self.num_tokens(s)))
        src = self._source(order, self._src_pos)
        exhausted = False
        next_pos = self._src_pos
        try:
            while True:
                while len(pool) < self.pool_size and not exhausted:
                    try:
                        p, i, s = next(src)
                    except StopIteration:
                        exhausted = True
                        break
                    next_pos = p + 1
                    n = self.num_tokens(s)
                    if n >= self.long_threshold:
                        self._src_pos, self._pool_pos = next_pos, [x[0] for x in pool]
                        yield self._collate([(p, i, s, n)])
                        continue
                    pool.append((p, i, s, n))
                if not pool:
                    break
                lens = np.fromiter((x[3] for x in pool), dtype=np.int64, count=len(pool))
                slots = self._select(lens)
                chosen = [pool[k] for k in slots]
                taken = set(slots)
                pool = [x for k, x in enumerate(pool) if k not in taken]
                self._src_pos, self._pool_pos = next_pos, [x[0] for x in pool]
                yield self._collate(chosen)
        finally:
            src.close()
        if self.epoch == epoch:
            self.set_epoch(epoch + 1)

    # ------------------------------------------------------------------ collation
    def _collate(self, chosen) -> dict:
        samples = [x[2] for x in chosen]
        if self.collate_fn is not None:
            return self.collate_fn(samples)
        idx = torch.tensor([x[1] for x in chosen], dtype=torch.int64)
        batch = self._flat(samples) if self.output == "flat" else self._padded(samples)
        batch["indices"] = idx
        if not self.compact_labels:
            batch = long_labels(batch)
        if self.pin_memory:
            batch = {k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
        return batch

    def _flat(self, samples) -> dict:
        lens = [int(s["input_ids"].shape[-1]) for s in samples]
        ids = torch.cat([s["input_ids"] for s in samples])
        if "labels" in samples[0]:
            labels = torch.cat([s["labels"] for s in samples])
        else:
            labels = ids.clone()
        cu = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(lens, out=cu[1:])
        starts = torch.from_numpy(cu[:-1].astype(np.int64))
        labels[starts[torch.tensor(lens) > 0]] = IGNORE_INDEX
        pos = torch.cat([torch.arange(n, dtype=torch.int32) for n in lens])
        return {
            "input_ids": ids[None],
            "labels": labels[None],
            "position_ids": pos[None],
            "cu_seqlens": torch.from_numpy(cu),
            "max_seqlen": max(lens) if lens else 0,
        }

    def _padded(self, samples) -> dict:
        lens = [int(s["input_ids"].shape[-1]) for s in samples]
        B, L = len(samples), max(lens)
        dt = samples[0]["input_ids"].dtype
        ids = torch.full((B, L), self.pad_id, dtype=dt)
        labels = torch.full((B, L), IGNORE_INDEX, dtype=dt)
        att = torch.zeros((B, L), dtype=torch.uint8)
        for i, s in enumerate(samples):
            n = lens[i]
            ids[i, :n] = s["input_ids"]
            labels[i, :n] = s["labels"] if "labels" in s else s["input_ids"]
            att[i, :n] = 1
        pos = (torch.arange(L, dtype=torch.int32)[None, :] * att).to(torch.int32)
        return {"input_ids": ids, "labels": labels, "position_ids": pos, "attention_mask": att}
