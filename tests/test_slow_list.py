"""Every entry of conftest's slow list names a test that exists (a renamed test would silently fall back to the
inner loop and its 120 s timeout), and the marks land: `-m "not slow"` leaves those tests out."""

import ast
import subprocess
import sys

from tests.conftest import REPO, SLOW, SLOW_FIXTURES


def functions(path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.FunctionDef)}


def test_every_slow_entry_names_an_existing_file_test_or_fixture():
    missing = []
    for entry in SLOW:
        path, _, test = entry.partition("::")
        if not (REPO / path).is_file() or (test and test not in functions(REPO / path)):
            missing.append(entry)
    missing += [f"{path} fixture {name}" for path, name in SLOW_FIXTURES.items() if name not in functions(REPO / path)]
    assert missing == []


def test_slow_tests_are_left_out_of_the_inner_loop():
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-m",
            "not slow",
            "tests/test_kill_harness.py",
            "tests/test_graph.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "tests/test_kill_harness.py" not in listed and "test_update_runs_the_graph" not in listed, listed
    assert "tests/test_graph.py::test_the_code_location_loads" in listed, listed
