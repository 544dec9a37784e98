"""BatchRing: DataLoader workers write batches into shared memory mapped once, and send only where they lie.

torch moves every tensor a worker returns through a new shared-memory segment whose file descriptor crosses a socket;
for a (3, 32, 2048) int32 batch that made 2 workers a fraction as fast as reading in the main process
(benchmarks/bench_loader.py; docs/profile.md, 'The loader against Megatron-Core, OLMo-core and LitData'). A ring is a
set of shared-memory slots created before the workers start: each worker owns `slots` of them, reads a batch straight
into a free one (TokenDataset.get_batch), and sends a RingBatch, a few hundred bytes. The main process hands the caller
tensors that view the slot (no copy) and frees the slot once no tensor uses its memory any more (the storage's use
count, checked as later batches arrive). Copies are made only where the caller needs other memory: pinned batches, int64
labels from compact data. A worker that finds none of its slots free (the caller keeps many batches, or a discarded
iterator still held them) reads into a fresh tensor sent the torch way: slower, never blocked, never overwriting a batch
still in use. Batches are byte for byte those of the in-process path.
"""

from __future__ import annotations

import sys
import uuid
import weakref

import numpy as np
import torch

# rings of this process by token: a RingBatch dropped unread (torch discards prefetched batches when an iterator
# is reset or shut down) frees its slot through it
_RINGS: weakref.WeakValueDictionary[str, BatchRing] = weakref.WeakValueDictionary()
# references to a storage's memory (tensors, views, storages); private to torch (its multiprocessing uses it):
# without it every batch is copied out of its slot instead of lent
_use_count = getattr(torch._C, "_storage_Use_Count", None)
_BY_VALUE_MAX_BYTES = 1 << 16  # tensors outside a slot up to this size travel pickled (cu_seqlens), not as segments


def _nbytes(shape, dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


class RingBatch:
    """What a worker sends for a batch in a slot: the slot, and per key either (byte offset, shape, dtype) in
    the slot or the value itself."""

    # what __del__ uses, held by the class: at interpreter exit Python sets the modules' globals to None (`_RINGS`,
    # `sys`) before the last batches in flight (torch's iterator keeps those that arrived out of order) are freed
    _rings = _RINGS
    _finalizing = staticmethod(sys.is_finalizing)

    def __init__(self, token: str, slot: int, entries: dict):
        self.token, self.slot, self.entries = token, slot, entries
        self.pending = False  # True once received and not yet opened: dropping it frees the slot

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.pending = True

    def __del__(self):
        # at exit no worker will take the slot again: nothing to free (and weakref's globals may be gone too)
        if self.pending and not self._finalizing():
            ring = self._rings.get(self.token)
            if ring is not None:
                ring.release(self.slot)


class BatchRing:
    """`slots` shared-memory slots of `slot_bytes` per worker, and a free flag per slot (set by the main process,
    cleared by the worker that claims it)."""

    def __init__(self, num_workers: int, slots: int, slot_bytes: int):
        self.slots = int(slots)
        n = int(num_workers) * self.slots
        # a storage per slot, so the main process can tell when the caller stopped using one
        self.slot_bytes = int(slot_bytes)
        self.slot_memory = [torch.empty(self.slot_bytes, dtype=torch.uint8).share_memory_() for _ in range(n)]
        self.free = torch.ones(n, dtype=torch.uint8).share_memory_()
        self._flags = self.free.numpy()  # the flags through numpy: a read costs far less than torch's
        self.token = uuid.uuid4().hex
        self.worker: int | None = None  # set in a worker process by attach()
        self._next = 0
        self._claimed: int | None = None
        self._lent: list[int] = []  # main process: slots whose memory the caller's tensors view
        self._idle_count = [self._use_count(s) for s in range(n)]
        _RINGS[self.token] = self

    def __getstate__(self):  # sent to spawned workers: the shared tensors travel as handles
        return {k: v for k, v in self.__dict__.items() if k not in ("_claimed", "_flags", "_lent")}

    def __setstate__(self, state):
        self.__dict__.update(state, _claimed=None, _flags=state["free"].numpy(), _lent=[])

    def _use_count(self, slot: int) -> int:
        return _use_count(self.slot_memory[slot].untyped_storage()._cdata) if _use_count else 0

    def attach(self, worker_id: int) -> None:
        """Make this process worker `worker_id`: it takes slots only from its own."""
        self.worker, self._next, self._claimed = int(worker_id), 0, None

    # -- worker side
    def take(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialized tensor in a free slot of this worker (claimed until the main process frees it),
        or None when no slot is free or the tensor does not fit."""
        nbytes = _nbytes(shape, dtype)
        if self.worker is None or nbytes > self.slot_bytes:
            return None
        first = self.worker * self.slots
        for k in range(self.slots):
            slot = first + (self._next + k) % self.slots
            if self._flags[slot]:
                self._flags[slot] = 0
                self._next = (slot - first + 1) % self.slots
                self._claimed = slot
                return self.slot_memory[slot][:nbytes].view(dtype).view(shape)
        return None

    def pack(self, batch):
        """The batch as a RingBatch when take() gave it a slot (tensors in the slot by place, small others by
        value); otherwise the batch itself, for torch to send."""
        slot, self._claimed = self._claimed, None
        if slot is None or not isinstance(batch, dict):
            return batch
        base, size = self.slot_memory[slot].data_ptr(), self.slot_bytes
        entries = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                offset = value.data_ptr() - base
                if 0 <= offset < size and value.is_contiguous():
                    value = (offset, tuple(value.shape), value.dtype)
                elif value.numel() * value.element_size() <= _BY_VALUE_MAX_BYTES:
                    value = value.numpy()
            entries[key] = value
        return RingBatch(self.token, slot, entries)

    # -- main process side
    def open(self, message: RingBatch, long_labels: bool, pin: bool) -> dict:
        """The batch of a received RingBatch: tensors viewing its slot (lent until the caller drops them), or
        copies where `pin` (pinned memory) or `long_labels` (`*labels` as int64) asks for other memory."""
        self.reclaim()
        lend = not pin and _use_count is not None
        memory = self.slot_memory[message.slot]
        out = {}
        for key, value in message.entries.items():
            if isinstance(value, tuple):
                offset, shape, dtype = value
                view = memory[offset : offset + _nbytes(shape, dtype)].view(dtype).view(shape)
                to = torch.int64 if long_labels and key.endswith("labels") else dtype
                if lend and to == dtype:
                    value = view
                else:
                    value = torch.empty(shape, dtype=to, pin_memory=pin)
                    # numpy's copy: torch's copy_ runs intra-op threads that cost milliseconds on busy cores
                    np.copyto(value.numpy(), view.numpy())
            elif isinstance(value, np.ndarray):
                value = torch.from_numpy(value)
            out[key] = value
        message.pending = False
        if lend:
            self._lent.append(message.slot)
        else:
            self.release(message.slot)
        return out

    def reclaim(self) -> None:
        """Free the lent slots no tensor uses any more."""
        if self._lent:
            still = [s for s in self._lent if self._use_count(s) > self._idle_count[s]]
            for s in set(self._lent) - set(still):
                self.release(s)
            self._lent = still

    def release(self, slot: int) -> None:
        self._flags[slot] = 1
