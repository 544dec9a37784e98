"""Operations hardening (issue 27): a production block safe to copy, bounds that protect the machine, the source kept
apart from the data root, errors a user can act on, and no pickles in the data root."""

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
from annotated_types import Le, Lt
from pydantic import ValidationError

from definitions import build_defs
from resources import CorpusSource, DataRoot
from runs import still_pending
from tokenmill.batches import FUNNEL_FILE, register_new_files
from tokenmill.common.lock import DataRootLock
from tokenmill.errors import ConfigError, failure_reason
from tokenmill.settings import _SETTINGS_BY_ASSET, validate_run_settings
from tokenmill.stages.raw.discover import source_state
from tokenmill.stages.tokenize.encode import SplitChunk, read_splits, save_splits
from tokenmill.stages.tokenize.settings import MAX_TRAINED_VOCAB, TokenizerSettings

REPO = Path(__file__).resolve().parents[1]
BATCH = "g1-b000001"


def run_job(source: Path, data: Path, partition: str | None = BATCH, run_config: dict | None = None) -> str:
    """tokenmill_all in process with a registered batch; the run's setup failure message ('' when it set up)."""
    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source_batch", [BATCH])
        result = defs.resolve_job_def("tokenmill_all").execute_in_process(
            run_config=run_config or {}, instance=instance, partition_key=partition, raise_on_error=False
        )
        failures = [
            failure_reason(e.event_specific_data.error)
            for e in result.all_events
            if e.event_type == dg.DagsterEventType.RESOURCE_INIT_FAILURE
        ]
    assert not result.success and not result.get_asset_materialization_events()
    return failures[0] if failures else ""


def update(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli", "update", *args],
        cwd=REPO,
        env={**os.environ, "TOKENMILL_WORKERS": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_item2_production_block_is_safe_and_run_config_cannot_move_the_data_root(demo_source, tmp_path):
    page = (REPO / "docs" / "production.md").read_text()  # README.md's "Production deployment" moved there
    block = re.search(r"## Production deployment\n(.*?)(?:\n## |\Z)", page, re.S).group(1)
    assert "-h 127.0.0.1" in block and "0.0.0.0" not in block and "no authentication" in block
    assert "DAGSTER_HOME=$PWD" not in block and "export DAGSTER_HOME=/var/lib/tokenmill/dagster" in block

    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    moved = {"resources": {"data_root": {"config": {"root": str(elsewhere)}}}}
    message = run_job(demo_source, data, run_config=moved)
    assert "data_root.root" in message and str(elsewhere) in message and str(data) in message
    assert not elsewhere.exists() and not data.exists()


def test_item7_bounds_refuse_what_would_exhaust_the_machine(demo_source, tmp_path):
    assert TokenizerSettings(vocab_size=MAX_TRAINED_VOCAB).vocab_size == 2**24
    with pytest.raises(ValidationError, match="vocab_size"):
        TokenizerSettings(vocab_size=MAX_TRAINED_VOCAB + 1)
    with pytest.raises(ConfigError, match=r"tokenizer\.vocab_size.*4294967296"):
        validate_run_settings({"ops": {"tokenizer": {"config": {"vocab_size": 2**32}}}})
    # Dagster's schema carries the type only: the run's setup refuses the bound before any asset
    huge = {"ops": {"tokenizer": {"config": {"vocab_size": 2**32}}}}
    assert "tokenizer.vocab_size" in run_job(demo_source, tmp_path / "data", run_config=huge)
    # reviewed without an upper bound: each is compared with a count or a size, nothing is allocated by it
    # (0 = every record for the tokenizer's samples; raw files are streamed, so a larger cap reads no more at once;
    # cleaning's word, character and document-frequency thresholds only decide which records pass)
    unbounded = {
        "tokenizer": {"sample_chars", "held_out_chars"},
        "tokenized_bins": {"min_val_records"},
        "raw_records": {"max_file_bytes"},
        "cleaned_jsonl": {"gopher_min_words", "gopher_max_words", "c4_max_word_length", "bp_min_df"}
        | {"min_chars", "max_chars"},
    }
    for asset_key, cls in _SETTINGS_BY_ASSET.items():
        for name, field in cls.model_fields.items():
            upper = next((m for m in field.metadata if isinstance(m, Le | Lt)), None)
            if field.annotation not in (int, float) or name in unbounded.get(asset_key, ()):
                continue
            assert upper is not None, f"{asset_key}.{name}: a number setting without an upper bound, not reviewed"
            # the extreme just above the bound is refused, naming the field
            above = (upper.le if isinstance(upper, Le) else upper.lt) + (1 if field.annotation is int else 1e-9)
            with pytest.raises(ConfigError, match=rf"{asset_key}\.{name}\b"):
                validate_run_settings({"ops": {asset_key: {"config": {name: above}}}})
    with pytest.raises(ValidationError, match="lock_wait_seconds"):
        DataRoot(root=str(tmp_path), lock_wait_seconds=float("inf"))


def read_only_folder(tmp_path: Path) -> Path:
    """A folder this user cannot create files in (root writes everywhere but sysfs)."""
    if os.geteuid() == 0:
        return Path("/sys/kernel")
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555, exist_ok=True)
    return folder


def test_item8_source_and_data_root_problems_are_one_line(demo_source, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.jsonl").write_text('{"text": "one record"}\n')
    (tmp_path / "a-file").write_text("")
    cases = {
        "is a file, not a folder": {"TOKENMILL_DATA": str(tmp_path / "a-file")},
        "its parent folder": {"TOKENMILL_DATA": str(tmp_path / "missing" / "data")},
        "is the data root": {"TOKENMILL_DATA": str(source)},
        "is inside the data root": {"TOKENMILL_DATA": str(tmp_path), "TOKENMILL_SOURCE": str(tmp_path / "src")},
        "cannot write there": {"TOKENMILL_DATA": str(read_only_folder(tmp_path))},
        "DAGSTER_HOME": {"DAGSTER_HOME": str(tmp_path / "no-home")},
        "100000 worker processes, at most": {"TOKENMILL_WORKERS": "100000"},  # would exhaust memory spawning
    }
    for expected, env in cases.items():
        done = update({"TOKENMILL_SOURCE": str(source), "TOKENMILL_DATA": str(tmp_path / "d"), **env})
        assert done.returncode == 2 and expected in done.stderr, (expected, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "d").exists()
    # the same problems as a Dagster run's failure message, before the run writes anything
    assert "is a file, not a folder" in run_job(demo_source, tmp_path / "a-file")
    assert "cannot write there" in run_job(demo_source, read_only_folder(tmp_path))
    defs = build_defs(CorpusSource(path=str(tmp_path / "data" / "raw_records")), DataRoot(root=str(tmp_path / "data")))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source_batch", [BATCH])
        result = defs.resolve_job_def("tokenmill_all").execute_in_process(
            instance=instance, partition_key=BATCH, raise_on_error=False
        )
    assert not result.success and "is inside the data root" in str(result.all_events)


def test_item10_update_prints_the_step_the_reason_and_the_log(tmp_path):
    source, config = tmp_path / "src", tmp_path / "run.yaml"
    source.mkdir()
    (source / "a.jsonl").write_text("".join(f'{{"text": "record number {i} of a small corpus"}}\n' for i in range(30)))
    config.write_text("ops:\n  tokenizer:\n    config:\n      tokenizer_path: /nonexistent/tokenizer.json\n")
    env = {"TOKENMILL_SOURCE": str(source), "TOKENMILL_DATA": str(tmp_path / "data")}
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home)
    failed = update({**env, "DAGSTER_HOME": str(home)}, "-c", str(config))
    assert failed.returncode == 1
    lines = failed.stderr.strip().splitlines()
    assert lines[0] == (
        "tokenmill update: batch g1-b000001: step tokenizer failed: "
        "ConfigError: tokenizer file not found: /nonexistent/tokenizer.json"
    ), failed.stderr
    log = Path(re.search(r"full log: (\S+)", lines[1]).group(1))
    assert len(lines) == 2 and log.parent == home / "logs" and "Stack Trace" in log.read_text()


def test_item10_lock_wait_says_for_whom_and_recomputes_the_pending_batches(tmp_path, capsys):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    (source / "a.jsonl").write_text('{"text": "one record"}\n')
    register_new_files(data, source, source_state(source))
    instance, waiting = dg.DagsterInstance.ephemeral(), DataRoot(root=str(data), lock_wait_seconds=30)
    holder = DataRootLock(data).acquire("holder-run")

    def publish_and_release():  # what the holder does: runs the batch through the funnel, then lets go
        time.sleep(1.0)
        (data / FUNNEL_FILE).parent.mkdir()
        (data / FUNNEL_FILE).write_text(f'{{"generation": 1, "batches": [{{"batch": "{BATCH}"}}]}}')
        holder.release()

    threading.Thread(target=publish_and_release).start()
    assert not still_pending(waiting, instance, BATCH)
    said = capsys.readouterr().err
    assert "in use by run holder-run" in said and "waiting up to 30 s (TOKENMILL_LOCK_WAIT)" in said


def test_item10_a_whole_graph_run_without_a_partition_says_how_to_choose_one(demo_source, tmp_path):
    message = run_job(demo_source, tmp_path / "data", partition=None)
    assert "dg launch --job tokenmill_all --partition <batch>" in message and "tokenmill update" in message
    assert """--tags '{"dagster/partition": "<batch>"}'""" in message


def test_item11_encode_task_files_are_plain_arrays(tmp_path):
    chunk = SplitChunk(
        ids=["a", "\ud800 lone surrogate", "漢字"],
        data={"sequence": np.arange(7, dtype=np.uint16)},
        item_lens={"sequence": np.array([2, 2, 3])},
        rec_items={"sequence": np.array([1, 1, 1])},
        rec_tokens=np.array([2, 2, 3]),
        supervised=7,
        punct=1,
    )
    path = tmp_path / "r00000"
    save_splits({"train": chunk, "val": SplitChunk(rec_tokens=np.zeros(0, np.int64))}, str(path))
    for npy in path.iterdir():  # np.load raises on an object (pickled) array
        assert npy.suffix == ".npy" and np.load(npy, allow_pickle=False).dtype != object
    back = read_splits(str(path))
    assert back["train"].ids == chunk.ids and back["val"].ids == []
    assert back["train"].supervised == 7 and back["train"].punct == 1
    assert back["train"].data["sequence"].dtype == np.uint16 and not back["val"].data
    assert np.array_equal(back["train"].data["sequence"], chunk.data["sequence"])
    assert "import pickle" not in (REPO / "tokenmill" / "stages" / "tokenize" / "encode.py").read_text()
