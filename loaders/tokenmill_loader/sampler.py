"""ResumableSampler: seeded per-epoch shuffle, rank x worker sharding, O(1) exact resume."""
from __future__ import annotations

import numpy as np
import torch


class ResumableSampler(torch.utils.data.Sampler):
    """Deterministic order over `length` items for one data-parallel rank, resumable mid-epoch.

    - Order of epoch e: a permutation drawn from np.random.SeedSequence((seed, e)), so every
      (seed, epoch) pair has its own order, and an epoch's order does not depend on how many epochs
      are run (or on batch size, rank count or worker count). shuffle=False: 0..length-1.
    - Rank r of world_size W gets perm[r::W] (disjoint strided shares that together cover the epoch).
      drop_last=True trims every rank to the same whole number of batches (what DDP needs); the
      trimmed tail is skipped for this epoch only. drop_last=False: shares may differ by one item.
    - Worker sharding (for iterable use): `shard(epoch, worker_id, num_workers)` is the rank share
      [worker_id::num_workers]; disjoint across workers, together the rank share.
    - State is (epoch, position): `position` items of this rank's share were consumed. Resuming
      regenerates the permutation from the seed and slices it: no replay, the cost does not depend on
      the position.
    """

    def __init__(self, length: int, batch_size: int = 1, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1, drop_last: bool = False):
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
        self.epoch = 0
        self.position = 0
        self._cache: tuple[int, np.ndarray] | None = None

    # -- orders
    def permutation(self, epoch: int) -> np.ndarray:
        """The full order of `epoch` (all ranks), int64."""
        if not self.shuffle:
            return np.arange(self.length, dtype=np.int64)
        rng = np.random.default_rng(np.random.SeedSequence((self.seed, int(epoch))))
        return rng.permutation(self.length).astype(np.int64, copy=False)

    def num_samples(self) -> int:
        """Items of this rank per epoch."""
        if self.drop_last:
            return (self.length // self.world_size // self.batch_size) * self.batch_size
        return len(range(self.rank, self.length, self.world_size))

    def rank_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's share of `epoch` (cached for the last epoch asked)."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        idx = self.permutation(epoch)[self.rank::self.world_size][:self.num_samples()]
        self._cache = (epoch, idx)
        return idx

    def shard(self, epoch: int | None = None, worker_id: int = 0, num_workers: int = 1) -> np.ndarray:
        """Indices of stream (rank, worker_id): the rank share [worker_id::num_workers]."""
        return self.rank_indices(epoch)[worker_id::num_workers]

    # -- Sampler protocol
    def __iter__(self):
        idx = self.rank_indices(self.epoch)[self.position:]
        return iter(idx.tolist())

    def __len__(self) -> int:
        return self.num_samples()

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning."""
        self.epoch = int(epoch)
        self.position = 0

    def remaining(self) -> np.ndarray:
        """Indices of this rank not yet consumed in the current epoch."""
        return self.rank_indices(self.epoch)[self.position:]

    def advance(self, n: int) -> None:
        """Mark n more items consumed; rolls into the next epoch at the end of this one."""
        self.position += int(n)
        if self.position >= self.num_samples():
            self.epoch += 1
            self.position = 0

    # -- state
    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "length": self.length, "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        for k in ("seed", "shuffle", "length", "world_size", "rank"):
            if k in state and state[k] != getattr(self, k):
                raise ValueError(f"sampler state has {k}={state[k]!r}, this sampler {getattr(self, k)!r}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
