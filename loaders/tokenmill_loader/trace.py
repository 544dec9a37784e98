"""After training: the samples a DataLoader over a TokenDataset yields at a step, and the steps at which it yields
given windows, from the loader's settings and position alone (no batch is read).

Both directions read the loader's own ResumableSampler: a step's indices are a slice of `rank_indices` (what
`DataLoader.__iter__` batches), and a window's step comes from the epoch's order (`permutation`) dealt out to the
ranks by `dealt_to`, the inverse of `rank_indices`. Steps count the batches the loader yields from its position when
traced: a fresh loader's step 0 is its first batch; after `load_state_dict(state)`, the first batch after the resume.
A loader's epochs are `iter()` calls (docs/training.md's loop); each starts the workers' round robin again, so batch
b of an epoch's iterator was read by worker b % num_workers.

The window's tokens are split into pieces by the documents (dataset records) they come from; tokenmill's side
(tokenmill/trace.py) names each record's id, source file and line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .datasets import TokenDataset
from .loader import DataLoader, _ResumableBatchSampler
from .sampler import ResumableSampler, dealt_to


@dataclass(frozen=True, kw_only=True)
class Piece:
    """The tokens of one document (dataset record) inside a window."""

    record: int
    """The record's index in the split (record j of dataset.json's shards, in order)."""
    begin: int
    """First token of the piece, as an offset in the record's tokens."""
    end: int
    """One past its last token."""
    at: int
    """Column of the window where the piece starts."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One row of a batch the loader yields."""

    epoch: int
    step: int
    """Batches the loader yields (per rank) before this one, counted from its position when traced."""
    rank: int
    row: int
    """Row of the rank's batch."""
    worker: int | None
    """The DataLoader worker that read the batch (None: read in the loading process)."""
    window: int
    """The TokenDataset item: stream tokens [begin, end)."""
    begin: int
    end: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, kw_only=True)
class _Epoch:
    """One epoch as the loader will deal it from now on."""

    epoch: int
    start: int  # items of the epoch's order consumed before the ranks' shares were dealt (a resumed state's position)
    skip: int  # items of each rank's share already yielded
    first_step: int  # steps before this epoch's first batch
    batches: int  # batches of this epoch still to come, per rank


def _epochs(loader: DataLoader) -> Iterator[_Epoch]:
    """The epochs the loader yields from its position on, in order (without end: training decides when to stop)."""
    s: ResumableSampler = loader.resumable_sampler
    bs, drop_last = _batching(loader)
    epoch, start, skip = s.epoch, s.start, s.position
    if skip >= s.num_samples():  # the loader's next iter() starts the next epoch (DataLoader.__iter__)
        epoch, start, skip = epoch + 1, 0, 0
    step = 0
    while True:
        left = s.share_len(epoch) - skip
        batches = left // bs if drop_last else -(-left // bs)
        if batches == 0 and start == skip == 0:  # a whole epoch without a batch: so is every later one
            raise ValueError(f"{s.length} samples give no batch of {bs} on {s.world_size} ranks: no step to trace")
        yield _Epoch(epoch=epoch, start=start, skip=skip, first_step=step, batches=batches)
        step += batches
        epoch, start, skip = epoch + 1, 0, 0


def trace_step(loader: DataLoader, step: int, rank: int | None = None) -> list[Sample]:
    """The samples of batch `step` of rank `rank` (None: of every rank), row by row, as the loader yields them."""
    if step < 0:
        raise ValueError(f"step {step} < 0")
    dataset = _token_dataset(loader)
    s: ResumableSampler = loader.resumable_sampler
    bs = _batching(loader)[0]
    ranks = range(s.world_size) if rank is None else [rank]
    for ep in _epochs(loader):
        if step < ep.first_step + ep.batches:
            b = step - ep.first_step
            out = []
            for r in ranks:
                share = s.for_rank(r).rank_indices(ep.epoch)
                lo = ep.skip + b * bs
                windows = np.asarray(share[lo : lo + bs])
                out += _samples(dataset, loader, ep, windows, np.full(len(windows), r), np.arange(len(windows)), b)
            return out
    raise AssertionError("unreachable: _epochs has no end")


def find_windows(loader: DataLoader, windows, epochs: int = 1) -> list[Sample]:
    """Every sample showing one of `windows` in the next `epochs` epochs the loader yields, in step order. A window
    missing from an epoch is in its left-out tail (fewer than world_size samples, or a partial batch with
    drop_last)."""
    dataset = _token_dataset(loader)
    s: ResumableSampler = loader.resumable_sampler
    bs = _batching(loader)[0]
    wanted = np.unique(np.asarray(windows, dtype=np.int64))
    out: list[Sample] = []
    for ep, _ in zip(_epochs(loader), range(epochs)):
        order = s.permutation(ep.epoch)
        positions = np.flatnonzero(np.isin(order, wanted))
        rank, item = dealt_to(positions, ep.start, s.world_size)
        item -= ep.skip
        step = item // bs
        seen = (positions >= ep.start) & (item >= 0) & (step < ep.batches)
        for b in np.unique(step[seen]).tolist():
            rows = seen & (step == b)
            found = _samples(dataset, loader, ep, order[positions[rows]], rank[rows], item[rows] % bs, b)
            out += sorted(found, key=lambda x: (x.rank, x.row))
    return out


def windows_of_records(dataset: TokenDataset, records) -> np.ndarray:
    """The windows (TokenDataset items) holding at least one token of any of `records` (split record indices),
    sorted; a record in the tail shorter than a window, or without tokens, is in none."""
    starts = dataset.store.doc_starts(dataset.key)
    ends = np.append(starts[1:], dataset.total_tokens)
    recs = np.asarray(records, dtype=np.int64)
    a, z = starts[recs], ends[recs]
    L, stride = dataset.seq_len, dataset.stride
    lo = np.maximum(0, (a - L) // stride + 1)  # first window whose end passes a
    hi = np.minimum(dataset.num_windows, (z - 1) // stride + 1)  # past the last window starting before z
    hi = np.where(z > a, hi, lo)
    count = np.maximum(0, hi - lo)
    first = np.repeat(lo - np.concatenate([[0], np.cumsum(count)[:-1]]), count)
    return np.unique(first + np.arange(int(count.sum()), dtype=np.int64))


def pieces(dataset: TokenDataset, begin: int, end: int) -> tuple[Piece, ...]:
    """The documents of stream tokens [begin, end), in order (documents without tokens left out)."""
    starts = dataset.store.doc_starts(dataset.key)
    first = int(np.searchsorted(starts, begin, side="right")) - 1
    last = int(np.searchsorted(starts, end, side="left"))
    out = []
    for r in range(first, last):
        a = max(begin, int(starts[r]))
        z = min(end, int(starts[r + 1]) if r + 1 < len(starts) else dataset.total_tokens)
        if z > a:
            out.append(Piece(record=r, begin=a - int(starts[r]), end=z - int(starts[r]), at=a - begin))
    return tuple(out)


def _samples(dataset: TokenDataset, loader: DataLoader, ep: _Epoch, windows, ranks, rows, batch: int) -> list[Sample]:
    workers = loader.num_workers
    out = []
    for w, r, row in zip(np.asarray(windows).tolist(), np.asarray(ranks).tolist(), np.asarray(rows).tolist()):
        begin, end = dataset.window(w)
        out.append(
            Sample(
                epoch=ep.epoch,
                step=ep.first_step + batch,
                rank=r,
                row=row,
                worker=batch % workers if workers else None,
                window=w,
                begin=begin,
                end=end,
                pieces=pieces(dataset, begin, end),
            )
        )
    return out


def _batching(loader: DataLoader) -> tuple[int, bool]:
    """(batch_size, drop_last) of the loader's batches (its batch sampler's: torch's own drop_last is False)."""
    batcher = loader.batch_sampler
    if not isinstance(batcher, _ResumableBatchSampler):
        raise TypeError(f"tracing needs a tokenmill_loader.DataLoader, not {type(loader).__name__}")
    return batcher.batch_size, batcher.drop_last


def _token_dataset(loader: DataLoader) -> TokenDataset:
    if not isinstance(loader.dataset, TokenDataset):
        raise TypeError(f"tracing needs a DataLoader over a TokenDataset, not {type(loader.dataset).__name__}")
    return loader.dataset
