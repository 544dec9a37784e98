"""Schedule and sensor, evaluated with Dagster's test contexts."""

import os

import dagster as dg

from automation import WHOLE_GRAPH_JOB, daily_refresh, source_sensor
from definitions import build_defs
from resources import Compute, CorpusSource, DataRoot


def evaluate(source_dir, instance, cursor, data_root=None):
    resources = {
        "source": CorpusSource(path=str(source_dir)),
        "data_root": DataRoot(root=str(data_root or source_dir.parent / "data")),
    }
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        result = source_sensor(str(source_dir))(context)
        return result, context.cursor


def run_requests(result):
    return [result] if isinstance(result, dg.RunRequest) else []


def test_sensor_requests_one_run_per_new_file_set(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n')
    with dg.instance_for_test() as instance:
        first, cursor = evaluate(tmp_path, instance, None)
        assert len(run_requests(first)) == 1
        again, cursor_again = evaluate(tmp_path, instance, cursor)
        assert run_requests(again) == [] and cursor_again == cursor

        (tmp_path / "b.jsonl").write_text('{"text": "two"}\n')
        added, cursor2 = evaluate(tmp_path, instance, cursor)
        assert len(run_requests(added)) == 1 and added.run_key != first.run_key
        assert run_requests(evaluate(tmp_path, instance, cursor2)[0]) == []

        (tmp_path / "a.jsonl").write_text('{"text": "one, changed"}\n')
        st = (tmp_path / "a.jsonl").stat()
        os.utime(tmp_path / "a.jsonl", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        changed, cursor3 = evaluate(tmp_path, instance, cursor2)
        assert len(run_requests(changed)) == 1 and changed.tags["tokenmill/changed_files"] == "1"

        (tmp_path / "b.jsonl").unlink()
        removed, _ = evaluate(tmp_path, instance, cursor3)
        assert len(run_requests(removed)) == 1 and removed.tags["tokenmill/removed_files"] == "1"


def test_sensor_ignores_files_the_readers_skip(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n')
    with dg.instance_for_test() as instance:
        _, cursor = evaluate(tmp_path, instance, None)
        (tmp_path / "README.md").write_text("notes")
        (tmp_path / ".hidden.jsonl").write_text('{"text": "x"}\n')
        result, _ = evaluate(tmp_path, instance, cursor)
        assert isinstance(result, dg.SkipReason)


def test_sensor_switched_on_after_a_run_with_nothing_new_requests_nothing(tmp_path):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    (source / "a.jsonl").write_text('{"text": "one two three four five six seven eight nine ten"}\n')
    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
    with dg.instance_for_test() as instance:
        dg.materialize(
            [defs.get_assets_def("raw_records")],
            instance=instance,
            resources={
                "source": CorpusSource(path=str(source)),
                "data_root": DataRoot(root=str(data)),
                "compute": Compute(),
            },
        )
        result, cursor = evaluate(source, instance, None, data)
        assert isinstance(result, dg.SkipReason) and "unchanged" in str(result.skip_message)
        (source / "b.jsonl").write_text('{"text": "eleven"}\n')
        request, _ = evaluate(source, instance, cursor, data)
        assert run_requests(request) and request.tags["tokenmill/changed_files"] == "1"


def test_sensor_description_names_the_watched_path(tmp_path):
    assert str(tmp_path) in source_sensor(str(tmp_path)).description


def test_sensor_skips_missing_source(tmp_path):
    with dg.instance_for_test() as instance:
        result, _ = evaluate(tmp_path / "nope", instance, None)
        assert isinstance(result, dg.SkipReason)


def test_daily_schedule_targets_the_whole_graph_and_is_stopped_by_default():
    assert daily_refresh.default_status == dg.DefaultScheduleStatus.STOPPED
    assert daily_refresh.job_name == WHOLE_GRAPH_JOB
    context = dg.build_schedule_context(scheduled_execution_time=None)
    requests = list(daily_refresh.evaluate_tick(context).run_requests)
    assert len(requests) == 1
