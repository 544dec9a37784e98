"""tokenmill_loader.DataLoader with real worker processes (num_workers=2): batches come through shared-memory slots
(BatchRing) and are bit for bit those of the in-process path, across epochs and resumes, whatever the caller keeps."""

import numpy as np
import pytest
import torch
from test_shards import poem, run, tok_dir  # noqa: F401  (tok_dir: the module's tokenizer fixture)

import tokenmill_loader.shared as shared_mod
from tokenmill_loader import DataLoader, TokenDataset

SEQ_LEN, BATCH = 33, 4


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tok_dir):  # noqa: F811
    """A conditional uint16 split written by the tokenized_bins stage (loss mask, several shards, documents
    inside windows) and a headerless uint32 .bin with ids above 2**31."""
    tmp = tmp_path_factory.mktemp("stores")
    _, out = run(tmp, tok_dir, [poem(i) for i in range(160)], val_fraction=0.0, shard_tokens=2000)
    wide = tmp / "wide.bin"
    np.random.default_rng(0).integers(0, 2**32, size=3000, dtype=np.uint32).tofile(wide)
    return {"uint16": out / "train", "uint32": wide}


def dataset(stores, kind: str) -> TokenDataset:
    if kind == "uint16":
        return TokenDataset(stores[kind], seq_len=SEQ_LEN, stride=SEQ_LEN - 1, cu_seqlens=True)
    return TokenDataset(stores[kind], seq_len=SEQ_LEN, dtype=np.uint32)


def loader(ds, workers: int, **kw) -> DataLoader:
    return DataLoader(ds, batch_size=BATCH, seed=3, num_workers=workers, **kw)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == b[k].dtype and torch.equal(v, b[k]), k
        else:
            assert v == b[k], k


def take(dl, n: int | None = None) -> list[dict]:
    out = []
    for batch in dl:
        out.append(batch)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("kind", ["uint16", "uint32"])
@pytest.mark.parametrize("compact", [True, False])
def test_two_epochs_through_workers_equal_the_in_process_batches(stores, kind, compact):
    ds = dataset(stores, kind)
    ref = loader(ds, 0, compact_labels=compact)
    want = take(ref) + take(ref)  # a loader is a cursor: the second iter() is epoch 1
    assert any((b["labels"] == -100).any() for b in want) == (kind == "uint16")  # the loss mask is read
    dl = loader(ds, 2, compact_labels=compact)
    got = 0
    for _ in range(2):  # two epochs
        for batch in dl:  # the caller drops each batch before the next: every slot comes back
            assert_same(batch, want[got])
            got += 1
    assert got == len(want) and dl.epoch == 2
    assert dl.shared_memory_batches == got  # every batch came through the ring, none through torch's segments


def test_batches_the_caller_keeps_are_never_overwritten(stores):
    """Keeping every batch holds every slot: the workers then send fresh memory instead, and no kept batch
    changes while later ones are read."""
    ds = dataset(stores, "uint16")
    want = take(loader(ds, 0, compact_labels=True))
    dl = loader(ds, 2, compact_labels=True, prefetch_factor=2)
    kept = take(dl)
    assert len(kept) == len(want) > 4 * (2 + 3)  # more batches than the ring's slots
    for a, b in zip(kept, want):
        assert_same(a, b)
    assert 0 < dl.shared_memory_batches < len(kept)


@pytest.mark.parametrize("kind", ["uint16", "uint32"])
def test_resume_between_in_process_and_workers(stores, kind):
    ds = dataset(stores, kind)
    ref = loader(ds, 0)
    first = take(ref, 7)
    state = ref.state_dict()
    rest = take(ref)
    for workers_before, workers_after in ((0, 2), (2, 0), (2, 2)):
        before = loader(ds, workers_before)
        for a, b in zip(take(before, 7), first):
            assert_same(a, b)
        saved = before.state_dict()
        assert saved == state
        after = loader(ds, workers_after)
        after.load_state_dict(saved)
        got = take(after)
        assert len(got) == len(rest)
        for a, b in zip(got, rest):
            assert_same(a, b)


def test_persistent_workers_stopped_mid_epoch_continue_exactly(stores):
    """Breaking out of the loop discards what the workers prefetched; their slots come back, and the next
    iter() continues at the next batch."""
    ds = dataset(stores, "uint16")
    ref = loader(ds, 0)
    want = take(ref) + take(ref)
    dl = loader(ds, 2, persistent_workers=True, prefetch_factor=2)
    got = []
    while len(got) < len(want):
        for batch in dl:
            assert_same(batch, want[len(got)])
            got.append(None)
            if len(got) % 5 == 0:
                break
    assert dl.shared_memory_batches == len(want)


def test_without_torch_use_counts_batches_are_copied_out(stores, monkeypatch):
    """Where torch lacks the storage use count, the main process copies each batch out and frees its slot."""
    monkeypatch.setattr(shared_mod, "_use_count", None)
    ds = dataset(stores, "uint16")
    want = take(loader(ds, 0, compact_labels=True))
    dl = loader(ds, 2, compact_labels=True)
    kept = take(dl)  # copies: keeping them holds no slot
    for a, b in zip(kept, want):
        assert_same(a, b)
    assert dl.shared_memory_batches == len(want)


@pytest.mark.slow  # spawned workers import torch: ~10 s
def test_spawned_workers_read_the_same_batches(stores):
    ds = dataset(stores, "uint32")
    want = take(loader(ds, 0))
    dl = loader(ds, 2, multiprocessing_context="spawn")
    got = 0
    for batch in dl:
        assert_same(batch, want[got])
        got += 1
    assert got == len(want) and dl.shared_memory_batches == got
