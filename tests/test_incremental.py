"""Incremental runs: source batches, the sensor, `tokenmill update`, and a corpus added in batches against one build."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
from support import run_config, write_batch_file

from assets.batches import register_batches
from definitions import build_defs
from resources import CorpusSource, DataRoot
from runs import run_batches, summary
from tokenmill.batches import read_registry, register_new_files
from tokenmill.common.disk import STAGES, tree_bytes
from tokenmill.common.io import iter_jsonl, read_json, record_shards
from tokenmill.errors import SourceChangedError
from tokenmill.stages.raw.discover import source_state
from tokenmill_loader import open_store
from tokenmill_loader.format import TOKENIZER_FILE, read_record_ids

REPO = Path(__file__).resolve().parents[1]
DISK_KEYS = ("bytes_written", "input_bytes", "bytes_per_input_byte")


def update(instance, source: Path, data: Path, config: dict, rebuild: bool = False) -> list[str]:
    """What `tokenmill update` does, in this process: register the new files, run each pending batch."""
    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
    pending, _ = register_batches(instance, data, source, rebuild)
    for key, result in run_batches(defs.resolve_job_def("tokenmill_all"), instance, pending, config):
        assert result.success, key
    return pending


def kept_tokens(data: Path) -> dict[str, list[int]]:
    """{record id: its tokens} over both splits of the latest dataset version."""
    out = {}
    for split in ("train", "val"):
        store = open_store(data / "tokenized_bins" / split)
        folder = data / "tokenized_bins" / split
        ids = [
            rid
            for shard in json.loads((folder / "dataset.json").read_text())["shards"]
            for rid in read_record_ids(folder / shard["name"])
        ]
        for i, rid in enumerate(ids):
            out[rid] = store.read_record(i, "sequence").tolist()
    return out


@pytest.fixture(scope="module")
def batches_and_one_build(tmp_path_factory):
    """The same three files added one batch at a time, and built at once (first_seen, the same tokenizer)."""
    root = tmp_path_factory.mktemp("incremental")
    source, data, whole = root / "src", root / "data", root / "whole"
    source.mkdir()
    first = write_batch_file(source / "a.jsonl", 60, seed=1)
    with dg.instance_for_test() as instance:
        assert update(instance, source, data, run_config()) == ["g1-b000001"]
        versions = [open_store(data / "tokenized_bins" / "train").version]
        (source / "README.md").write_text("notes the readers skip")
        assert update(instance, source, data, run_config()) == []  # nothing new: no run
        second = write_batch_file(source / "b.jsonl", 60, seed=2, copies_of=first[:6])
        assert update(instance, source, data, run_config()) == ["g1-b000002"]
        versions.append(open_store(data / "tokenized_bins" / "train").version)
        write_batch_file(source / "c.jsonl", 60, seed=3, copies_of=first[6:10] + second[:6])
        assert update(instance, source, data, run_config()) == ["g1-b000003"]
        versions.append(open_store(data / "tokenized_bins" / "train").version)
        disk_figures = {}  # each stage's latest materialization's disk figures (the last batch's, for a batch's)
        for key in STAGES:
            latest = instance.fetch_materializations(dg.AssetKey(key), limit=1).records[0].asset_materialization
            disk_figures[key] = {k: v.value for k, v in latest.metadata.items() if k in DISK_KEYS}
        (root / "disk_metadata.json").write_text(json.dumps(disk_figures))
        update(instance, source, whole, run_config(str(data / "tokenizer" / "tokenizer.json")))
    return source, data, whole, versions


def records(stage_dir: Path) -> dict[str, dict]:
    return {r["id"]: r for shard in record_shards(stage_dir) for r in iter_jsonl(shard)}


def test_batches_keep_what_one_first_seen_build_keeps(batches_and_one_build):
    _, data, whole, _ = batches_and_one_build
    assert read_registry(data).keys == ["g1-b000001", "g1-b000002", "g1-b000003"]
    kept, kept_once = records(data / "deduped_jsonl"), records(whole / "deduped_jsonl")
    assert set(kept) == set(kept_once)
    removed = {r["id"]: r for r in iter_jsonl(data / "deduped_jsonl" / "removed.jsonl")}
    removed_once = {r["id"]: r for r in iter_jsonl(whole / "deduped_jsonl" / "removed.jsonl")}
    assert set(removed) == set(removed_once) and len(removed) >= 12  # the planted copies, across batches
    assert all(r["duplicate_of"] in kept for r in removed.values())
    assert kept_tokens(data) == kept_tokens(whole)


def test_no_exact_duplicate_across_batches(batches_and_one_build):
    _, data, _, _ = batches_and_one_build
    texts = [r["text"] for r in records(data / "deduped_jsonl").values()]
    assert len(texts) == len(set(texts))


def test_records_are_conserved_per_batch_and_in_total(batches_and_one_build, shared_dir):
    _, data, _, versions = batches_and_one_build
    funnel = read_json(data / "funnel_telemetry" / "funnel.json")
    assert funnel["conserved"] and funnel["source"] and funnel["generation"] == 1
    assert [b["batch"] for b in funnel["batches"]] == ["g1-b000001", "g1-b000002", "g1-b000003"]
    for stage in funnel["stages"]:
        per_batch = [s for b in funnel["batches"] for s in b["stages"] if s["stage"] == stage["stage"]]
        assert sum(s["docs_in"] for s in per_batch) == stage["docs_in"]
        assert sum(s["docs_out"] for s in per_batch) == stage["docs_out"]
        assert all(s["docs_in"] == s["docs_out"] + s["dropped_total"] for s in per_batch)
    assert versions == sorted(set(versions)) and len(versions) == 3  # one new version per batch
    checked = subprocess.run(
        [sys.executable, str(shared_dir / "tools" / "check_contracts.py"), str(data)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout


def test_what_nobody_reads_after_a_stage_is_not_kept(batches_and_one_build):
    """Issue 45: the dedup report keeps no signatures (each index segment holds what later batches need of them),
    the tokenizer copies next to the shards are one file, and the loader still opens every split."""
    _, data, _, versions = batches_and_one_build
    for key in read_registry(data).keys:
        report, segment = data / "dedup_report" / key, data / "dedup_index" / key
        assert sorted(p.name for p in report.iterdir() if p.is_dir()) == ["decisions"], key
        assert {"signatures", "lsh", "keys", "docs"} <= {p.name for p in segment.iterdir() if p.is_dir()}, key
    splits = [data / "tokenized_bins" / split for split in ("train", "val")]
    copies = [p for d in splits for p in [d / TOKENIZER_FILE, *d.glob("tokenizer-*.json")]]
    assert len(copies) == 4 and len({(p.stat().st_dev, p.stat().st_ino) for p in copies}) == 1
    assert all((data / "tokenizer" / TOKENIZER_FILE).read_bytes() == p.read_bytes() for p in copies)
    assert tree_bytes(data / "tokenized_bins") < sum(f.stat().st_size for f in (data / "tokenized_bins").rglob("*.*"))
    for split in ("train", "val"):
        assert open_store(data / "tokenized_bins" / split).version == versions[-1]


def test_every_stage_says_its_bytes_per_input_byte(batches_and_one_build):
    """Each stage's metadata and `tokenmill update`'s summary: bytes on disk, and per byte of the input."""
    _, data, _, _ = batches_and_one_build
    figures = json.loads((data.parent / "disk_metadata.json").read_text())
    last = read_json(data / "raw_records" / "g1-b000003" / "_stats.json")["bytes_read"]
    for key in STAGES:
        f = figures[key]
        assert set(f) == set(DISK_KEYS) and f["bytes_written"] > 0, key
        assert f["bytes_per_input_byte"] == round(f["bytes_written"] / f["input_bytes"], 3), key
        per_batch = key not in ("tokenizer", "tokenized_bins", "funnel_telemetry")
        assert (f["input_bytes"] == last) == per_batch, key  # a batch's own input, or every batch's
    lines = summary(data).splitlines()
    assert sum("B/input B" in line for line in lines) == 5  # the four record stages and the data root
    assert re.search(r"disk .* B/input B for .* of input \(also dedup_report .*dedup_index", lines[-2])


def test_a_changed_or_removed_file_is_named_and_waits_while_new_files_go_on(tmp_path):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    (source / "a.jsonl").write_text('{"text": "one"}\n')
    assert register_new_files(data, source, source_state(source))[0] == "g1-b000001"
    (source / "a.jsonl").write_text('{"text": "one, changed"}\n')
    (source / "b.jsonl").write_text('{"text": "two"}\n')
    key, changes = register_new_files(data, source, source_state(source))
    assert key == "g1-b000002" and read_registry(data).batch(key).files.keys() == {"b.jsonl"}
    assert re.search(r"^1 file already ingested changed: a.jsonl \(batch g1-b000001\);.*--rebuild", changes.waiting())
    (source / "a.jsonl").unlink()
    (source / "b.jsonl").unlink()
    key, changes = register_new_files(data, source, source_state(source))
    assert key is None
    assert "2 files already ingested were removed: a.jsonl (batch g1-b000001), b.jsonl (batch g1-b000002)" in (
        changes.waiting()
    )
    with pytest.raises(SourceChangedError, match="built from"):
        register_new_files(data, tmp_path, source_state(source))


def cli(source: Path, data: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENMILL_SOURCE": str(source), "TOKENMILL_DATA": str(data), "DAGSTER_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "cli", "update", *args], cwd=REPO, env=env, capture_output=True, text=True
    )


def test_update_command_adds_batches_and_rebuilds_on_request(tmp_path):
    source, data, home = tmp_path / "src", tmp_path / "data", tmp_path / "home"
    source.mkdir()
    home.mkdir()
    write_batch_file(source / "a.jsonl", 40, seed=1)
    first = cli(source, data, home)
    assert first.returncode == 0, first.stderr
    assert "batch g1-b000001" in first.stdout and "version 1" in first.stdout
    reader = open_store(data / "tokenized_bins" / "train")
    before = reader.read_record(0, "sequence").copy()
    assert "up to date" in cli(source, data, home).stdout
    write_batch_file(source / "b.jsonl", 40, seed=2)
    second = cli(source, data, home)
    assert second.returncode == 0 and "batch g1-b000002" in second.stdout and "version 2" in second.stdout
    (source / "a.jsonl").unlink()
    waiting = cli(source, data, home)
    assert waiting.returncode == 0 and "up to date" in waiting.stdout
    assert "1 file already ingested was removed: a.jsonl (batch g1-b000001)" in waiting.stderr
    assert "--rebuild" in waiting.stderr
    rebuilt = cli(source, data, home, "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "batch g2-b000001" in rebuilt.stdout and "generation 2" in rebuilt.stdout
    np.testing.assert_array_equal(reader.read_record(0, "sequence"), before)  # the open reader keeps its version
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_dynamic_partitions("source_batch") == ["g2-b000001"]


def test_the_tokenizer_is_frozen_until_a_retrain_starts_a_new_generation(batches_and_one_build, tmp_path):
    import shutil

    from assets.tokenize import tokenized_bins, tokenizer
    from resources import Compute

    _, built, _, _ = batches_and_one_build
    data = tmp_path / "data"
    shutil.copytree(built, data, symlinks=True)
    before = open_store(data / "tokenized_bins" / "train")
    tokens_before = before.read_record(0, "sequence").copy()

    def materialize(tokenizer_config: dict):
        config = run_config()
        config["ops"]["tokenizer"]["config"].update(tokenizer_config)
        return dg.materialize(
            [tokenizer, tokenized_bins],
            run_config={"ops": {k: v for k, v in config["ops"].items() if k in ("tokenizer", "tokenized_bins")}},
            resources={"data_root": DataRoot(root=str(data)), "compute": Compute()},
            raise_on_error=False,
        )

    refused = materialize({"vocab_size": 700})
    assert not refused.success
    error = refused.failure_data_for_node("tokenizer").error
    assert "tokenizer.retrain" in str(error.cause or error.message) and "vocab_size: 600 -> 700" in str(
        error.cause or error.message
    )
    retrained = materialize({"vocab_size": 700, "retrain": True})
    assert retrained.success
    after = open_store(data / "tokenized_bins" / "train")
    assert after.version == before.version + 1
    assert read_json(data / "tokenized_bins" / "train" / "dataset.json")["generation"] == 2
    np.testing.assert_array_equal(before.read_record(0, "sequence"), tokens_before)  # still on its version
    pinned = open_store(data / "tokenized_bins" / "train", version=before.version)
    np.testing.assert_array_equal(pinned.read_record(0, "sequence"), tokens_before)


def test_a_damaged_registry_is_named_and_a_rebuild_replaces_it(tmp_path):
    from tokenmill.batches import start_generation
    from tokenmill.errors import CorruptOutputError

    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    data.mkdir()
    (source / "a.jsonl").write_text('{"text": "one"}\n')
    (data / "_batches.json").write_text('{"source": "/x", "batches": [')
    with pytest.raises(CorruptOutputError, match=r"_batches.json: not a source batch registry.*--rebuild"):
        register_new_files(data, source, source_state(source))
    assert start_generation(data, source, source_state(source), after=3) == "g4-b000001"
    assert read_registry(data).keys == ["g4-b000001"]
