"""One run at a time per data root: a second run is refused naming the holder, or queues behind it; a dead
holder never leaves the data root locked."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import dagster as dg
import pytest

from definitions import build_defs
from resources import CorpusSource, DataRoot
from tokenmill.common.lock import LOCK_FILE, DataRootLock
from tokenmill.errors import DataRootBusyError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hold_lock(data_root, run_id: str, seconds: float) -> subprocess.Popen:
    """Another process holding the data root's lock, as a concurrent run would; returns once it holds it."""
    script = textwrap.dedent(f"""
        import sys, time
        from tokenmill.common.lock import DataRootLock
        DataRootLock({str(data_root)!r}).acquire({run_id!r})
        print("held", flush=True)
        time.sleep({seconds})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_holder_is_refused_naming_the_first(tmp_path):
    holder = hold_lock(tmp_path, "run-A", 60)
    try:
        with pytest.raises(DataRootBusyError, match="run-A"):
            DataRootLock(tmp_path).acquire("run-B")
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_releases_the_lock(tmp_path):
    holder = hold_lock(tmp_path, "run-A", 60)
    os.kill(holder.pid, signal.SIGKILL)  # as the OOM killer would: no cleanup runs
    holder.wait()
    with DataRootLock(tmp_path).acquire("run-B"):
        assert "run-B" in (tmp_path / LOCK_FILE).read_text()


def test_a_waiting_run_queues_behind_the_holder(tmp_path):
    holder = hold_lock(tmp_path, "run-A", 1.5)
    start = time.monotonic()
    with DataRootLock(tmp_path).acquire("run-B", wait_seconds=30):
        waited = time.monotonic() - start
    holder.wait()
    assert 0.5 < waited < 30


def test_a_run_on_a_busy_data_root_fails_before_any_materialization(tmp_path, demo_source):
    data = tmp_path / "data"
    holder = hold_lock(data, "other-run", 60)
    try:
        defs = build_defs(CorpusSource(path=str(demo_source)), DataRoot(root=str(data)))
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions("source_batch", ["g1-b000001"])
            result = defs.resolve_job_def("tokenmill_all").execute_in_process(
                instance=instance, partition_key="g1-b000001", raise_on_error=False
            )
            assert not result.success
            assert not result.get_asset_materialization_events()
            failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.RESOURCE_INIT_FAILURE)
            assert "in use by run other-run" in failure.event_specific_data.error.to_string()
    finally:
        holder.kill()
        holder.wait()
    assert not any(p.name != LOCK_FILE for p in data.iterdir())  # nothing written while it was refused


def test_two_updates_on_one_data_root_run_one_after_the_other(tmp_path, demo_source):
    """The reported case (two runs 2 s apart on one TOKENMILL_DATA): with a lock wait the second queues, both
    succeed, and the data root holds one consistent dataset."""
    env = {
        **os.environ,
        "TOKENMILL_SOURCE": str(demo_source),
        "TOKENMILL_DATA": str(tmp_path / "data"),
        "TOKENMILL_LOCK_WAIT": "300",
        "DAGSTER_HOME": str(tmp_path / "home"),
        "TOKENMILL_WORKERS": "1",
    }
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    cmd = [sys.executable, "-m", "cli", "update"]
    subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "dagster"), "instance", "migrate"],
        env=env,
        cwd=REPO,
        capture_output=True,
        check=True,
    )  # a fresh SQLite instance is created once, not raced
    first = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    second = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    errors = [p.communicate(timeout=600)[1] for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, [e[-2000:] for e in errors]
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tokenmill_loader import open_store; import sys; open_store(sys.argv[1], verify=True)",
            str(tmp_path / "data" / "tokenized_bins" / "train"),
        ],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
