"""Start and stop a real `dagster dev` for tests and the screenshot script, and talk to its GraphQL API.

No Dagster import: the server runs in its own process group (see DAGSTER-NOTES: started from a
non-interactive shell it ignores SIGTERM, so it is stopped with SIGINT, then its whole group is killed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

ASSET_METADATA_QUERY = """
query AssetMetadata($key: AssetKeyInput!) {
  assetOrError(assetKey: $key) {
    ... on Asset { assetMaterializations(limit: 1) { runId metadataEntries { label __typename
        ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue }
        ... on MarkdownMetadataEntry { mdStr } ... on TextMetadataEntry { text }
        ... on BoolMetadataEntry { boolValue } } } }
  }
}"""


LAUNCH_ASSETS_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""


ADD_PARTITION_MUTATION = """
mutation AddPartition($selector: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $selector, partitionsDefName: $name, partitionKey: $key) {
    __typename
    ... on PythonError { message }
  }
}"""


RUN_TIMES_QUERY = """
query RunTimes($runId: ID!) {
  runOrError(runId: $runId) { ... on Run { startTime endTime } }
}
"""


RUN_LOG_QUERY = """
query RunLog($runId: ID!) {
  logsForRun(runId: $runId) { ... on EventConnection { events { ... on MessageEvent { message } } } }
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DagsterDev:
    """`dagster dev` on 127.0.0.1:<free port> with its own DAGSTER_HOME; a context manager."""

    def __init__(self, dagster_home: Path, env: dict[str, str] | None = None, log_path: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dagster_home = Path(dagster_home)
        self.env = {**os.environ, **(env or {}), "DAGSTER_HOME": str(self.dagster_home)}
        self.log_path = log_path or self.dagster_home / "dagster-dev.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> DagsterDev:
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / "dagster_home" / "dagster.yaml", self.dagster_home / "dagster.yaml")
        dagster = Path(sys.executable).with_name("dagster")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(dagster), "dev", "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=REPO_ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/server_info", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"dagster dev did not answer on {self.url} within {timeout} s; log: {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # children outlive the parent otherwise
            except ProcessLookupError:
                pass
        self._log.close()

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            payload = json.load(resp)
        if payload.get("errors"):
            raise RuntimeError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def run_job(
        self, job_name: str, location: str = "tokenmill", timeout: float = 900, partition: str | None = None
    ) -> str:
        """Launches a job (for one partition) through GraphQL, waits for it to finish, returns the run id (raises
        unless SUCCESS)."""
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port)
        tags = {"dagster/partition": partition} if partition else None
        run_id = client.submit_job_execution(job_name, repository_location_name=location, tags=tags)
        return self.wait_for_run(run_id, timeout)

    def materialize(
        self, asset_keys: list[str], location: str = "tokenmill", timeout: float = 900, partition: str | None = None
    ) -> str:
        """Launches a materialization of just these assets (the implicit asset job; for one partition, as the UI's
        partition dialog does) and waits for success."""
        tags = [{"key": "dagster/partition", "value": partition}] if partition else []
        data = self.graphql(
            LAUNCH_ASSETS_MUTATION,
            {
                "params": {
                    "selector": {
                        "repositoryLocationName": location,
                        "repositoryName": "__repository__",
                        "jobName": "__ASSET_JOB",
                        "assetSelection": [{"path": [k]} for k in asset_keys],
                    },
                    "executionMetadata": {"tags": tags},
                }
            },
        )
        launched = data["launchRun"]
        if launched["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launchRun failed: {launched}")
        return self.wait_for_run(launched["run"]["runId"], timeout)

    def add_partition(self, partitions_def: str, key: str, location: str = "tokenmill") -> None:
        """Adds a dynamic partition as the UI's partition dialog does."""
        selector = {"repositoryLocationName": location, "repositoryName": "__repository__"}
        added = self.graphql(ADD_PARTITION_MUTATION, {"selector": selector, "name": partitions_def, "key": key})
        if added["addDynamicPartition"]["__typename"] != "AddDynamicPartitionSuccess":
            raise RuntimeError(f"addDynamicPartition failed: {added}")

    def wait_for_run(self, run_id: str, timeout: float = 900) -> str:
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port)
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = client.get_run_status(run_id).value
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                if status != "SUCCESS":
                    raise RuntimeError(f"run {run_id} ended {status}; log: {self.log_path}")
                return run_id
            time.sleep(1)
        raise TimeoutError(f"run {run_id} not finished after {timeout} s")

    def run_seconds(self, run_id: str) -> float:
        """Wall seconds of a finished run, start to end, as the instance recorded them."""
        run = self.graphql(RUN_TIMES_QUERY, {"runId": run_id})["runOrError"]
        return run["endTime"] - run["startTime"]

    def run_log_mentions(self, run_id: str, text: str) -> bool:
        """Whether any event message of the run contains `text`."""
        events = self.graphql(RUN_LOG_QUERY, {"runId": run_id})["logsForRun"]["events"]
        return any(text in (event.get("message") or "") for event in events)

    def latest_metadata(self, asset_key: str) -> dict:
        data = self.graphql(ASSET_METADATA_QUERY, {"key": {"path": [asset_key]}})
        mats = data["assetOrError"].get("assetMaterializations") or []
        if not mats:
            return {}
        out = {}
        for e in mats[0]["metadataEntries"]:
            value = next((e[k] for k in ("intValue", "floatValue", "mdStr", "text", "boolValue") if k in e), None)
            out[e["label"]] = value
        return out


@contextlib.contextmanager
def dev_with_source_batch(folder: Path, source: Path, workers: int = 2) -> Iterator[tuple[DagsterDev, object, str]]:
    """A `dagster dev` over a copy of `source` (folder/source, data root folder/data, instance folder/home), the copy
    registered as the first batch, as `tokenmill update` would: yields (dev, its instance, the batch key)."""
    import dagster as dg

    from assets.batches import register_batches

    shutil.copytree(source, folder / "source")
    env = {
        "TOKENMILL_SOURCE": str(folder / "source"),
        "TOKENMILL_DATA": str(folder / "data"),
        "TOKENMILL_WORKERS": str(workers),
    }
    with DagsterDev(folder / "home", env=env) as dev:
        with dg.DagsterInstance.from_config(str(dev.dagster_home)) as instance:
            (batch,), _ = register_batches(instance, folder / "data", folder / "source")
            yield dev, instance, batch
