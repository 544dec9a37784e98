"""A full disk is one line naming what was being written, the bytes needed when known and the bytes free; the
stage's previous output stays published. On a small tmpfs where this machine lets the test mount one, else with
the disk-full error injected where the stage writes."""

import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
from support import BATCH, materialize_batch

import assets.clean
import assets.dedup
from assets.clean import cleaned_jsonl
from assets.dedup import dedup_batch_assets, deduped_jsonl
from assets.raw import raw_records
from tokenmill.common.io import staged_output
from tokenmill.common.space import free_bytes
from tokenmill.errors import DiskFullError, failure_reason

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs, where mounting one is allowed (root in a container with the capability); else skipped."""
    where = tmp_path / "small"
    where.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _publish(final: Path, text: str) -> None:
    with staged_output(final) as out:
        (out / "data.txt").write_text(text)


def test_a_write_that_fills_the_disk_is_one_line_and_the_previous_output_stays(small_disk):
    final = small_disk / "cleaned_jsonl"
    _publish(final, "version 1")
    with pytest.raises(DiskFullError) as raised:
        with staged_output(final) as out:
            with open(out / "data.txt", "wb") as f:
                for _ in range(64):
                    f.write(os.urandom(64 * 1024))
                    f.flush()
    message = str(raised.value)
    assert message.startswith(f"no space left on device writing {final}: ") and " free" in message
    assert "\n" not in message
    assert (final / "data.txt").read_text() == "version 1"
    assert [p.name for p in small_disk.iterdir()] == ["cleaned_jsonl", *[p.name for p in small_disk.glob(".*.v-*")]]


def test_a_short_numpy_write_names_the_bytes_it_needed(small_disk):
    final = small_disk / "dedup_report"
    with pytest.raises(DiskFullError, match=rf"writing {final}: [\d,]+ bytes needed, [\d,]+ free"):
        with staged_output(final) as out:
            np.ones(1 << 20, dtype=np.int64).tofile(out / "signatures.npy")  # 8 MiB on a 2 MiB disk
    assert not final.exists()


def test_a_stage_that_cannot_fit_its_estimate_is_refused_before_it_writes(tmp_path):
    needed, final = free_bytes(tmp_path) + (1 << 40), tmp_path / "cleaned_jsonl"
    with pytest.raises(DiskFullError, match=rf"writing {final}: {needed:,} bytes needed, [\d,]+ free"):
        with staged_output(final, needed):
            pytest.fail("the stage ran")
    assert list(tmp_path.iterdir()) == []


def _step_failures(result) -> dict[str, str]:
    return {
        e.step_key: failure_reason(e.event_specific_data.error)
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.STEP_FAILURE
    }


def _source(tmp_path: Path, n: int = 200) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    rows = [{"text": f"record {i}: " + " ".join(uuid.UUID(int=i * 7919 + k).hex for k in range(12))} for i in range(n)]
    (src / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src


def test_enospc_in_a_stage_is_its_step_failure_in_one_line(tmp_path, monkeypatch):
    def no_room(raw, out, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "part-00000.jsonl"))

    monkeypatch.setattr(assets.clean, "clean_corpus", no_room)
    data = tmp_path / "data"
    result = materialize_batch([raw_records, cleaned_jsonl], data, _source(tmp_path), raise_on_error=False)
    (reason,) = _step_failures(result).values()
    written = data / "cleaned_jsonl" / BATCH / "part-00000.jsonl"  # the file as published, not its staging name
    assert reason.startswith(f"DiskFullError: no space left on device writing {written}: ")
    assert "free" in reason and "\n" not in reason
    assert not (data / "cleaned_jsonl" / BATCH).exists()


def test_a_short_numpy_write_in_dedup_is_its_step_failure_in_one_line(tmp_path, monkeypatch):
    def short_write(*args, **kwargs):
        raise OSError("615048 requested and 290288 written")

    monkeypatch.setattr(assets.dedup, "dedup_batch", short_write)
    data = tmp_path / "data"
    assets_ = [raw_records, cleaned_jsonl, dedup_batch_assets, deduped_jsonl]
    result = materialize_batch(assets_, data, _source(tmp_path), raise_on_error=False)
    failures = _step_failures(result)
    assert list(failures) == ["dedup_report"]
    assert failures["dedup_report"].startswith("DiskFullError: no space left on device writing ")
    assert "324,760 bytes needed" in failures["dedup_report"]


def test_tokenmill_update_on_a_full_disk_says_so_in_one_line(tmp_path, small_disk):
    # raw_records fits (about 1 MiB of records on the 2 MiB disk), the cleaned copy would not
    src = _source(tmp_path, n=2_300)
    (tmp_path / "home").mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", tmp_path / "home")
    env = {
        **os.environ,
        "TOKENMILL_SOURCE": str(src),
        "TOKENMILL_DATA": str(small_disk / "data"),
        "DAGSTER_HOME": str(tmp_path / "home"),
        "TOKENMILL_WORKERS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli", "update"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(x for x in done.stderr.splitlines() if "failed:" in x)
    expected = f"no space left on device writing {small_disk / 'data' / 'cleaned_jsonl'}"
    assert expected in line and "bytes needed" in line and "free" in line, done.stderr
    assert "Traceback" not in done.stderr
