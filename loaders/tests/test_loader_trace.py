"""tokenmill_loader.trace against the real DataLoader: every row of every batch drawn (several ranks, workers, two
epochs, after a resume under another world size, the lazy Feistel order) is the sample trace_step names, with the
worker that read it and the tokens of its pieces; find_windows agrees with trace_step on every sample."""

import numpy as np
import pytest
import torch
from tm_writer import random_docs, write_dataset

from tokenmill_loader import DataLoader, TokenDataset
from tokenmill_loader.trace import find_windows, pieces, trace_step, windows_of_records

SEQ_LEN, STRIDE = 9, 8


class TaggedWindows(TokenDataset):
    """A TokenDataset whose batches also say which windows they hold and which worker read them."""

    def get_batch(self, indices):
        batch = super().get_batch(indices)
        info = torch.utils.data.get_worker_info()
        batch["window"] = torch.tensor(list(indices))
        batch["worker"] = torch.tensor(-1 if info is None else info.id)
        return batch

    __getitems__ = get_batch


def as_is(batch):
    return batch


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    docs = random_docs(60, seed=3, min_len=1, max_len=30)
    docs[7]["sequence"] = docs[30]["sequence"] = []  # documents without tokens are in no window
    return str(write_dataset(tmp_path_factory.mktemp("trace") / "train", docs, "seq", shard_records=17))


def loader_for(path, rank=0, **settings):
    ds = TaggedWindows(path, SEQ_LEN, STRIDE)
    return DataLoader(ds, collate_fn=as_is, rank=rank, **settings)


def drawn(loader, epochs):
    """Batches the loader yields over `epochs` epochs, the way docs/training.md's loop draws them."""
    out = []
    for epoch in range(loader.epoch, loader.epoch + epochs):
        loader.set_epoch(epoch)
        out += list(loader)
    return out


def check_batches(path, batches, tracer, rank, workers):
    """Every row of `batches` (a rank's, in order) is the sample tracer's trace_step names for its step."""
    ds = TokenDataset(path, SEQ_LEN, STRIDE)
    for step, batch in enumerate(batches):
        samples = trace_step(tracer, step, rank=rank)
        assert [s.window for s in samples] == batch["window"].tolist()
        assert [s.row for s in samples] == list(range(len(samples)))
        expected_worker = None if workers == 0 else int(batch["worker"])
        assert {s.worker for s in samples} == {expected_worker}
        for s, ids in zip(samples, batch["input_ids"]):
            assert (s.begin, s.end) == ds.window(s.window)
            assert np.array_equal(ds.store.read("sequence", s.begin, s.end), ids.numpy())
            tokens = [ds.store.read_record(p.record, "sequence")[p.begin : p.end] for p in s.pieces]
            assert np.array_equal(np.concatenate(tokens), ids.numpy())
            assert [p.at for p in s.pieces] == np.cumsum([0] + [p.end - p.begin for p in s.pieces])[:-1].tolist()


@pytest.mark.parametrize(
    "world,workers,drop_last,lazy", [(1, 0, False, False), (3, 2, False, False), (2, 0, True, True)]
)
def test_trace_names_every_row_the_loader_yields(path, world, workers, drop_last, lazy):
    settings = dict(
        batch_size=4,
        seed=5,
        world_size=world,
        drop_last=drop_last,
        num_workers=workers,
        full_shuffle_max=4 if lazy else 1 << 22,
    )
    for rank in range(world):
        batches = drawn(loader_for(path, rank, **settings), epochs=2)
        check_batches(path, batches, loader_for(path, 0, **settings), rank, workers)


def test_trace_after_a_resume_under_another_world_size(path):
    first = loader_for(path, 0, batch_size=4, seed=9, world_size=2)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    for rank in range(3):
        resumed = loader_for(path, rank, batch_size=3, seed=9, world_size=3, num_workers=2)
        resumed.load_state_dict(state)
        tracer = loader_for(path, 0, batch_size=3, seed=9, world_size=3, num_workers=2)
        tracer.load_state_dict(state)
        check_batches(path, drawn(resumed, epochs=2), tracer, rank, workers=2)


def test_find_windows_agrees_with_trace_step_on_every_sample(path):
    for settings in (dict(batch_size=4, seed=1, world_size=3), dict(batch_size=5, seed=2, drop_last=True)):
        live = loader_for(path, **settings)
        next(iter(live))  # part-way through its first epoch: steps count from the second batch
        steps = len(drawn(loader_for(path, **settings), epochs=2)) - 1
        traced = [s for step in range(steps) for s in trace_step(live, step)]
        assert trace_step(live, steps)[0].epoch == 2
        assert find_windows(live, range(len(live.dataset)), epochs=2) == traced


def test_windows_of_records_are_the_windows_whose_pieces_name_them(path):
    ds = TokenDataset(path, SEQ_LEN, STRIDE)
    for record in range(ds.store.num_records):
        expected = [w for w in range(len(ds)) if record in {p.record for p in pieces(ds, *ds.window(w))}]
        assert windows_of_records(ds, [record]).tolist() == expected
    assert windows_of_records(ds, [3, 1, 3]).tolist() == sorted(
        set(windows_of_records(ds, [1]).tolist()) | set(windows_of_records(ds, [3]).tolist())
    )


def test_an_epoch_left_with_only_a_partial_batch_under_drop_last_rolls_into_the_next(path):
    settings = dict(batch_size=4, seed=5, drop_last=True)
    live, real = loader_for(path, **settings), loader_for(path, **settings)
    for loader in (live, real):  # less than a batch left: the loader yields none of it
        loader.resumable_sampler.position = len(loader.dataset) - 2
    first = drawn(real, epochs=2)[0]
    assert [s.window for s in trace_step(live, 0)] == first["window"].tolist()
    assert trace_step(live, 0)[0].epoch == 1
