"""The publish_dataset job (a schedule runs it): uploads the data root's version, its figures in the op's metadata,
and the code location registers the job, plus the schedule only when TOKENMILL_PUBLISH_TO names a destination."""

import uuid

import dagster as dg
from test_publish import write_version

from assets.publish import publish_dataset_job, publish_schedule, publish_schedules_from_env
from resources import DataRoot
from tokenmill_loader import open_store


def test_the_job_publishes_the_data_roots_version(tmp_path, s3_env):
    write_version(tmp_path / "tokenized_bins", 1, {0: 3000, 1: 3000})
    to = f"s3://{s3_env.make_bucket(f'job-{uuid.uuid4().hex[:12]}')}/demo"
    result = publish_dataset_job.execute_in_process(
        run_config={"ops": {"publish_version": {"config": {"to": to}}}},
        resources={"data_root": DataRoot(root=str(tmp_path))},
    )
    assert result.success and result.output_for_node("publish_version") == 1
    [materialized] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = materialized.event_specific_data.metadata
    assert metadata["uploaded"].value == metadata["files"].value and metadata["url"].value == to
    assert s3_env.secret_key not in str(metadata) and s3_env.access_key not in str(metadata)
    assert open_store(f"{to}/train", cache_dir=tmp_path / "cache").version == 1


def test_the_schedule_comes_with_a_destination_only(monkeypatch):
    monkeypatch.delenv("TOKENMILL_PUBLISH_TO", raising=False)
    assert publish_schedules_from_env() == []
    monkeypatch.setenv("TOKENMILL_PUBLISH_TO", "s3://bucket/demo")
    [schedule] = publish_schedules_from_env()
    assert schedule.cron_schedule == "0 * * * *" and schedule.job is publish_dataset_job
    assert publish_schedule("s3://b/p", "15 3 * * *").cron_schedule == "15 3 * * *"
    defs = dg.Definitions(jobs=[publish_dataset_job], schedules=[schedule], resources={"data_root": DataRoot(root="x")})
    dg.Definitions.validate_loadable(defs)
