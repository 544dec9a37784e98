"""Issue 27, items 4-6: a bad batch is retired instead of blocking the corpus, a touched or changed file does not
stop new files, and per-batch settings hold for a whole generation. Batches are driven by sensor ticks, as the
daemon would (test_automation's helpers)."""

import json
import os
import subprocess
import sys

import dagster as dg
import pytest
from support import run_config, write_batch_file
from test_automation import run_requested, sensor_tick

import tokenmill.batches
from assets.checks import FUNNEL_CONSERVED
from definitions import build_defs
from resources import CorpusSource, DataRoot
from tokenmill.batches import read_registry, retire_batch
from tokenmill.common.io import read_json
from tokenmill.errors import UnknownBatchError


def build(source, data):
    return build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))


def write_bad_file(path, good: int, bad: int) -> None:
    lines = [json.dumps({"text": f"kept line {i} " * 8}) for i in range(good)] + ["{not json"] * bad
    path.write_text("\n".join(lines) + "\n")


def failure_text(result) -> str:
    return " ".join(e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure)


def test_a_bad_batch_is_quarantined_retired_and_later_batches_go_on(tmp_path, shared_dir):
    """Three sensor-driven batches, the second one bad: it fails naming its quarantine, the sensor says why it
    waits, the retire job retires it, the third batch runs, and the corrected file comes in as a fourth."""
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    defs = build(source, data)
    with dg.instance_for_test() as instance:
        write_batch_file(source / "a.jsonl", 30, seed=1)
        assert run_requested(defs, instance, sensor_tick(source, data, instance)).success
        write_bad_file(source / "bad.jsonl", good=5, bad=20)
        failed = run_requested(defs, instance, sensor_tick(source, data, instance))
        assert not failed.success
        quarantine = data / "raw_records" / "_quarantine" / "g1-b000002" / "_rejected.jsonl"
        assert str(quarantine) in failure_text(failed) and "--drop-batch g1-b000002" in failure_text(failed)
        rejected = [json.loads(line) for line in quarantine.read_text().splitlines()]
        assert len(rejected) == 20 and all(r["reason"] == "malformed_json" for r in rejected)

        write_batch_file(source / "c.jsonl", 30, seed=3)
        waits = sensor_tick(source, data, instance)
        assert isinstance(waits, dg.SkipReason)
        assert f"batch g1-b000002 failed in run {failed.run_id}" in waits.skip_message
        assert "retire_source_batch" in waits.skip_message

        retired = defs.resolve_job_def("retire_source_batch").execute_in_process(
            instance=instance, run_config={"ops": {"retire_batch": {"config": {"batch": "g1-b000002"}}}}
        )
        assert retired.success
        assert read_registry(data).batch("g1-b000002").retired and quarantine.exists()
        assert "g1-b000002" not in instance.get_dynamic_partitions("source_batch")
        third = sensor_tick(source, data, instance)  # bad.jsonl, unchanged, stays out
        assert third.run_requests[0].partition_key == "g1-b000003"
        assert run_requested(defs, instance, third).success
        assert read_registry(data).batch("g1-b000003").files.keys() == {"c.jsonl"}
        assert read_registry(data).earlier("g1-b000003") == ["g1-b000001"]

        write_bad_file(source / "bad.jsonl", good=5, bad=0)  # corrected: a new batch, no rebuild
        assert run_requested(defs, instance, sensor_tick(source, data, instance)).success
        assert read_registry(data).batch("g1-b000004").files.keys() == {"bad.jsonl"}
        assert isinstance(sensor_tick(source, data, instance), dg.SkipReason)
    funnel = read_json(data / "funnel_telemetry" / "funnel.json")
    assert [b["batch"] for b in funnel["batches"]] == ["g1-b000001", "g1-b000003", "g1-b000004"]
    assert funnel["conserved"] and funnel["generation"] == 1
    with pytest.raises(UnknownBatchError, match="in the published dataset"):
        retire_batch(data, "g1-b000001", "test")
    checked = subprocess.run(
        [sys.executable, str(shared_dir / "tools" / "check_contracts.py"), str(data)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout


def test_a_touched_file_changes_nothing_and_a_changed_one_waits_while_new_files_run(tmp_path, monkeypatch):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    defs = build(source, data)
    hashed = []
    real_hash = tokenmill.batches.content_hash
    monkeypatch.setattr(tokenmill.batches, "content_hash", lambda path: hashed.append(path.name) or real_hash(path))
    with dg.instance_for_test() as instance:
        write_batch_file(source / "a.jsonl", 30, seed=1)
        assert run_requested(defs, instance, sensor_tick(source, data, instance)).success
        hashed.clear()
        assert isinstance(sensor_tick(source, data, instance), dg.SkipReason)
        assert hashed == []  # a steady source: one stat per file, nothing read
        registry_bytes = (data / "_batches.json").read_bytes()
        os.utime(source / "a.jsonl", ns=(10**18, 10**18))  # touched: same content
        write_batch_file(source / "b.jsonl", 30, seed=2)
        tick = sensor_tick(source, data, instance)
        assert hashed == ["a.jsonl"]
        assert tick.run_requests[0].partition_key == "g1-b000002"
        assert (data / "_batches.json").read_bytes() == registry_bytes  # a previewed tick writes nothing
        assert run_requested(defs, instance, tick).success
        assert read_registry(data).batch("g1-b000001").files["a.jsonl"][1] == 10**18  # the touch is recorded

        text = (source / "a.jsonl").read_text()
        (source / "a.jsonl").write_text(text.replace("w1", "w2", 1))  # same size, other content
        write_batch_file(source / "c.jsonl", 30, seed=3)
        tick = sensor_tick(source, data, instance)
        assert tick.run_requests[0].partition_key == "g1-b000003"  # new files go on
        assert run_requested(defs, instance, tick).success
        waits = sensor_tick(source, data, instance)
        assert isinstance(waits, dg.SkipReason)
        assert waits.skip_message.startswith("1 file already ingested changed: a.jsonl (batch g1-b000001);")
        assert "--rebuild" in waits.skip_message


def test_per_batch_settings_hold_for_the_generation_and_the_funnel_check_blocks(tmp_path):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    defs = build(source, data)
    with dg.instance_for_test() as instance:
        write_batch_file(source / "a.jsonl", 30, seed=1)
        assert run_requested(defs, instance, sensor_tick(source, data, instance)).success
        config = run_config()
        config["ops"]["cleaned_jsonl"] = {"config": {"min_chars": 40}}
        again = defs.resolve_job_def("tokenmill_all").execute_in_process(
            instance=instance, partition_key="g1-b000001", run_config=config, raise_on_error=False
        )
        assert not again.success
        assert "min_chars: 10 -> 40" in failure_text(again) and "--rebuild" in failure_text(again)
        write_batch_file(source / "b.jsonl", 30, seed=2)
        tick = sensor_tick(source, data, instance)
        for partitions in tick.dynamic_partitions_requests:
            instance.add_dynamic_partitions(partitions.partitions_def_name, partitions.partition_keys)
        config = run_config()
        config["ops"]["dedup_report"]["config"]["threshold"] = 0.5
        other = defs.resolve_job_def("tokenmill_all").execute_in_process(
            instance=instance,
            partition_key="g1-b000002",
            tags=tick.run_requests[0].tags,
            run_config=config,
            raise_on_error=False,
        )
        assert not other.success and "threshold: 0.8 -> 0.5" in failure_text(other)
        config["ops"]["dedup_report"]["config"]["chunk_bytes"] = 1 << 20  # how the work is split: not frozen
        del config["ops"]["dedup_report"]["config"]["threshold"]
        assert (
            defs.resolve_job_def("tokenmill_all")
            .execute_in_process(instance=instance, partition_key="g1-b000002", run_config=config)
            .success
        )
    assert FUNNEL_CONSERVED.blocking
