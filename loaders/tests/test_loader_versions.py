"""Versioned splits: the latest read once, a pinned version, pickled Stores re-opening their version, train and val
read at the version tokenized_bins/current.json names, and folders written before versions existed."""

import json
import pickle

import pytest
from tm_writer import random_docs, write_dataset

from tokenmill_loader import DataLoader, DatasetError, TokenDataset, open_store
from tokenmill_loader.format import CURRENT_FILE, DATASET_FILE, SPLITS, version_file


def publish(folder, written: dict, version: int, shards: int | None = None, copy: bool = True) -> None:
    """Publishes the manifest the writer wrote as version `version` (optionally listing only the first shards; with
    `copy`, also as dataset.json)."""
    manifest = dict(written)
    manifest["version"], manifest["generation"], manifest["batches"] = version, 1, [f"b{k}" for k in range(version)]
    if shards is not None:
        manifest["shards"] = manifest["shards"][:shards]
        manifest["totals"] = {k: sum(s[k] for s in manifest["shards"]) for k in ("tokens", "records")}
    data = json.dumps(manifest).encode()
    (folder / version_file(version)).write_bytes(data)
    if copy:
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


def test_train_and_val_open_the_version_the_pointer_names_whatever_their_dataset_json(tmp_path):
    """tokenized_bins/current.json switches both splits at once: after a kill between the splits' dataset.json copies
    (val's still at the previous version) both open the new one; without the pointer, each split's dataset.json."""
    bins = tmp_path / "tokenized_bins"
    written = {}
    for split, seed in zip(SPLITS, (3, 4)):
        write_dataset(bins / split, random_docs(40, seed=seed), shard_records=10)
        written[split] = json.loads((bins / split / DATASET_FILE).read_text())
        publish(bins / split, written[split], 1, shards=2)
    (bins / CURRENT_FILE).write_text('{"version": 1}')
    for split in SPLITS:  # version 2 written, not yet switched to
        publish(bins / split, written[split], 2, copy=False)
    before = {s: open_store(bins / s) for s in SPLITS}
    assert [st.version for st in before.values()] == [1, 1]

    (bins / CURRENT_FILE).write_text('{"version": 2}')  # the switch
    publish(bins / "train", written["train"], 2)  # train's copy refreshed, then the kill: val's still holds 1
    assert [open_store(bins / s).num_records for s in SPLITS] == [40, 40]
    assert [open_store(bins / s).version for s in SPLITS] == [2, 2]
    assert open_store(bins / "val", version=1).num_records == 20
    assert pickle.loads(pickle.dumps(before["val"])).num_records == 20  # a reader keeps the version it opened
    (bins / "val" / DATASET_FILE).unlink()  # a first build killed before its copies: the pointer alone opens val
    assert open_store(bins / "val").version == 2

    (bins / CURRENT_FILE).write_text('{"version": 3}')
    with pytest.raises(DatasetError, match=r"dataset\.v000003\.json: missing, while .*current\.json publishes"):
        open_store(bins / "train")
    (bins / CURRENT_FILE).write_text('{"version": "2"}')
    with pytest.raises(DatasetError, match=r"current\.json: version must be an integer"):
        open_store(bins / "train")
    (bins / CURRENT_FILE).unlink()  # a data root written before the pointer
    assert open_store(bins / "train").version == 2
