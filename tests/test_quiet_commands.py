"""Command lines print what a person reads: no DEBUG event lines, no Python warnings (issue 30 item 6)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def noisy_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "DEBUG" in line or "Warning" in line]


def test_tokenmill_update_prints_no_debug_or_warning_lines(tmp_path, demo_source):
    env = {**os.environ, "TOKENMILL_SOURCE": str(demo_source), "TOKENMILL_DATA": str(tmp_path / "data")}
    env.pop("DAGSTER_HOME", None)
    done = subprocess.run(
        [str(BIN / "tokenmill"), "update"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tokenized_bins" in done.stdout
    assert noisy_lines(done.stdout + done.stderr) == []


def test_dagster_job_execute_with_the_instance_config_prints_no_debug_events(tmp_path, demo_source):
    """dagster_home/dagster.yaml sets the run's console log level: Dagster's default echoes every event at DEBUG.
    The run fails at once (no batch is registered), which is enough to see its event lines."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "TOKENMILL_SOURCE": str(demo_source),
        "TOKENMILL_DATA": str(tmp_path / "data"),
    }
    done = subprocess.run(
        [str(BIN / "dagster"), "job", "execute", "-m", "definitions", "-j", "tokenmill_all"]
        + ["--tags", '{"dagster/partition": "g1-b000001"}'],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert "RUN_START" not in output  # a DEBUG event
    assert " - ERROR - " in output  # the failure still shows
    assert [line for line in output.splitlines() if " - DEBUG - " in line] == []
