"""ResumableSampler: seeded per-epoch shuffle, rank x worker sharding, O(1) exact resume."""

from __future__ import annotations

import copy
import operator

import numpy as np
import torch

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S1, _S2, _S3 = np.uint64(30), np.uint64(27), np.uint64(31)


class FeistelPermutation:
    """A keyed pseudo-random bijection of range(n), evaluated at any positions in O(1) memory.

    A balanced Feistel network (6 rounds, splitmix64-style round function, keys from the SeedSequence)
    permutes [0, 4^h) with 4^h >= n; cycle walking (re-encrypting values >= n) restricts it to a
    bijection of [0, n). Used instead of a materialized permutation for very long epochs, so start-up
    and resume cost does not grow with the dataset.
    """

    ROUNDS = 6

    def __init__(self, n: int, seed_seq: np.random.SeedSequence):
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        bits += bits & 1
        self.h = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        self.keys = [np.uint64(k) for k in seed_seq.generate_state(self.ROUNDS, dtype=np.uint64)]

    def _round(self, r: np.ndarray, k: np.uint64) -> np.ndarray:
        z = r ^ k
        z = (z ^ (z >> _S1)) * _M1
        z = (z ^ (z >> _S2)) * _M2
        return (z ^ (z >> _S3)) & self.mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.h, x & self.mask
        for k in self.keys:
            left, right = right, left ^ self._round(right, k)
        return (left << self.h) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        y = self._encrypt(np.asarray(positions, dtype=np.uint64))
        out = y >= self.n
        while out.any():  # cycle walking: stays a bijection on [0, n)
            y[out] = self._encrypt(y[out])
            out = y >= self.n
        return y.astype(np.int64)


class LazyIndices:
    """perm[start + step * j] for j in range(count): a lazily evaluated slice of a FeistelPermutation.

    Supports len(), integer indexing, slicing with a positive step (gives another LazyIndices),
    np.asarray() and tolist(); everything a materialized index array is used for here.
    """

    def __init__(self, perm: FeistelPermutation, start: int, step: int, count: int):
        self.perm, self.start, self.step, self.count = perm, int(start), int(step), max(0, int(count))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, key):
        if isinstance(key, slice):
            a, b, s = key.indices(self.count)
            if s <= 0:
                raise ValueError("only positive slice steps")
            return LazyIndices(self.perm, self.start + self.step * a, self.step * s, len(range(a, b, s)))
        j = operator.index(key)
        if j < 0:
            j += self.count
        if not 0 <= j < self.count:
            raise IndexError(j)
        return int(self.perm(np.array([self.start + self.step * j]))[0])

    def __array__(self, dtype=None, copy=None):
        pos = self.start + self.step * np.arange(self.count, dtype=np.int64)
        a = self.perm(pos)
        return a if dtype is None else a.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()


def iter_chunks(indices, size: int = 8192):
    """Materialized chunks (int64 arrays) of an index array or LazyIndices."""
    for i in range(0, len(indices), size):
        yield np.asarray(indices[i : i + size])


def dealt_to(order_positions: np.ndarray, start: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(rank, item of the rank's share) of each position of an epoch's order dealt out from `start`: the inverse of
    `rank_indices`, whose rank r takes positions start + r, start + r + world_size, ... (only positions >= start
    were dealt; a share's length cuts off the epoch's tail, see `_share_len`)."""
    item, rank = np.divmod(np.asarray(order_positions, dtype=np.int64) - start, world_size)
    return rank, item


class ResumableSampler(torch.utils.data.Sampler):
    """Deterministic order over `length` items for one data-parallel rank, resumable mid-epoch.

    - Order of epoch e: a permutation drawn from np.random.SeedSequence((seed, e)), so every
      (seed, epoch) pair has its own order, and an epoch's order does not depend on how many epochs
      are run (or on batch size, rank count or worker count). shuffle=False: 0..length-1.
      Up to `full_shuffle_max` items (default 2^22) the permutation is numpy's (uniform); above it a
      keyed Feistel bijection (also from the SeedSequence) is evaluated lazily, so start-up and resume
      stay O(1) in time and memory for any length.
    - Rank r of world_size W gets perm[r::W], and every rank gets the same number of items, so
      ranks stepping together (DDP: a collective per batch) all reach the end of the epoch at the
      same batch. drop_last=False (default): the epoch's last len % W items are left out (fewer than
      W, a different few each epoch since the order changes); with W = 1 nothing is left out.
      Left out rather than padded with repeats (torch's DistributedSampler pads by default): an epoch
      then holds every sample at most once, which exact resume and sample accounting rely on.
      drop_last=True: whole batches only, the same number on every rank. even=False: shares differ by
      at most one and together cover the epoch (PackingLoader: its batch counts differ across ranks anyway).
    - Worker sharding (for iterable use): `shard(epoch, worker_id, num_workers)` is the rank share
      [worker_id::num_workers]; disjoint across workers, together the rank share.
    - State is (epoch, position) in samples of the epoch's global order: ranks move in lockstep, so
      after each rank consumed p items the first p * W items of the order are consumed, whatever
      the rank: every rank saves the same state. Loading it under any world size (and rank,
      batch size or worker count) deals the rest of the order, perm[position:], out as above:
      no sample is seen twice or skipped. Resuming regenerates the order from the seed and slices
      it: no replay, the cost does not depend on the position.
    """

    def __init__(
        self,
        length: int,
        batch_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        full_shuffle_max: int = 1 << 22,
        even: bool = True,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in [0, {world_size})")
        if seed < 0:
            raise ValueError("seed must be >= 0")
        self.length = int(length)
        self.batch_size = max(1, int(batch_size))
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self.even = bool(even)
        self.lazy = self.shuffle and self.length > full_shuffle_max
        self.epoch = 0
        self.start = 0  # items of the epoch's order consumed before this share (by any world size)
        self.position = 0  # items of this rank's share consumed
        self._cache: tuple[tuple[int, int], object] | None = None

    # -- orders
    def _seed_seq(self, epoch: int) -> np.random.SeedSequence:
        return np.random.SeedSequence((self.seed, int(epoch)))

    def permutation(self, epoch: int) -> np.ndarray:
        """The full order of `epoch` (all ranks), int64 (materialized even when lazy)."""
        if not self.shuffle:
            return np.arange(self.length, dtype=np.int64)
        if self.lazy:
            return np.asarray(LazyIndices(FeistelPermutation(self.length, self._seed_seq(epoch)), 0, 1, self.length))
        rng = np.random.default_rng(self._seed_seq(epoch))
        return rng.permutation(self.length).astype(np.int64, copy=False)

    def _share_len(self, start: int) -> int:
        """Items per rank when the epoch's order is dealt out from `start` (the same on every rank when even)."""
        if not self.even:
            return len(range(start + self.rank, self.length, self.world_size))
        per_rank = (self.length - start) // self.world_size
        return per_rank // self.batch_size * self.batch_size if self.drop_last else per_rank

    def num_samples(self) -> int:
        """Items of this rank in the current epoch (after a resume: those left)."""
        return self._share_len(self.start)

    def rank_indices(self, epoch: int | None = None):
        """This rank's share of `epoch`: an int64 array, or LazyIndices for lazy orders (cached).
        The current epoch's share starts after the `start` items consumed before a resume; others at 0."""
        epoch = self.epoch if epoch is None else int(epoch)
        start = self.start if epoch == self.epoch else 0
        if self._cache is not None and self._cache[0] == (epoch, start):
            return self._cache[1]
        count = self._share_len(start)
        first = start + self.rank
        idx: LazyIndices | np.ndarray
        if self.lazy:
            idx = LazyIndices(FeistelPermutation(self.length, self._seed_seq(epoch)), first, self.world_size, count)
        else:
            idx = self.permutation(epoch)[first :: self.world_size][:count]
        self._cache = ((epoch, start), idx)
        return idx

    def share_len(self, epoch: int | None = None) -> int:
        """Items of this rank in `epoch` (the current epoch: from the `start` of a resume; any other: from 0)."""
        epoch = self.epoch if epoch is None else int(epoch)
        return self._share_len(self.start if epoch == self.epoch else 0)

    def for_rank(self, rank: int) -> ResumableSampler:
        """A copy at the same epoch and positions dealing rank `rank`'s share (tokenmill_loader.trace: every rank's
        batches from one loader's settings)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} not in [0, {self.world_size})")
        other = copy.copy(self)
        other.rank, other._cache = int(rank), None
        return other

    def shard(self, epoch: int | None = None, worker_id: int = 0, num_workers: int = 1):
        """Indices of stream (rank, worker_id): the rank share [worker_id::num_workers]."""
        return self.rank_indices(epoch)[worker_id::num_workers]

    # -- Sampler protocol
    def __iter__(self):
        for chunk in iter_chunks(self.remaining()):
            yield from chunk.tolist()

    def __len__(self) -> int:
        return self.num_samples()

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning. The current epoch keeps its position, so the usual
        `for e in range(start, E): loader.set_epoch(e)` loop after load_state_dict resumes mid-epoch."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.start = self.position = 0

    def remaining(self):
        """Indices of this rank not yet consumed in the current epoch."""
        return self.rank_indices(self.epoch)[self.position :]

    def advance(self, n: int) -> None:
        """Mark n more items consumed; rolls into the next epoch at the end of this one."""
        self.position += int(n)
        if self.position >= self.num_samples():
            self.set_epoch(self.epoch + 1)

    # -- state
    def state_dict(self) -> dict:
        """{epoch, position: samples of the epoch's order consumed by all ranks together, seed, shuffle, length};
        the same on every rank."""
        return {
            "epoch": self.epoch,
            "position": self.start + self.position * self.world_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "length": self.length,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from a state saved by any rank under any world size; this sampler keeps its own rank and
        world_size."""
        for k in ("seed", "shuffle", "length"):
            if k in state and state[k] != getattr(self, k):
                raise ValueError(f"sampler state has {k}={state[k]!r}, this sampler {getattr(self, k)!r}")
        position = int(state["position"])
        if "rank" in state:  # saved by tokenmill_loader 0.1: a per-rank position, ranks in lockstep
            position *= int(state.get("world_size", 1))
        if not 0 <= position <= self.length:
            raise ValueError(f"sampler state position {position} not in [0, {self.length}]")
        self.epoch = int(state["epoch"])
        self.start, self.position = position, 0
