"""Shared fixtures (the bundled demo corpus and its ground-truth manifest, where ../shared lives) and the suite's
own machinery: which tests are `slow` (left out of the inner loop, `pytest -m "not slow"`) with their longer
timeout, and the file that names the running test for .ci/run when pytest dies."""

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / "demo_corpus"
# design material and real corpora sit next to the repo (../shared) in CI and in the workspace
SHARED = (REPO.parent / "shared").resolve()

# Files and tests that take over ~5 s each on the 2-core CI machine (`--durations` of CI's run): whole-graph runs in
# subprocesses (`tokenmill update`, the kill harness), Ray clusters, `dagster dev` and the browser, PostgreSQL.
# A node id names one test (all its parameters); a path names every test in the file.
SLOW = (
    "tests/test_kill_harness.py",
    "tests/test_ray.py",
    "tests/test_ui.py",
    "tests/test_run_processes.py",
    "tests/test_production.py",
    "tests/test_concurrency.py::test_two_updates_on_one_data_root_run_one_after_the_other",
    "tests/test_graph.py::test_update_runs_the_graph_and_prints_a_summary",
    "tests/test_incremental.py::test_update_command_adds_batches_and_rebuilds_on_request",
    "tests/test_operations.py::test_item10_update_prints_the_step_the_reason_and_the_log",
    "tests/test_versions.py::test_a_failed_check_or_a_kill_before_publishing_leaves_the_previous_version",
)
SLOW_TIMEOUT = 600  # seconds; every other test has the 120 s of pyproject.toml's `timeout`

# .ci/run sets this to a file that holds `running <node id>` while a test runs and `finished <exit status>` once
# the session ended: when pytest dies (a signal, a crash at exit, a native library's exit) it names the test
CURRENT_TEST_FILE = "TOKENMILL_CURRENT_TEST"


def is_slow(nodeid: str) -> bool:
    return any(nodeid == name or nodeid.startswith((f"{name}::", f"{name}[")) for name in SLOW)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(item.nodeid):
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
