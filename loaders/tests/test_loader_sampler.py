"""ResumableSampler and DataLoader ordering: seeded epochs, sharding, resume state."""

import itertools

import numpy as np
import pytest
import torch
from tm_writer import random_docs, write_dataset

from tokenmill_loader import DataLoader, ResumableSampler, TokenDataset
from tokenmill_loader.sampler import FeistelPermutation

# full numpy permutation (default below 2^22 items) and the lazy Feistel order (forced with 0)
ORDERS = pytest.mark.parametrize("fsm", [1 << 22, 0], ids=["numpy", "feistel"])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 100, 1000, 4097, 65536, 100003])
def test_feistel_is_a_bijection(n):
    p = FeistelPermutation(n, np.random.SeedSequence((1, 2)))
    out = p(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))
    if n >= 100:  # and actually shuffles
        assert np.mean(out == np.arange(n)) < 0.05


@ORDERS
def test_orders_differ_for_every_seed_epoch_pair(fsm):
    orders = {}
    for seed, epoch in itertools.product(range(4), range(5)):
        s = ResumableSampler(200, seed=seed, full_shuffle_max=fsm)
        assert s.lazy == (fsm == 0)
        s.set_epoch(epoch)
        orders[(seed, epoch)] = tuple(s)
    assert len(set(orders.values())) == len(orders)
    for o in orders.values():
        assert sorted(o) == list(range(200))
    # (seed, epoch) is not (seed + epoch): seed 1 epoch 0 differs from seed 0 epoch 1
    assert orders[(1, 0)] != orders[(0, 1)]


@ORDERS
def test_order_independent_of_number_of_epochs(fsm):
    """Epoch e's order is the same whether reached by running epochs 0..e or by set_epoch(e)."""
    ref = ResumableSampler(97, seed=5, full_shuffle_max=fsm)
    ref.set_epoch(3)
    want = list(ref)
    run = ResumableSampler(97, seed=5, full_shuffle_max=fsm)
    for _epoch in range(4):
        got = np.asarray(run.remaining()).tolist()
        run.advance(len(got))
    assert got == want
    assert ref.permutation(3).tolist() == want
    if not fsm == 0:
        expected = np.random.default_rng(np.random.SeedSequence((5, 3))).permutation(97).tolist()
        assert want == expected
    assert list(ResumableSampler(10, shuffle=False)) == list(range(10))


@ORDERS
@pytest.mark.parametrize(
    "length,world,workers,mode",
    [(101, 3, 2, "even"), (100, 4, 3, "even"), (7, 2, 2, "even"), (101, 3, 2, "drop_last"), (101, 3, 2, "uneven")],
)
def test_rank_worker_shards_disjoint_and_cover(length, world, workers, mode, fsm):
    seen = []
    counts = []
    for rank in range(world):
        s = ResumableSampler(
            length,
            batch_size=4,
            seed=1,
            rank=rank,
            world_size=world,
            drop_last=mode == "drop_last",
            even=mode != "uneven",
            full_shuffle_max=fsm,
        )
        s.set_epoch(2)
        rank_share = set(s.rank_indices().tolist())
        parts = [s.shard(worker_id=w, num_workers=workers).tolist() for w in range(workers)]
        assert set().union(*map(set, parts)) == rank_share
        for p in parts:
            seen.extend(p)
        counts.append(len(rank_share))
    assert len(seen) == len(set(seen))  # disjoint across ranks and workers
    perm = s.permutation(2).tolist()
    if mode == "drop_last":
        assert len(set(counts)) == 1 and counts[0] % 4 == 0  # equal whole batches per rank
        assert len(seen) == (length // world // 4) * 4 * world
    elif mode == "even":  # equal shares; the order's last length % world items are left out
        assert counts == [length // world] * world
        assert sorted(seen) == sorted(perm[: length - length % world])
    else:
        assert sorted(seen) == list(range(length))  # together they cover the epoch
        assert max(counts) - min(counts) <= 1


@ORDERS
def test_resume_state_is_position_and_slices(monkeypatch, fsm):
    s = ResumableSampler(1000, batch_size=8, seed=9, full_shuffle_max=fsm)
    s.set_epoch(4)
    full = np.asarray(s.rank_indices()).copy()
    r = ResumableSampler(1000, batch_size=8, seed=9, full_shuffle_max=fsm)
    calls = []
    orig = ResumableSampler.permutation
    monkeypatch.setattr(ResumableSampler, "permutation", lambda self, e: calls.append(e) or orig(self, e))
    r.load_state_dict({"epoch": 4, "position": 968, "seed": 9, "length": 1000})
    assert list(r) == full[968:].tolist()
    assert calls == ([] if fsm == 0 else [4])  # one permutation regenerated (or none: lazy), no replay
    with pytest.raises(ValueError, match="seed"):
        r.load_state_dict({"epoch": 0, "position": 0, "seed": 1})


def test_lazy_order_dataloader_covers_epoch(tmp_path):
    path = write_dataset(tmp_path / "d", random_docs(40, seed=4), "seq", shard_records=9)
    ds = TokenDataset(path, 4)
    dl = DataLoader(ds, batch_size=7, seed=2, full_shuffle_max=0)
    assert dl.resumable_sampler.lazy
    e0 = [i for b in dl for i in b["input_ids"][:, 0].tolist()]
    first = ds.get_batch(np.arange(len(ds)))["input_ids"][:, 0].tolist()
    assert sorted(e0) == sorted(first) and e0 != first


def test_dataloader_counts_consumed_batches(tmp_path):
    path = write_dataset(tmp_path / "d", random_docs(40, seed=4), "seq", shard_records=9)
    ds = TokenDataset(path, 8)
    dl = DataLoader(ds, batch_size=5, seed=2, num_workers=2)
    nb = len(dl)
    it = iter(dl)
    next(it), next(it)
    # workers have prefetched more, but the state counts what the caller received
    assert dl.state_dict()["position"] == 10 and dl.state_dict()["epoch"] == 0
    it.close()
    rest = list(dl)  # a new iterator continues the same epoch
    assert len(rest) == nb - 2
    assert dl.state_dict()["epoch"] == 1 and dl.state_dict()["position"] == 0
    assert not DataLoader(ds, batch_size=2).pin_memory or torch.cuda.is_available()
