"""Versioned tokenized_bins: a batch appended as a new version while a reader with DataLoader workers keeps reading
its own, pinning, loader state per version, retention, a failed check or a kill before publishing, the contract
tool, and appended tokens equal to a one-shot build."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenmill.common.io import STATS_FILE, read_json
from tokenmill.errors import CheckFailedError
from tokenmill.lineage import locate_token
from tokenmill.stages.tokenize import ShardSettings, TokenizerSettings, tokenize_batches, train_tokenizer
from tokenmill_loader import DataLoader, DatasetError, RecordDataset, TokenDataset, open_store
from tokenmill_loader.format import list_versions, read_record_ids, version_file

LINES = ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。", "白日依山尽，黄河入海流。", "Shall I compare thee?"]
SETTINGS = ShardSettings(training_type="conditional", shard_tokens=600, val_fraction=0.2)


def record(batch: str, i: int) -> dict:
    rid = hashlib.blake2b(f"{batch}/{i}".encode(), digest_size=8).hexdigest()
    text = "\n".join(LINES[(i + k) % len(LINES)] for k in range(1 + i % 3)) + f"\n{batch} 其{i}"
    return {"id": rid, "text": text, "meta": {"title": f"题{i % 5}"}, "source": {"path": f"{batch}.json", "line": i}}


def write_batch(root: Path, key: str, n: int) -> tuple[str, Path]:
    folder = root / key
    folder.mkdir(parents=True)
    (folder / "part-00000.jsonl").write_text(
        "".join(json.dumps(record(key, i), ensure_ascii=False) + "\n" for i in range(n)), encoding="utf-8"
    )
    return key, folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Three deduped batches and a tokenizer trained on the first (frozen: later batches reuse it)."""
    root = tmp_path_factory.mktemp("versions")
    batches = [write_batch(root / "deduped_jsonl", key, n) for key, n in (("g1-b0001", 120), ("g1-b0002", 80))]
    batches.append(write_batch(root / "deduped_jsonl", "g1-b0003", 40))
    train_tokenizer(batches[0][1], root / "tokenizer", TokenizerSettings(vocab_size=400))
    return root, batches


def build(world_root: Path, bins: Path, batches, settings=SETTINGS, **kw) -> dict:
    return tokenize_batches(batches, world_root / "tokenizer", bins, settings, workers=1, **kw)


def records_by_id(split: Path, version: int | None = None) -> dict[str, list[int]]:
    store = open_store(split, version=version)
    ids = [rid for part in store.parts for rid in read_record_ids(part.folder)]
    return {rid: store.read_record(i, "sequence").tolist() for i, rid in enumerate(ids)}


def test_reader_with_workers_keeps_its_version_while_a_batch_is_published(tmp_path, world):
    root, batches = world
    bins = tmp_path / "tokenized_bins"
    first = build(root, bins, batches[:1])
    assert first.version == 1 and first.generation == 1 and first.batches_added == ["g1-b0001"]
    split = bins / "train"
    alone = [b["input_ids"] for b in DataLoader(TokenDataset(split, seq_len=32), batch_size=4, seed=3)]

    reader = DataLoader(TokenDataset(split, seq_len=32), batch_size=4, seed=3, num_workers=2, prefetch_factor=2)
    assert reader.dataset.store.version == 1
    it = iter(reader)
    got = [next(it)["input_ids"] for _ in range(3)]  # workers started and reading
    second = build(root, bins, batches[:2])  # a new batch published meanwhile
    assert second.version == 2 and second.batches_added == ["g1-b0002"] and second.new_version
    got += [b["input_ids"] for _, b in zip(range(2), it)]  # the running workers
    del it
    got += [b["input_ids"] for b in reader]  # new workers for the rest of the epoch: they re-open version 1
    assert len(got) == len(alone) and all(torch.equal(a, b) for a, b in zip(got, alone))

    fresh = open_store(split)
    assert fresh.version == 2 and json.loads((split / "dataset.json").read_bytes())["batches"] == [
        "g1-b0001",
        "g1-b0002",
    ]
    v1, v2 = records_by_id(split, version=1), records_by_id(split)
    assert list(v2)[: len(v1)] == list(v1) and all(v2[rid] == v1[rid] for rid in v1)
    assert len(v2) > len(v1) and second.train_records == len(v2)
    assert second.docs_in == 200 and second.batches["g1-b0002"]["docs_in"] == 80


def test_appended_batches_equal_a_one_shot_build_and_nothing_new_publishes_nothing(tmp_path, world):
    root, batches = world
    appended, one_shot = tmp_path / "appended", tmp_path / "one_shot"
    for k in range(1, 4):
        build(root, appended, batches[:k])
    build(root, one_shot, batches)
    for split in ("train", "val"):
        a, b = records_by_id(appended / split), records_by_id(one_shot / split)
        assert a == b and list(a) == list(b)  # same records, same order, same tokens
        # a shard never holds two batches, so the appended shards are the one-shot build's, byte for byte
        ma, mb = read_json(appended / split / "dataset.json"), read_json(one_shot / split / "dataset.json")
        assert [s["files"] for s in ma["shards"]] == [s["files"] for s in mb["shards"]]
        assert (ma["version"], mb["version"]) == (3, 1)
    stats_a, stats_b = read_json(appended / STATS_FILE), read_json(one_shot / STATS_FILE)
    for key in ("docs_in", "docs_out", "tokens", "train_records", "val_tokens", "tokens_per_doc", "batches"):
        assert stats_a[key] == stats_b[key], key
    again = build(root, appended, batches)
    assert not again.new_version and again.version == 3 and again.batches_added == []
    assert list_versions(appended / "train") == [1, 2, 3]


def test_pinned_version_and_loader_state_of_another_version(tmp_path, world):
    root, batches = world
    bins = tmp_path / "bins"
    build(root, bins, batches[:1])
    loader = DataLoader(RecordDataset(bins / "train"), batch_size=2, seed=1)
    next(iter(loader))
    state = loader.state_dict()
    assert state["version"] == 1
    build(root, bins, batches[:2])
    with pytest.raises(DatasetError, match=r"saved reading version 1, this loader reads version 2.*version=1"):
        DataLoader(RecordDataset(bins / "train"), batch_size=2, seed=1).load_state_dict(state)
    pinned = DataLoader(RecordDataset(bins / "train", version=1), batch_size=2, seed=1)
    pinned.load_state_dict(state)  # resumes on the version it was saved on
    assert pinned.state_dict() == state
    with pytest.raises(DatasetError, match=r"dataset\.v000007\.json: version 7 is not available.*available: 1, 2"):
        open_store(bins / "train", version=7)


def test_lineage_reads_the_latest_or_a_pinned_version_through_the_loader(tmp_path, world):
    root, batches = world
    data = tmp_path / "data"
    data.mkdir()
    (data / "deduped_jsonl").symlink_to(root / "deduped_jsonl")
    build(root, data / "tokenized_bins", batches[:1])
    build(root, data / "tokenized_bins", batches[:2])
    store = open_store(data / "tokenized_bins" / "train")
    last = locate_token(data, store.num_items("sequence") - 1)  # in a shard only version 2 lists
    assert last["dataset_version"] == 2 and last["record_id"] == list(records_by_id(store.real_path))[-1]
    assert last["source"] == {"path": "g1-b0002.json", "line": last["source"]["line"]}
    first = locate_token(data, 0)
    assert (first["shard"], first["record_in_shard"], first["offset_in_record"]) == (store.parts[0].name, 0, 0)
    with pytest.raises(IndexError, match="outside train/sequence"):
        locate_token(data, store.num_items("sequence"))
    first_version = open_store(data / "tokenized_bins" / "train", version=1)
    pinned = locate_token(data, first_version.num_items("sequence") - 1, version=1)
    assert pinned["dataset_version"] == 1 and pinned["source"]["path"] == "g1-b0001.json"


def _age(bins: Path, version: int, hours: float) -> None:
    when = time.time() - hours * 3600
    for split in ("train", "val"):
        os.utime(bins / split / version_file(version), (when, when))


def test_retention_removes_expired_versions_never_the_latest_nor_one_in_the_window(tmp_path, world):
    root, batches = world
    bins = tmp_path / "bins"
    build(root, bins, batches[:1])
    build(root, bins, batches[:2])
    gen2 = build(root, bins, batches[:2], ShardSettings(**{**SETTINGS.model_dump(), "val_fraction": 0.3}))
    assert gen2.generation == 2 and gen2.rebuild_reason == "encoding settings changed: val_fraction"
    gen1_shards = {s["name"] for s in read_json(bins / "train" / version_file(2))["shards"]}
    gen2_shards = {s["name"] for s in read_json(bins / "train" / version_file(3))["shards"]}
    assert not gen1_shards & gen2_shards
    keep = ShardSettings(**{**gen2.settings, "retention_hours": 1.0})
    _age(bins, 2, hours=3)  # version 1 superseded 3 h ago
    _age(bins, 3, hours=0.5)  # version 2 superseded 30 min ago: inside the window
    stats = build(root, bins, batches[:2], keep)
    assert stats.versions_removed == [1] and stats.versions == [2, 3] and not stats.new_version
    assert all((bins / "train" / name).is_dir() for name in gen1_shards)  # version 2 still names them
    with pytest.raises(DatasetError, match="version 1 is not available"):
        open_store(bins / "train", version=1)

    _age(bins, 3, hours=2)
    stats = build(
        root, bins, batches[:2], ShardSettings(**{**gen2.settings, "retention_hours": 1.0, "keep_versions": 2})
    )
    assert stats.versions_removed == []  # the newest two are kept whatever their age
    stats = build(root, bins, batches[:2], ShardSettings(**{**gen2.settings, "retention_hours": 0.0}))
    assert stats.versions_removed == [2] and stats.versions == [3]  # the latest stays, even at 0 h
    assert not any((bins / "train" / name).exists() for name in gen1_shards)
    assert sorted(p.name for p in (bins / "train").glob("shard-*")) == sorted(gen2_shards)
    assert open_store(bins / "train", verify=True).version == 3


def test_a_failed_check_or_a_kill_before_publishing_leaves_the_previous_version(tmp_path, world):
    root, batches = world
    bins = tmp_path / "bins"
    build(root, bins, batches[:1])
    before = {p: p.read_bytes() for p in sorted(bins.rglob("*")) if p.is_file() and p.name != "_timings.json"}
    seen = []

    def refuse(version: int) -> None:
        seen.append((version, sorted(p.name for p in (bins / "train").glob("dataset*.json"))))
        raise CheckFailedError("check failed (simulated)")

    with pytest.raises(CheckFailedError):
        build(root, bins, batches[:2], check=refuse)
    # the check saw the complete new version before dataset.json named it; nothing of it is left
    assert seen == [(2, ["dataset.json", "dataset.v000001.json", "dataset.v000002.json"])]
    after = {p: p.read_bytes() for p in sorted(bins.rglob("*")) if p.is_file() and p.name != "_timings.json"}
    assert after == before

    for point in ("tokenized_bins:version_written", "tokenized_bins:split_published"):
        killed = subprocess.run(
            [sys.executable, "-c", KILLED_RUN, str(root), str(bins), json.dumps([str(p) for _, p in batches[:2]])],
            env={**os.environ, "TOKENMILL_FAILPOINT": point},
            capture_output=True,
            text=True,
        )
        assert killed.returncode == -9, killed.stderr
        if point.endswith("version_written"):  # shards and manifests written, nothing published
            assert (bins / "train" / version_file(2)).exists() and read_json(bins / "current.json")["version"] == 1
            assert open_store(bins / "train").version == 1 and open_store(bins / "val", verify=True).version == 1
            logs = []
            stats = build(root, bins, batches[:2], log=_Log(logs))
            assert any("removed unpublished train/dataset.v000002.json" in m for m in logs)
            assert any("removed unreferenced train/shard-" in m for m in logs)
            assert stats.version == 2
        else:  # killed between the splits' dataset.json copies: current.json already publishes 3 for both
            assert read_json(bins / "current.json") == {"version": 3}
            assert [read_json(bins / s / "dataset.json")["version"] for s in ("train", "val")] == [3, 2]
            train, val = open_store(bins / "train"), open_store(bins / "val", verify=True)
            assert (train.version, val.version) == (3, 3) and val.info["batches"][-1] == "g1-b0003"
            logs = []
            stats = build(root, bins, batches[:3], log=_Log(logs))
            assert "recovered tokenized_bins: re-pointed val/dataset.json and tokenizer.json to version 3" in logs
            assert stats.version == 3 and not stats.new_version
            assert read_json(bins / "val" / "dataset.json") == read_json(bins / "val" / version_file(3))
            assert open_store(bins / "val", verify=True).version == 3
        for split in ("train", "val"):
            named = {
                s["name"]
                for v in list_versions(bins / split)
                for s in read_json(bins / split / version_file(v))["shards"]
            }
            assert {p.name for p in (bins / split).glob("shard-*")} == named
            assert not list((bins / split).glob(".tmp-*"))


KILLED_RUN = """
import json, sys
from pathlib import Path
from tokenmill.stages.tokenize import ShardSettings, tokenize_batches
root, bins, folders = Path(sys.argv[1]), Path(sys.argv[2]), [Path(p) for p in json.loads(sys.argv[3])]
batches = [(p.name, p) for p in folders]
if "split_published" in __import__("os").environ["TOKENMILL_FAILPOINT"]:
    batches.append(("g1-b0003", root / "deduped_jsonl" / "g1-b0003"))
tokenize_batches(batches, root / "tokenizer", bins,
                 ShardSettings(training_type="conditional", shard_tokens=600, val_fraction=0.2), workers=1)
"""


def test_a_data_root_written_before_the_version_pointer_opens_and_gets_one(tmp_path, world):
    """Before current.json, each split's dataset.json was its latest (and a run killed between the splits left val
    a version behind): such a root still opens, and the next run points val at train's version, then writes the
    pointer."""
    root, batches = world
    bins = tmp_path / "bins"
    build(root, bins, batches[:1])
    build(root, bins, batches[:2])
    (bins / "current.json").unlink()
    (bins / "val" / "dataset.json").write_bytes((bins / "val" / version_file(1)).read_bytes())
    assert open_store(bins / "train").version == 2 and open_store(bins / "val", verify=True).version == 1
    assert open_store(bins / "val", version=2).version == 2
    logs = []
    stats = build(root, bins, batches[:2], log=_Log(logs))
    assert not stats.new_version and stats.version == 2
    assert logs[:2] == [
        "recovered tokenized_bins: re-pointed val/dataset.json and tokenizer.json to version 2",
        "recovered tokenized_bins: wrote current.json: version 2, the version both splits are read at",
    ]
    assert read_json(bins / "current.json") == {"version": 2}
    assert [open_store(bins / s, verify=True).version for s in ("train", "val")] == [2, 2]


class _Log:
    def __init__(self, lines: list[str]):
        self.lines = lines

    def info(self, msg: str) -> None:
        self.lines.append(msg)


def test_the_contract_tool_passes_on_versioned_bins(tmp_path, world, shared_dir):
    tool = shared_dir / "tools" / "check_contracts.py"
    if not tool.exists():
        pytest.skip(f"{tool} not present")
    src, batches = world
    data = tmp_path / "data"
    recs = "".join((folder / "part-00000.jsonl").read_text(encoding="utf-8") for _, folder in batches)
    for stage in ("raw_records", "cleaned_jsonl"):
        (data / stage).mkdir(parents=True)
        (data / stage / "part-00000.jsonl").write_text(recs, encoding="utf-8")
    (data / "dedup_report").mkdir()
    copied = [write_batch(data / "deduped_jsonl", key, n) for (key, _), n in zip(batches, (120, 80, 40))]
    (data / "tokenizer").mkdir()
    (data / "tokenizer" / "tokenizer.json").write_bytes((src / "tokenizer" / "tokenizer.json").read_bytes())
    (src / "tokenizer" / "tokenizer_config.json").write_text('{"model_max_length": 2048}', encoding="utf-8")
    try:
        for k in (1, 2, 3):
            tokenize_batches(copied[:k], src / "tokenizer", data / "tokenized_bins", SETTINGS, workers=1)
    finally:
        (src / "tokenizer" / "tokenizer_config.json").unlink()
    assert (data / "tokenized_bins" / "val" / "tokenizer_config.json").exists()
    r = subprocess.run([sys.executable, str(tool), str(data)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "- 0 violations" in r.stdout and "tokenized_bins/train:" in r.stdout


def test_each_batch_keeps_its_token_counts_in_a_binary_file_and_older_summaries_still_load(tmp_path, world):
    """A batch's tokens per record go to `_batches/g<gen>.<batch>.tokens.npz` (a JSON list of 10M records cost the
    run process ~370 MiB); a summary written before, with `tokens_per_doc` lists, is still read by an append."""
    root, batches = world
    one_shot = build(root, tmp_path / "one_shot", batches[:2])
    bins = tmp_path / "appended"
    build(root, bins, batches[:1])
    summary = bins / "_batches" / "g000001.g1-b0001.json"
    counts = bins / "_batches" / "g000001.g1-b0001.tokens.npz"
    assert "tokens_per_doc" not in summary.read_text(encoding="utf-8") and counts.exists()
    older = read_json(summary)
    with np.load(counts) as saved:
        for split, figures in older["splits"].items():
            figures["tokens_per_doc"] = saved[split].tolist()
    summary.write_text(json.dumps(older), encoding="utf-8")
    counts.unlink()
    appended = build(root, bins, batches[:2])
    assert appended.version == 2 and appended.tokens_per_doc == one_shot.tokens_per_doc
    assert appended.batches == one_shot.batches
