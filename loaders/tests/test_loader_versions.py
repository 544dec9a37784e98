"""Versioned splits: the latest read once, a pinned version, pickled Stores re-opening their version, and folders
written before versions existed."""

import json
import pickle

import pytest
from tm_writer import random_docs, write_dataset

from tokenmill_loader import DataLoader, DatasetError, TokenDataset, open_store
from tokenmill_loader.format import DATASET_FILE, version_file


def publish(folder, written: dict, version: int, shards: int | None = None) -> None:
    """Publishes the manifest the writer wrote as version `version` (optionally listing only the first shards)."""
    manifest = dict(written)
    manifest["version"], manifest["generation"], manifest["batches"] = version, 1, [f"b{k}" for k in range(version)]
    if shards is not None:
        manifest["shards"] = manifest["shards"][:shards]
        manifest["totals"] = {k: sum(s[k] for s in manifest["shards"]) for k in ("tokens", "records")}
    data = json.dumps(manifest).encode()
    (folder / version_file(version)).write_bytes(data)
    (folder / DATASET_FILE).write_bytes(data)


def test_a_store_keeps_its_version_and_pickles_it(tmp_path):
    folder = write_dataset(tmp_path / "train", random_docs(60, seed=2), shard_records=10)
    written = json.loads((folder / DATASET_FILE).read_text())
    publish(folder, written, 1, shards=3)
    st = open_store(folder)
    assert st.version == 1 and st.num_records == 30
    publish(folder, written, 2)  # every shard
    clone = pickle.loads(pickle.dumps(st))  # what a DataLoader worker gets
    assert clone.num_records == 30 and clone.version == 1
    assert open_store(folder).num_records == 60 and open_store(folder).version == 2
    assert open_store(folder, version=1).num_records == 30
    (folder / version_file(1)).unlink()  # removed by retention
    with pytest.raises(DatasetError, match=r"version 1 is not available .*available: 2 .*version=K"):
        open_store(folder, version=1)
    with pytest.raises(DatasetError, match="changed under the reader.*version 1 is not available"):
        len(pickle.loads(pickle.dumps(st)))


def test_a_folder_written_before_versions_still_opens(tmp_path):
    folder = write_dataset(tmp_path / "train", random_docs(40, seed=1), shard_records=10)
    st = open_store(folder)
    assert st.version is None and st.num_records == 40
    loader = DataLoader(TokenDataset(folder, seq_len=8), batch_size=2, seed=0)
    next(iter(loader))
    assert "version" not in loader.state_dict()
    with pytest.raises(DatasetError, match="no versions"):
        open_store(folder, version=1)
