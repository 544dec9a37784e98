"""open_store over object storage (a real S3 server on loopback): the same batches as the local folder, bit for bit,
shuffled, over ranks and workers, resumed from a state; files fetched on first touch and checked against the
manifest; the cache bounded; credentials in no message."""

import json
import pickle
import re
import time
import uuid

import pytest
import torch
from test_loader_resume import same
from test_loader_versions import publish
from tm_writer import random_docs, write_dataset

from tokenmill_loader import DataLoader, DatasetError, TokenDataset, open_store
from tokenmill_loader.format import CURRENT_FILE, DATASET_FILE, SHARD_META_FILE


def upload(s3, bucket: str, bins, prefix: str = "runs/demo") -> str:
    """The tokenized_bins folder `bins` into s3://bucket/prefix, current.json last (what `tokenmill publish` does)."""
    client = s3.client()
    files = sorted(p for p in bins.rglob("*") if p.is_file() and p.name != CURRENT_FILE)
    for path in files + ([bins / CURRENT_FILE] if (bins / CURRENT_FILE).exists() else []):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(bins)}", Body=path.read_bytes())
    return f"s3://{bucket}/{prefix}"


def versioned_bins(tmp_path, docs: int = 300, shard_records: int = 25, masked: bool = True):
    """tokenized_bins with train at version 1 (current.json naming it): 12 shards by default."""
    bins = tmp_path / "tokenized_bins"
    folder = write_dataset(bins / "train", random_docs(docs, seed=3, masked=masked), shard_records=shard_records)
    publish(folder, json.loads((folder / DATASET_FILE).read_text()), 1)
    (bins / CURRENT_FILE).write_text(json.dumps({"version": 1}))
    return bins


def batches(loader, n: int, state: dict | None = None) -> list:
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for epoch in range(loader.epoch, 3):
        loader.set_epoch(epoch)
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                return out
    return out


@pytest.fixture
def published(tmp_path, s3_env):
    bins = versioned_bins(tmp_path)
    url = upload(s3_env, s3_env.make_bucket(f"loader-{uuid.uuid4().hex[:12]}"), bins)
    return bins, url


def test_an_s3_store_gives_the_local_batches_bit_for_bit_and_resumes_exactly(tmp_path, published):
    bins, url = published
    local_store = open_store(bins / "train")
    remote_store = open_store(f"{url}/train", cache_dir=tmp_path / "cache")
    assert remote_store.version == local_store.version == 1 and remote_store.fingerprint == local_store.fingerprint
    assert remote_store.num_records == local_store.num_records == 300
    shards = sorted((tmp_path / "cache").glob("*/train/shard-*"))
    assert len(shards) == 12 and all((s / SHARD_META_FILE).is_file() for s in shards)
    assert not any(list(s.glob("*.bin")) for s in shards)  # data files wait for their first touch
    for rank, workers in ((0, 0), (1, 2)):

        def loader(store, rank=rank, workers=workers):
            ds = TokenDataset(store, seq_len=17, stride=16)
            return DataLoader(ds, batch_size=4, seed=7, rank=rank, world_size=2, num_workers=workers)

        local = loader(open_store(bins / "train"))
        remote = loader(open_store(f"{url}/train", cache_dir=tmp_path / "cache"))
        first = batches(local, 12)
        assert same(first, batches(remote, 12))
        state = json.loads(json.dumps(remote.state_dict()))
        assert state == local.state_dict()
        # resumed in fresh loaders (another cache folder: nothing fetched yet) from the s3 reader's state
        again = loader(open_store(f"{url}/train", cache_dir=tmp_path / f"cache-{rank}"))
        assert same(batches(again, 6, state), batches(loader(open_store(bins / "train")), 6, state))
    # the record view too
    assert same(remote_store.fetch_record(123), local_store.fetch_record(123))
    assert same(
        remote_store.fetch(5, 4000, ["sequence", "loss_mask"]), local_store.fetch(5, 4000, ["sequence", "loss_mask"])
    )


def test_a_touched_shard_is_fetched_with_the_next_ones_and_a_pickled_store_reads_the_cache(tmp_path, published):
    _, url = published
    st = open_store(f"{url}/train", cache_dir=tmp_path / "cache")
    st.fetch(0, 10)
    split = next((tmp_path / "cache").glob("*/train"))
    # prefetching goes on without further reads, shard after shard, until the split is local
    deadline = time.monotonic() + 30
    while len(list(split.glob("shard-*/sequence.bin"))) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list(split.glob("shard-*/loss_mask.bin"))) == 12
    clone = pickle.loads(pickle.dumps(st))
    assert "SECRET" not in repr(pickle.dumps(st)) and "aws" not in repr(pickle.dumps(st)).lower()
    assert same(clone.fetch(0, 10), st.fetch(0, 10)) and clone.version == 1


def test_the_cache_stays_within_its_bound_and_refetches_what_it_evicted(tmp_path, published):
    bins, url = published
    shard_bytes = sum(p.stat().st_size for p in (bins / "train" / "shard-00000").glob("*.bin"))
    st = open_store(f"{url}/train", cache_dir=tmp_path / "cache", cache_bytes=int(2.5 * shard_bytes))
    local = open_store(bins / "train")
    n = local.num_items()
    for begin in list(range(0, n - 50, n // 12)) * 2:  # every shard, twice
        assert same(st.fetch(begin, begin + 50), local.fetch(begin, begin + 50))
        cached = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*.bin"))
        # the bound, plus the prefetches still running when the last eviction ran
        assert cached <= (2.5 + 1 + 4) * shard_bytes


def test_a_corrupted_object_is_refused_naming_it_and_never_cached(tmp_path, published, s3_env):
    bins, url = published
    bucket, prefix = url[len("s3://") :].split("/", 1)
    s3_env.client().put_object(Bucket=bucket, Key=f"{prefix}/train/shard-00003/sequence.bin", Body=b"\0" * 10)
    st = open_store(f"{url}/train", cache_dir=tmp_path / "cache")
    begin = int(st._cum["sequence"][3])
    with pytest.raises(DatasetError, match=re.escape(f"{url}/train/shard-00003/sequence.bin: 10 bytes")):
        st.fetch(begin, begin + 5)
    cache = tmp_path / "cache"
    assert not list(cache.rglob("shard-00003/sequence.bin")) and not list(cache.rglob(".fetch-*"))


def test_credentials_never_reach_a_message(tmp_path, s3_env, monkeypatch):
    bucket = s3_env.make_bucket("loader-denied")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-key-value")
    with pytest.raises(Exception) as caught:
        open_store(f"s3://{bucket}/runs/demo/train", cache_dir=tmp_path / "cache")
    assert "wrong-secret-key-value" not in str(caught.value) and s3_env.access_key not in str(caught.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env.secret_key)
    with pytest.raises(DatasetError, match=r"s3://loader-denied/runs/demo/train/dataset.json: not in object storage"):
        open_store(f"s3://{bucket}/runs/demo/train", cache_dir=tmp_path / "cache")
    with pytest.raises(DatasetError, match="cache_dir"):
        open_store(f"s3://{bucket}/runs/demo/train")


def test_torch_is_unchanged_by_the_remote_module():
    assert torch.utils.data.DataLoader  # the loader package imports no s3fs until a URL is opened
    import subprocess
    import sys

    code = "import sys, tokenmill_loader.store; print('s3fs' in sys.modules, 'fsspec' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == [
        "False",
        "False",
    ]
