"""Shared fixtures (the bundled demo corpus and its ground-truth manifest, where ../shared lives) and the suite's
own machinery: which tests are `slow` (left out of the inner loop, `pytest -m "not slow"`) with their longer
timeout, and the file that names the running test for .ci/run when pytest dies."""

import json
import os
from pathlib import Path

import pytest

from devtools.s3_server import s3_fixtures

REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / "demo_corpus"
# design material and real corpora sit next to the repo (../shared) in CI and in the workspace
SHARED = (REPO.parent / "shared").resolve()

# Tests that took over ~2 s each in the inner loop on the 2-core machine (`--durations`), and those CI's run shows
# slowest: whole-graph runs, in subprocesses (`tokenmill update`, the kill harness) or in process, Ray clusters,
# `dagster dev` and the browser, PostgreSQL, loader tests that spawn workers or processes. A path names every test
# in the file; a node id one test with all its parameters.
SLOW = (
    "tests/stages/clean/test_model_step.py::test_update_with_a_quality_model_runs_the_graph_and_counts_its_step",
    "tests/test_kill_harness.py",
    "tests/s3/test_sources_wiring.py",  # the sensor, raw_records and update over a bucket, in process
    "tests/s3/test_sources_update.py",  # `tokenmill update` from a bucket, three times
    "tests/test_ray.py",
    "tests/test_ui.py",
    "tests/test_run_processes.py",
    "tests/test_production.py",
    "tests/test_refused_runs.py",  # a real `dagster dev` per test
    "tests/test_ui_truths.py::test_readme_sensor_commands_switch_the_sensor_dagster_dev_shows",
    "tests/test_batch_recovery.py",
    "tests/test_partition_keys.py",
    "tests/test_automation.py::test_sensor_requests_one_run_per_new_batch_and_none_otherwise",
    "tests/test_concurrency.py::test_two_updates_on_one_data_root_run_one_after_the_other",
    "tests/test_concurrency.py::test_a_waiting_run_queues_behind_the_holder",
    "tests/stages/dedup/test_dedup_stage.py::test_partitioned_steps_decide_as_one_partition",
    "tests/stages/dedup/test_dedup_stage.py::test_low_entropy_candidates_bounded_per_document",
    "tests/stages/dedup/test_index.py::test_identical_outputs_for_any_worker_count_and_partition",
    "tests/test_demo.py::test_regenerating_gives_the_committed_files",
    "tests/test_graph.py::test_update_runs_the_graph_and_prints_a_summary",
    "tests/test_incremental.py::test_update_command_adds_batches_and_rebuilds_on_request",
    "tests/stages/clean/test_language.py::test_full_curated_corpora_keep_their_shingle_unit",
    "tests/test_operations.py::test_item8_source_and_data_root_problems_are_one_line",
    "tests/test_operations.py::test_item10_update_prints_the_step_the_reason_and_the_log",
    "tests/stages/raw/test_parquet_zstd.py::test_mixed_folder_counts_and_worker_count_do_not_change_outputs",
    "tests/stages/clean/test_pii.py::test_no_planted_address_reaches_the_data_root",
    "tests/stages/raw/test_raw.py::test_gzip_bomb_stops_at_the_limits",
    "tests/stages/raw/test_raw.py::test_raw_records_on_demo_corpus",
    "tests/stages/raw/test_raw.py::test_byte_identical_for_any_worker_count_and_shard_rollover",
    "tests/stages/raw/test_raw.py::test_missing_source_is_a_clear_error_before_any_work",
    "tests/stages/tokenize/test_versions.py::test_a_failed_check_or_a_kill_before_publishing_leaves_the_previous_version",
    "loaders/tests/test_loader_resume.py",
    "loaders/tests/test_loader_ddp.py::test_ddp_ranks_get_equal_batches_and_never_hang",
    "loaders/tests/test_loader_datasets.py::test_readme_loop_on_cpu_cross_entropy_straight_from_the_dataloader",
    "loaders/tests/test_loader_edges.py::test_truncation_under_an_open_reader_is_an_exception_not_sigbus",
    "loaders/tests/test_loader_edges.py::test_workers_refuse_a_dataset_replaced_after_the_parent_opened_it",
    "loaders/tests/test_loader_edges.py::test_workers_keep_reading_the_version_the_parent_opened",
)
# A module fixture that runs the whole graph makes every test of its file that uses it slow (marking only the first
# would move the fixture's run to the next one).
SLOW_FIXTURES = {
    "tests/test_explain.py": "graph",
    "tests/test_forget.py": "graph",
    "tests/test_exports.py": "roots",
    "tests/test_graph.py": "graph_run",
    "tests/test_trace.py": "graph",
    "tests/test_incremental.py": "batches_and_one_build",
    "tests/stages/clean/test_language.py": "curated",
}
SLOW_TIMEOUT = 600  # seconds; every other test has the 120 s of pyproject.toml's `timeout`

# .ci/run sets this to a file that holds `running <node id>` while a test runs and `finished <exit status>` once
# the session ended: when pytest dies (a signal, a crash at exit, a native library's exit) it names the test
CURRENT_TEST_FILE = "TOKENMILL_CURRENT_TEST"


def is_slow(item: pytest.Item) -> bool:
    nodeid = item.nodeid
    if SLOW_FIXTURES.get(nodeid.split("::")[0]) in item.fixturenames:
        return True
    return any(nodeid == name or nodeid.startswith((f"{name}::", f"{name}[")) for name in SLOW)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:  # a test's or module's own timeout stands
                item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


class CurrentTest:
    """Writes the running test's node id to `path` (replaced atomically, so a reader never sees half of it)."""

    def __init__(self, path: str):
        self.path = Path(path)

    def note(self, line: str) -> None:
        partial = self.path.with_name(f".{self.path.name}.partial")
        partial.write_text(line + "\n", encoding="utf-8")
        os.replace(partial, self.path)

    def pytest_sessionstart(self):
        self.note("running (collection)")

    def pytest_runtest_logstart(self, nodeid):
        self.note(f"running {nodeid}")

    def pytest_sessionfinish(self, exitstatus):
        self.note(f"finished {int(exitstatus)}")


def pytest_configure(config):
    # registered as a plugin, not as this conftest's hooks: those would only see the tests under tests/
    if os.environ.get(CURRENT_TEST_FILE):
        config.pluginmanager.register(CurrentTest(os.environ[CURRENT_TEST_FILE]), "tokenmill-current-test")


# a real S3 server on loopback (SeaweedFS) for the tests of object storage: `s3`, and `s3_env` with its AWS variables
s3, s3_env = s3_fixtures()


@pytest.fixture(scope="session")
def demo_source() -> Path:
    """The committed demo corpus inputs (demo_corpus/source)."""
    return DEMO_DIR / "source"


@pytest.fixture(scope="session")
def demo_manifest() -> dict:
    """demo_corpus/manifest.json: what the generator planted (counts, duplicates, garbled ids, ...)."""
    with open(DEMO_DIR / "manifest.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared (design docs, tools, real corpora); tests that need it skip when it is absent."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present")
    return SHARED
