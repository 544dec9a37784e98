"""Issue 27, items 4-6: a bad batch is retired instead of blocking the corpus, a killed run is failed by run
monitoring and its batch run again, a touched or changed file does not stop new files, and per-batch settings hold
for a whole generation. Batches are driven by sensor ticks, as the daemon would (test_automation's helpers)."""

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

# the daemon's own check of a STARTED run (run monitoring), called here as its loop would call it
from dagster._daemon.monitoring.run_monitoring import monitor_started_run
from support import run_config, write_batch_file
from test_automation import run_requested, sensor_tick

import tokenmill.batches
from assets.checks import FUNNEL_CONSERVED
from definitions import build_defs
from resources import CorpusSource, DataRoot
from tokenmill.batches import published_batches, read_registry, retire_batch
from tokenmill.common.io import read_json
from tokenmill.common.lock import read_holder
from tokenmill.errors import UnknownBatchError

REPO = Path(__file__).resolve().parents[1]
# The production launcher: its health check tells run monitoring that a run died holding its data root's lock.
MONITORED = {"run_launcher": {"module": "tokenmill.launch", "class": "DataRootRunLauncher"}}
# A run of the tick's request in its own process (the instance is the test's: DAGSTER_HOME), stalled in cleaned_jsonl
# so that it is killed mid-run: raw_records published, cleaned_jsonl staging, the data root's lock held.
STALLED_RUN = """
import json, sys, time
from pathlib import Path
import dagster as dg
import assets.clean
from definitions import build_defs
from resources import CorpusSource, DataRoot
from support import run_config

source, data, stalled, partition, tags = sys.argv[1:5] + [json.loads(sys.argv[5])]

def stall(*args, **kwargs):
    Path(stalled).touch()
    time.sleep(600)

assets.clean.clean_corpus = stall
job = build_defs(CorpusSource(path=source), DataRoot(root=data)).resolve_job_def("tokenmill_all")
with dg.DagsterInstance.get() as instance:
    job.execute_in_process(instance=instance, partition_key=partition, tags=tags, run_config=run_config())
"""


def build(source, data):
    return build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))


def write_bad_file(path, good: int, bad: int) -> None:
    lines = [json.dumps({"text": f"kept line {i} " * 8}) for i in range(good)] + ["{not json"] * bad
    path.write_text("\n".join(lines) + "\n")


def failure_text(result) -> str:
    return " ".join(e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure)


def kill_mid_run(instance, tick: dg.SensorResult, source, data, tmp_path) -> str:
    """Runs the tick's request in a process of its own and kills it (SIGKILL) mid-run; returns the run's id."""
    for partitions in tick.dynamic_partitions_requests:
        instance.add_dynamic_partitions(partitions.partitions_def_name, partitions.partition_keys)
    (request,) = tick.run_requests
    stalled = tmp_path / "stalled"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "TOKENMILL_WORKERS": "1"}
    args = [str(source), str(data), str(stalled), request.partition_key, json.dumps(dict(request.tags))]
    run = subprocess.Popen([sys.executable, "-c", STALLED_RUN, *args], env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not stalled.exists():
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before it was killed"
            time.sleep(0.1)
        holder = read_holder(data)
        assert holder["pid"] == run.pid
        run.kill()
        run.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever the run started (its workers exit on their own)
            os.killpg(run.pid, signal.SIGKILL)
    return holder["run_id"]


def test_a_bad_batch_is_quarantined_retired_and_later_batches_go_on(tmp_path, shared_dir):
    """Sensor-driven batches, the second one bad and the third killed mid-run: the bad one fails naming its
    quarantine, the sensor says why it waits, the retire job retires it; the killed run stays STARTED until run
    monitoring (the daemon's check, with the production launcher) fails it, then the sensor asks for its batch again
    and it publishes; the corrected bad file comes in as a fourth batch. Every good batch is published, the bad one
    retired, and no run is left queued or in progress."""
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    defs = build(source, data)
    with dg.instance_for_test(overrides=MONITORED) as instance:
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
        killed = kill_mid_run(instance, third, source, data, tmp_path)
        assert instance.get_run_by_id(killed).status == dg.DagsterRunStatus.STARTED
        waits = sensor_tick(source, data, instance)
        assert isinstance(waits, dg.SkipReason) and f"run {killed} is started" in waits.skip_message
        monitor_started_run(instance, None, instance.get_run_record_by_id(killed), logging.getLogger("monitoring"))
        assert instance.get_run_by_id(killed).status == dg.DagsterRunStatus.FAILURE
        again = sensor_tick(source, data, instance)  # a killed run may pass by itself: attempt 2
        assert again.run_requests[0].run_key == "g1-b000003:2"
        assert run_requested(defs, instance, again).success
        assert read_registry(data).batch("g1-b000003").files.keys() == {"c.jsonl"}
        assert read_registry(data).earlier("g1-b000003") == ["g1-b000001"]

        write_bad_file(source / "bad.jsonl", good=5, bad=0)  # corrected: a new batch, no rebuild
        assert run_requested(defs, instance, sensor_tick(source, data, instance)).success
        assert read_registry(data).batch("g1-b000004").files.keys() == {"bad.jsonl"}
        assert isinstance(sensor_tick(source, data, instance), dg.SkipReason)
        assert all(run.is_finished for run in instance.get_runs())  # nothing queued or in progress
    funnel = read_json(data / "funnel_telemetry" / "funnel.json")
    assert [b["batch"] for b in funnel["batches"]] == ["g1-b000001", "g1-b000003", "g1-b000004"]
    assert published_batches(data) == ["g1-b000001", "g1-b000003", "g1-b000004"]
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
