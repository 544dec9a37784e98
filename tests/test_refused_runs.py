"""A run refused before any work marks nothing failed (issue 30 item 2). Dagster's config schema carries no bounds,
so the launchpad accepts `bp_threshold: 1.5`; the instance's launcher (resources.run_launcher, in
dagster_home/dagster.yaml and deploy/dagster.yaml) checks the settings and ends the run CANCELED with the one-line
message, its process never started. On a real `dagster dev`: the run's status and cancel message, the batch's
partition not failed, the asset's checks not failed, and the published materialization still the latest. A run
the launcher did not start (`dagster job execute`) fails at set-up with the same one line, not the data_root
resource's name."""

import time

import dagster as dg
import pytest

from devtools.dagster_server import LAUNCH_ASSETS_MUTATION, DagsterDev, dev_with_source_batch
from resources.run_launcher import SETTINGS_MODULES, refused_settings
from tokenmill.batches import DATA_ROOT_TAG

REFUSED_CONFIG = {"ops": {"cleaned_jsonl": {"config": {"bp_threshold": 1.5}}}}
REFUSED_MESSAGE = (
    "invalid run config, nothing was run: cleaned_jsonl.bp_threshold: Input should be less than or equal to 1 (got 1.5)"
)
RUN_SECONDS = 300

RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) { ... on Run { status } }
  logsForRun(runId: $runId) {
    ... on EventConnection { events { __typename ... on MessageEvent { message } } }
  }
}"""

ASSET_QUERY = """
query Asset($key: AssetKeyInput!, $keys: [AssetKeyInput!]!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      partitionStats { numMaterialized numFailed numMaterializing }
      assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } }
      assetChecksOrError { ... on AssetChecks { checks { name } } }
    }
  }
  assetsLatestInfo(assetKeys: $keys) { latestRun { id status } latestMaterialization { runId } }
}"""

CHECK_QUERY = """
query Check($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 1) { runId status }
}"""


def test_the_launcher_knows_every_stages_settings():
    """SETTINGS_MODULES names every module that declares a stage's settings (the launcher's process imports no
    asset)."""
    import definitions  # noqa: F401  (imports every stage)
    from tokenmill.settings import _SETTINGS_BY_ASSET

    assert {cls.__module__ for cls in _SETTINGS_BY_ASSET.values()} <= set(SETTINGS_MODULES)
    assert refused_settings(REFUSED_CONFIG) == REFUSED_MESSAGE
    assert refused_settings({"ops": {"cleaned_jsonl": {"config": {"bp_threshold": 0.5}}}}) is None


def test_a_run_the_launcher_did_not_start_fails_with_the_one_line_message():
    """`dagster job execute` and `dg launch` run in process: the data_root resource refuses the settings, and the
    run's failure is the ConfigError's line, not "Error executing resource_fn on ResourceDefinition data_root"."""
    from definitions import defs

    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(
            run_config=REFUSED_CONFIG,
            instance=instance,
            raise_on_error=False,
            asset_selection=[dg.AssetKey("cleaned_jsonl")],
            tags={"dagster/partition": "g1-b000001"},
        )
    (failure,) = [e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE]
    error = failure.event_specific_data.error
    assert error.message.strip() == f"resources.RunConfigRefused: {REFUSED_MESSAGE}", error.message
    assert error.cause.cls_name == "ConfigError"  # tokenmill update and the sensor read the cause
    (init_failure,) = [e for e in result.all_events if e.event_type == dg.DagsterEventType.RESOURCE_INIT_FAILURE]
    assert init_failure.event_specific_data.error.message.strip() == f"tokenmill.errors.ConfigError: {REFUSED_MESSAGE}"


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_source):
    with dev_with_source_batch(tmp_path_factory.mktemp("refused_runs"), demo_source) as (dev, instance, batch):
        yield dev, batch


def launch(dev: DagsterDev, batch: str, assets: list[str], run_config: dict) -> str:
    """A materialization of `assets` for the batch with this run config, as the launchpad launches it."""
    selector = {
        "repositoryLocationName": "tokenmill",
        "repositoryName": "__repository__",
        "jobName": "__ASSET_JOB",
        "assetSelection": [{"path": [k]} for k in assets],
    }
    params = {
        "selector": selector,
        "runConfigData": run_config,
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": batch}]},
    }
    launched = dev.graphql(LAUNCH_ASSETS_MUTATION, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def finished(dev: DagsterDev, run_id: str) -> dict:
    deadline = time.monotonic() + RUN_SECONDS
    while time.monotonic() < deadline:
        run = dev.graphql(RUN_QUERY, {"runId": run_id})
        if run["runOrError"]["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            return run
        time.sleep(0.5)
    raise TimeoutError(f"run {run_id} not finished after {RUN_SECONDS} s; log: {dev.log_path}")


def asset_state(dev: DagsterDev, batch: str) -> dict:
    key = {"path": ["cleaned_jsonl"]}
    asset = dev.graphql(ASSET_QUERY, {"key": key, "keys": [key]})
    node = asset["assetNodeOrError"]
    checks = {
        c["name"]: dev.graphql(CHECK_QUERY, {"key": key, "name": c["name"]})["assetCheckExecutions"]
        for c in node["assetChecksOrError"]["checks"]
    }
    (latest,) = asset["assetsLatestInfo"]
    return {"node": node, "latest": latest, "checks": checks}


def test_a_refused_launch_ends_canceled_with_the_message_and_fails_nothing(server):
    dev, batch = server
    published = dev.materialize(["raw_records", "cleaned_jsonl"], partition=batch)
    before = asset_state(dev, batch)
    assert before["latest"]["latestMaterialization"]["runId"] == published
    assert before["checks"], "cleaned_jsonl has asset checks"

    run_id = launch(dev, batch, ["cleaned_jsonl"], REFUSED_CONFIG)
    run = finished(dev, run_id)
    assert run["runOrError"]["status"] == "CANCELED", f"run {run_id}; log {dev.log_path}"
    events = run["logsForRun"]["events"]
    (canceled,) = [e for e in events if e["__typename"] == "RunCanceledEvent"]
    assert canceled["message"] == REFUSED_MESSAGE
    assert not any("Started process for run" in (e.get("message") or "") for e in events)  # no process started

    after = asset_state(dev, batch)
    node = after["node"]
    assert node["partitionStats"]["numFailed"] == 0, node
    assert batch in node["assetPartitionStatuses"]["materializedPartitions"], node
    assert batch not in node["assetPartitionStatuses"]["failedPartitions"], node
    assert after["latest"]["latestMaterialization"]["runId"] == published  # the published data stays the latest
    assert after["latest"]["latestRun"] == {"id": run_id, "status": "CANCELED"}  # the UI shows red only for FAILURE
    for name, (execution,) in after["checks"].items():
        assert execution["status"] not in ("FAILED", "EXECUTION_FAILED"), (name, execution)


def launch_job(dev: DagsterDev, tags: dict, run_config: dict) -> str:
    """A launch of the tokenmill_all job with these tags and run config, as the launchpad sends it."""
    selector = {"repositoryLocationName": "tokenmill", "repositoryName": "__repository__", "jobName": "tokenmill_all"}
    params = {
        "selector": selector,
        "runConfigData": run_config,
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
    }
    launched = dev.graphql(LAUNCH_ASSETS_MUTATION, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def test_runs_the_data_root_would_refuse_end_canceled_naming_why(server, tmp_path):
    """A tokenmill_all run without a batch, and one whose run config moves its tagged data root, are refused by the
    launcher the same way: canceled with the DataRoot's one-line reason, no process, nothing written elsewhere."""
    dev, batch = server
    data = dev.env["TOKENMILL_DATA"]
    elsewhere = tmp_path / "elsewhere"
    cases = {
        "runs one source batch": ({DATA_ROOT_TAG: data}, {}),
        f"moves the data root to {elsewhere}": (
            {DATA_ROOT_TAG: data, "dagster/partition": batch},
            {"resources": {"data_root": {"config": {"root": str(elsewhere)}}}},
        ),
    }
    for reason, (tags, run_config) in cases.items():
        run_id = launch_job(dev, tags, run_config)
        run = finished(dev, run_id)
        assert run["runOrError"]["status"] == "CANCELED", (reason, run_id, dev.log_path)
        (canceled,) = [e for e in run["logsForRun"]["events"] if e["__typename"] == "RunCanceledEvent"]
        assert canceled["message"].startswith("nothing was run: ") and reason in canceled["message"], canceled
    assert not elsewhere.exists()
