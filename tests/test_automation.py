"""The schedule and the sensor, evaluated with Dagster's test contexts: each registers the source's new files as a
batch and requests one run for it."""

from pathlib import Path

import dagster as dg
from support import run_config, write_batch_file

from automation import WHOLE_GRAPH_JOB, daily_refresh, source_sensor
from definitions import build_defs
from resources import CorpusSource, DataRoot
from tokenmill.batches import read_registry


def sensor_tick(source: Path, data: Path, instance):
    resources = {"source": CorpusSource(path=str(source)), "data_root": DataRoot(root=str(data))}
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        return source_sensor(str(source))(context)


def run_requested(defs, instance, tick: dg.SensorResult, **config):
    """What the daemon does with a tick's result: its partitions added, its run launched (here in process)."""
    for partitions in tick.dynamic_partitions_requests:
        instance.add_dynamic_partitions(partitions.partitions_def_name, partitions.partition_keys)
    (request,) = tick.run_requests
    return defs.resolve_job_def("tokenmill_all").execute_in_process(
        instance=instance,
        partition_key=request.partition_key,
        tags=request.tags,
        run_config=run_config(),
        raise_on_error=False,
        **config,
    )


def test_sensor_requests_one_run_per_new_batch_and_none_otherwise(tmp_path):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_batch_file(source / "a.jsonl", 30, seed=1)
    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
    with dg.instance_for_test() as instance:
        first = sensor_tick(source, data, instance)
        assert isinstance(first, dg.SensorResult)
        (request,) = first.run_requests
        assert (request.partition_key, request.run_key) == ("g1-b000001", "g1-b000001:1")
        assert first.dynamic_partitions_requests[0].partition_keys == ["g1-b000001"]
        assert not (data / "_batches.json").exists()  # a previewed tick writes nothing: the run registers it
        assert instance.get_dynamic_partitions("source_batch") == []
        assert run_requested(defs, instance, first).success
        assert read_registry(data).batch("g1-b000001").files.keys() == {"a.jsonl"}
        assert isinstance(sensor_tick(source, data, instance), dg.SkipReason)  # switched on again: nothing new
        (source / "README.md").write_text("notes")
        (source / ".hidden.jsonl").write_text('{"text": "x"}\n')
        assert isinstance(sensor_tick(source, data, instance), dg.SkipReason)
        write_batch_file(source / "b.jsonl", 30, seed=2)
        second = sensor_tick(source, data, instance)
        assert second.run_requests[0].partition_key == "g1-b000002"
        assert sensor_tick(source, data, instance).run_requests[0].run_key == second.run_requests[0].run_key
        assert "g1-b000002" not in read_registry(data).keys
        assert run_requested(defs, instance, second).success
        assert read_registry(data).batch("g1-b000002").files.keys() == {"b.jsonl"}
        (source / "a.jsonl").write_text('{"text": "edited"}\n')
        changed = sensor_tick(source, data, instance)
        assert isinstance(changed, dg.SkipReason)
        assert "1 file already ingested changed: a.jsonl (batch g1-b000001)" in changed.skip_message
        assert "--rebuild" in changed.skip_message


def test_sensor_description_names_the_watched_path(tmp_path):
    assert str(tmp_path) in source_sensor(str(tmp_path)).description


def test_sensor_skips_missing_source(tmp_path):
    with dg.instance_for_test() as instance:
        assert isinstance(sensor_tick(tmp_path / "nope", tmp_path / "data", instance), dg.SkipReason)


def test_daily_schedule_registers_new_files_and_is_stopped_by_default(tmp_path):
    assert daily_refresh.default_status == dg.DefaultScheduleStatus.STOPPED
    assert daily_refresh.job_name == WHOLE_GRAPH_JOB
    source = tmp_path / "src"
    source.mkdir()
    write_batch_file(source / "a.jsonl", 5, seed=1)
    resources = {"source": CorpusSource(path=str(source)), "data_root": DataRoot(root=str(tmp_path / "data"))}
    with dg.instance_for_test() as instance:
        repository = build_defs(resources["source"], resources["data_root"]).get_repository_def()
        with dg.build_schedule_context(instance=instance, resources=resources, repository_def=repository) as context:
            (request,) = daily_refresh.evaluate_tick(context).run_requests
        assert request.partition_key == "g1-b000001" and request.tags["tokenmill/planned_batch"] == "g1-b000001"
        assert instance.get_dynamic_partitions("source_batch") == ["g1-b000001"]  # a schedule adds it itself


def test_sensor_skips_new_files_the_readers_refuse_naming_them(tmp_path):
    """A FIFO as the only new file: no run is asked for (it would only retire the batch it registers); the tick
    names the file and why, and a readable file added next is asked for as usual."""
    import os

    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_batch_file(source / "a.jsonl", 30, seed=1)
    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
    with dg.instance_for_test() as instance:
        assert run_requested(defs, instance, sensor_tick(source, data, instance)).success
        os.mkfifo(source / "pipe.jsonl")
        tick = sensor_tick(source, data, instance)
        assert isinstance(tick, dg.SkipReason), tick
        assert "pipe.jsonl (not_a_regular_file)" in tick.skip_message
        assert read_registry(data).keys == ["g1-b000001"]
        write_batch_file(source / "b.jsonl", 30, seed=2)
        assert sensor_tick(source, data, instance).run_requests[0].partition_key == "g1-b000002"
