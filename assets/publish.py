"""publish_dataset: the job that uploads the dataset version tokenized_bins publishes to object storage
(tokenmill/publish.py: shards and meta with their checksums, the manifest and current.json last, resumable,
retention there too). Not part of the whole-graph job: launch it from the UI or a schedule. The code location adds
`publish_schedule` when TOKENMILL_PUBLISH_TO names a destination (TOKENMILL_PUBLISH_CRON its times, hourly by
default); a run with nothing new uploads nothing. Its run holds the data root's lock, so it never reads a version
while a tokenized_bins run changes the folder."""

import os

import dagster as dg
from pydantic import Field

from resources import DataRoot
from tokenmill.publish import KEEP_VERSIONS, RETENTION_HOURS, publish_dataset

DEFAULT_CRON = "0 * * * *"  # hourly: a publish with nothing new lists the prefix and reads a few small objects


class PublishConfig(dg.Config):
    """Where to publish, and the retention the prefix keeps (the data root's defaults)."""

    to: str = Field(description="s3://bucket/prefix; credentials come from the AWS_* variables or profile, never here")
    dataset_version: int | None = Field(None, ge=1, description="The version to upload (default: the latest)")
    retention_hours: float = Field(RETENTION_HOURS, ge=0.0, description="tokenized_bins' rule, applied in the prefix")
    keep_versions: int = Field(KEEP_VERSIONS, ge=1, description="The newest versions the prefix keeps whatever age")


@dg.op
def publish_version(context: dg.OpExecutionContext, config: PublishConfig, data_root: DataRoot) -> dg.Output[int]:
    """Uploads the version and reports what went up and what was already there."""
    result = publish_dataset(
        data_root.path("tokenized_bins"),
        config.to,
        version=config.dataset_version,
        retention_hours=config.retention_hours,
        keep_versions=config.keep_versions,
        log=context.log.info,
    )
    return dg.Output(result.version, metadata=result.as_metadata())


@dg.job(
    name="publish_dataset",
    description="Upload the latest dataset version to object storage (ops.publish_version.config.to)",
)
def publish_dataset_job() -> None:
    publish_version()


def publish_schedule(to: str, cron: str = DEFAULT_CRON) -> dg.ScheduleDefinition:
    """A schedule publishing to `to` (start it with `dagster schedule start publish_dataset_schedule`)."""
    return dg.ScheduleDefinition(
        name="publish_dataset_schedule",
        job=publish_dataset_job,
        cron_schedule=cron,
        run_config={"ops": {"publish_version": {"config": {"to": to}}}},
    )


def publish_schedules_from_env() -> list[dg.ScheduleDefinition]:
    to = os.environ.get("TOKENMILL_PUBLISH_TO", "")
    return [publish_schedule(to, os.environ.get("TOKENMILL_PUBLISH_CRON") or DEFAULT_CRON)] if to else []
