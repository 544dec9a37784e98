"""The real thing: `dagster dev` on a free port, the whole job launched through GraphQL, metadata read back,
and the asset graph and funnel page rendered in headless Chromium."""
import pytest

from devtools.dagster_server import DagsterDev
from devtools.screenshots import find_chromium, take_screenshots


@pytest.fixture(scope="module")
def served_run(tmp_path_factory, demo_manifest):
    home = tmp_path_factory.mktemp("dagster_home")
    data = tmp_path_factory.mktemp("data")
    with DagsterDev(home, env={"TOKENMILL_DATA": str(data)}) as server:
        raw_only = server.materialize(["raw_records"])
        raw_count = server.latest_metadata("raw_records")["docs_out"]
        run_id = server.run_job("tokenmill_all")
        yield server, run_id, data, (raw_only, raw_count)


def test_raw_records_materialization_through_graphql(served_run, demo_manifest):
    server, run_id, _, (raw_only, raw_count) = served_run
    assert raw_only != run_id
    assert raw_count == demo_manifest["records"]


def test_whole_job_through_graphql(served_run, demo_manifest):
    server, run_id, _, _ = served_run
    raw = server.latest_metadata("raw_records")
    assert raw["docs_out"] == demo_manifest["records"]
    funnel = server.latest_metadata("funnel_telemetry")
    assert funnel["raw_records"] == demo_manifest["records"] + len(demo_manifest["rejected_raw"])
    assert funnel["conserved"] is True
    assert funnel["tokens"] > 0
    assert "after dedup" in funnel["funnel"]


@pytest.mark.skipif(find_chromium() is None, reason="Chromium is not installed (.ci/run installs Debian's chromium)")
def test_ui_pages_render_without_error(served_run):
    server, _, data, _ = served_run
    shots = take_screenshots(server.url, data / "screenshots")
    assert set(shots) == {"asset-graph", "funnel-asset"}
