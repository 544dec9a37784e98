"""Prefetching from object storage (a real S3 server on loopback) follows the DataLoader's sampler: the shards
downloaded ahead are those the next batches need, in the order they need them (not stream order), in the loader's
main process with num_workers 0 and 2 and after a resume; a bounded cache is never prefetched past its bound; the
batches stay the local store's."""

import json
import time
import uuid

import numpy as np
import pytest
from test_loader_resume import same
from test_loader_s3 import batches, upload, versioned_bins

from tokenmill_loader import DataLoader, TokenDataset, open_store
from tokenmill_loader.loader import PLAN_BATCHES, PLAN_EVERY

SHARDS = 40
BATCH = 2


@pytest.fixture
def many_shards(tmp_path, s3_env):
    bins = versioned_bins(tmp_path, docs=400, shard_records=400 // SHARDS)
    url = upload(s3_env, s3_env.make_bucket(f"prefetch-{uuid.uuid4().hex[:12]}"), bins)
    return bins, f"{url}/train"


def loader(store, workers: int = 0) -> DataLoader:
    ds = TokenDataset(store, seq_len=17, stride=16)
    return DataLoader(ds, batch_size=BATCH, seed=7, num_workers=workers)


def need_order(dl: DataLoader) -> list[list[str]]:
    """The shards each of the loader's next batches reads, first need first (from its sampler, as it stands)."""
    rest, ds = np.asarray(dl.resumable_sampler.remaining()), dl.dataset
    names = [part.name for part in ds.store.parts]
    return [
        [names[p] for p in dict.fromkeys(ds.shards_of(rest[i : i + BATCH]).tolist())]
        for i in range(0, len(rest), BATCH)
    ]


def first_needs(per_batch: list[list[str]]) -> list[str]:
    return list(dict.fromkeys(name for shards in per_batch for name in shards))


def settled(store) -> list[str]:
    """The shards the store's process started downloading, once its downloads are done."""
    remote = store._remote
    deadline = time.monotonic() + 30
    while remote._inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    return list(remote.started)


@pytest.mark.parametrize("workers", [0, 2])
def test_prefetch_downloads_the_next_batches_shards_in_the_samplers_order(tmp_path, many_shards, workers):
    bins, url = many_shards
    store = open_store(url, cache_dir=tmp_path / "cache")
    assert len(store.parts) == SHARDS
    dl = loader(store, workers)
    per_batch = need_order(dl)
    expected = first_needs(per_batch)
    assert expected[:12] != sorted(expected[:12])  # shuffled: the sampler's order is not the stream's
    read = 6
    got = batches(dl, read)
    assert same(got, batches(loader(open_store(bins / "train")), read))
    started = settled(store)
    # the loader's process downloaded in the sampler's order of first need, never a shard out of turn ...
    assert started == [name for name in expected if name in set(started)]
    # ... and, ahead of the reads, every shard first needed by the batches the last plan covers; with workers, those
    # no worker can have touched yet (handed out: the batches read plus 2 per worker) came from the plan alone
    planned = (read - 1) // PLAN_EVERY * PLAN_EVERY + PLAN_BATCHES
    handed_out = read + workers * 2
    ahead = first_needs(per_batch[:planned])[len(first_needs(per_batch[:handed_out])) :]
    assert ahead and [name for name in started if name in set(ahead)] == ahead
    if workers == 0:  # the reader is the planner: it downloaded exactly the plan, first need first
        assert started == expected[: len(started)] and len(started) >= len(first_needs(per_batch[:planned]))
    split = store._remote.folder
    assert all((split / name / "sequence.bin").is_file() for name in first_needs(per_batch[:planned]))


def test_after_a_resume_prefetch_follows_the_resumed_order(tmp_path, many_shards):
    bins, url = many_shards
    first = loader(open_store(url, cache_dir=tmp_path / "cache-a"))
    batches(first, 5)
    state = json.loads(json.dumps(first.state_dict()))
    store = open_store(url, cache_dir=tmp_path / "cache-b")  # nothing cached: every download is the resumed plan's
    again = loader(store)
    again.load_state_dict(state)
    expected = first_needs(need_order(again))
    local = loader(open_store(bins / "train"))
    assert same(batches(again, 4, state), batches(local, 4, state))
    started = settled(store)
    assert len(started) > 4 and started == expected[: len(started)]


def test_a_bounded_cache_is_never_prefetched_past_its_bound(tmp_path, many_shards):
    bins, url = many_shards
    shard_bytes = max(sum(p.stat().st_size for p in s.glob("*.bin")) for s in (bins / "train").glob("shard-*"))
    bound = 6 * shard_bytes
    store = open_store(url, cache_dir=tmp_path / "cache", cache_bytes=bound)
    dl, local = loader(store), loader(open_store(bins / "train"))
    remote, local_it = iter(dl), iter(local)
    for _ in range(30):
        assert same(next(remote), next(local_it))
        settled(store)
        cached = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*.bin"))
        # the bound, plus what the batch read had to fetch past it (its own shards: at most 2 per window)
        assert cached <= bound + 2 * BATCH * shard_bytes
    assert len(store._remote.started) > 6  # shards were evicted and others prefetched in their place
