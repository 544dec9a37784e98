"""Issue 27 item 9: refused files are reported, not lost. FIFOs, sockets and symlinks out of the source are registered
with the batch that first sees them and rejected whole by raw_records with their reason (counted: in = out +
dropped), an unreadable file is read by a later batch once it can be opened, raw_records' stage folder gathers
every batch's `_rejected.jsonl`, and `tokenmill update --drop-batch` retires a failed batch from the command line."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from support import write_batch_file

import tokenmill.batches
from assets.raw import raw_records
from resources import Compute, CorpusSource, DataRoot
from tokenmill.batches import published_batches, quarantine, read_registry, register_new_files, retire_batch
from tokenmill.common.io import REJECTED_FILE
from tokenmill.common.results import read_result
from tokenmill.stages.raw import RawResult, ingest
from tokenmill.stages.raw.discover import source_state

REPO = Path(__file__).resolve().parents[1]


def rejected(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / REJECTED_FILE).read_text().splitlines()]


def register(data: Path, source: Path) -> str | None:
    return register_new_files(data, source, source_state(source, exclude=data))[0]


def ingest_batch(source: Path, out: Path, data: Path, key: str, **settings) -> dict:
    batch = read_registry(data).batch(key)
    stats = ingest(source, out, workers=1, only=batch.files, refused=batch.refused, **settings)
    assert stats.docs_in == stats.docs_out + stats.rejected  # refused files are counted
    return stats


def test_fifo_socket_and_outside_symlink_are_registered_and_rejected_with_their_reason(tmp_path):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_batch_file(source / "good.jsonl", 5, seed=1)
    os.mkfifo(source / "pipe.jsonl")  # opened for reading, it would block until a writer comes: forever
    outside = tmp_path / "outside" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text("a file outside the source\n")
    os.symlink(outside, source / "link.txt")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(source / "sock.txt"))
    try:
        key = register(data, source)
        batch = read_registry(data).batch(key)
        assert set(batch.files) == {"good.jsonl"}
        assert {f: why[0] for f, why in batch.refused.items()} == {
            "link.txt": "outside_source",
            "pipe.jsonl": "not_a_regular_file",
            "sock.txt": "not_a_regular_file",
        }
        stats = ingest_batch(source, tmp_path / "out", data, key)
        assert stats.docs_out == 5 and stats.rejected_by_reason == {"not_a_regular_file": 2, "outside_source": 1}
        by_path = {r["path"]: r for r in rejected(tmp_path / "out")}
        assert "a FIFO" in by_path["pipe.jsonl"]["detail"] and "a socket" in by_path["sock.txt"]["detail"]
        assert "follow_outside_symlinks" in by_path["link.txt"]["detail"]
        assert register(data, source) is None  # reported once, in the batch that first saw them

        followed = ingest_batch(source, tmp_path / "followed", data, key, settings=_follow())
        assert followed.rejected_by_reason == {"not_a_regular_file": 2} and followed.docs_out == 6
    finally:
        sock.close()
    (source / "pipe.jsonl").unlink()
    write_batch_file(source / "pipe.jsonl", 3, seed=2)  # replaced by a regular file: never read, so it is new
    key = register(data, source)
    assert set(read_registry(data).batch(key).files) == {"pipe.jsonl"}


def _follow():
    from tokenmill.stages.raw import RawSettings

    return RawSettings(follow_outside_symlinks=True)


@pytest.fixture
def make_unreadable(monkeypatch):
    """Makes a file unreadable, and readable again. chmod 000 where it stops this user (not root); as root, which
    reads any file, the registry's only way of reading a source file (`content_hash`) raises PermissionError for it
    instead, as open() does after chmod 000."""
    real_hash = tokenmill.batches.content_hash
    blocked: set[Path] = set()

    def content_hash(path):
        if Path(path) in blocked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_hash(path)

    monkeypatch.setattr(tokenmill.batches, "content_hash", content_hash)

    def set_readable(path: Path, readable: bool) -> None:
        if os.geteuid() != 0:
            path.chmod(0o644 if readable else 0)
        elif readable:
            blocked.discard(path)
        else:
            blocked.add(path)

    return set_readable


def test_an_unreadable_file_is_read_by_a_later_batch_once_readable(tmp_path, make_unreadable):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_batch_file(source / "a.jsonl", 5, seed=1)
    write_batch_file(source / "locked.jsonl", 4, seed=2)
    make_unreadable(source / "locked.jsonl", False)
    first = register(data, source)
    assert read_registry(data).batch(first).refused["locked.jsonl"][0] == "unreadable_file"
    stats = ingest_batch(source, tmp_path / "b1", data, first)
    assert stats.docs_out == 5 and stats.rejected_by_reason == {"unreadable_file": 1}
    (entry,) = rejected(tmp_path / "b1")
    assert entry["path"] == "locked.jsonl" and "PermissionError" in entry["detail"]

    assert register(data, source) is None  # still unreadable: not registered again
    make_unreadable(source / "locked.jsonl", True)
    second = register(data, source)
    assert second == "g1-b000002" and set(read_registry(data).batch(second).files) == {"locked.jsonl"}
    stats = ingest_batch(source, tmp_path / "b2", data, second)
    assert stats.docs_out == 4 and stats.rejected == 0
    assert register(data, source) is None  # read now: an ingested file like any other


def test_raw_records_gathers_every_batch_rejected_records(tmp_path):
    """raw_records of two batches: the stage folder's `_rejected.jsonl` is both batches' in batch order, and a
    retired batch's entries leave it (they stay in its quarantine)."""
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    good = "".join(json.dumps({"text": f"kept line {i}"}) + "\n" for i in range(10))
    (source / "a.jsonl").write_text("{broken\n" + good)  # 2 of 12 rejected (the FIFO is one): under the bound
    os.mkfifo(source / "b_pipe.jsonl")
    resources = {
        "source": CorpusSource(path=str(source)),
        "data_root": DataRoot(root=str(data)),
        "compute": Compute(),
    }
    with dg.instance_for_test() as instance:
        for text in (None, "[1]\n" + good):
            if text:
                (source / "c.jsonl").write_text(text)
            key = register(data, source)
            instance.add_dynamic_partitions("source_batch", [key])
            assert dg.materialize([raw_records], instance=instance, partition_key=key, resources=resources).success
    batches = [rejected(data / "raw_records" / key) for key in ("g1-b000001", "g1-b000002")]
    assert [[(r["path"], r["reason"]) for r in b] for b in batches] == [
        [("a.jsonl", "malformed_json"), ("b_pipe.jsonl", "not_a_regular_file")],
        [("c.jsonl", "not_an_object")],
    ]
    assert rejected(data / "raw_records") == batches[0] + batches[1]
    retire_batch(data, "g1-b000002", "test")
    assert rejected(data / "raw_records") == batches[0]
    assert rejected(quarantine(data, "g1-b000002")) == batches[1]


def cli_update(source: Path, data: Path, *args: str) -> subprocess.CompletedProcess:
    """`tokenmill update ARGS` in a subprocess, with a throwaway Dagster instance (DAGSTER_HOME unset)."""
    env = {**os.environ, "TOKENMILL_SOURCE": str(source), "TOKENMILL_DATA": str(data), "TOKENMILL_WORKERS": "1"}
    env.pop("DAGSTER_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "cli", "update", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def write_bad_file(path: Path) -> None:
    path.write_text("{not json\n" * 10 + '{"text": "the only good line"}\n')


def test_drop_batch_on_the_command_line_retires_a_failed_batch(tmp_path):
    """`tokenmill update` fails on a batch of bad lines naming `--drop-batch`; `tokenmill update --drop-batch KEY`
    retires it (its quarantine kept, its outputs removed) and finds nothing else to run: the bad file stays out
    until it changes."""
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_batch_file(source / "a.jsonl", 20, seed=1)
    assert cli_update(source, data).returncode == 0
    write_bad_file(source / "bad.jsonl")
    failed = cli_update(source, data)
    assert failed.returncode == 1 and "--drop-batch g1-b000002" in failed.stderr, failed.stderr[-2000:]
    dropped = cli_update(source, data, "--drop-batch", "g1-b000002")
    assert dropped.returncode == 0, dropped.stderr[-2000:]
    assert "batch g1-b000002 retired" in dropped.stdout and "up to date" in dropped.stdout
    assert read_registry(data).batch("g1-b000002").retired
    assert len(rejected(quarantine(data, "g1-b000002"))) == 10
    assert not (data / "raw_records" / "g1-b000002").exists()


def test_drop_batch_of_the_first_batch_says_up_to_date(tmp_path):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_bad_file(source / "bad.jsonl")
    assert cli_update(source, data).returncode == 1
    dropped = cli_update(source, data, "--drop-batch", "g1-b000001")
    assert read_registry(data).batch("g1-b000001").retired
    assert dropped.returncode == 0, dropped.stderr[-2000:]
    assert "up to date" in dropped.stdout and "nothing published yet" in dropped.stdout


def test_refused_files_do_not_count_toward_the_rejected_share_bound(tmp_path):
    """3 good lines and a FIFO: 1 rejected record of 4 is over the 0.2 bound, but the FIFO is a refused file, not a
    bad line of a file that was read; the batch publishes, the FIFO listed and counted."""
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    (source / "a.jsonl").write_text("".join(json.dumps({"text": f"kept line {i}"}) + "\n" for i in range(3)))
    os.mkfifo(source / "pipe.jsonl")
    resources = {"source": CorpusSource(path=str(source)), "data_root": DataRoot(root=str(data)), "compute": Compute()}
    key = register(data, source)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source_batch", [key])
        assert dg.materialize([raw_records], instance=instance, partition_key=key, resources=resources).success
    stats = read_result(data / "raw_records" / key, RawResult)
    assert (stats.docs_in, stats.docs_out, stats.refused_files) == (4, 3, 1)
    assert [(r["path"], r["reason"]) for r in rejected(data / "raw_records")] == [("pipe.jsonl", "not_a_regular_file")]


def test_a_batch_of_refused_files_alone_is_retired_and_update_goes_on(tmp_path):
    """A FIFO as the only new file: `tokenmill update` retires its batch when registering it (nothing to read: an
    empty batch would fail every stage after raw_records), says so, lists the FIFO in the batch's quarantine and
    exits 0; the next new file comes in as the next batch and publishes."""
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_batch_file(source / "a.jsonl", 20, seed=1)
    assert cli_update(source, data).returncode == 0
    os.mkfifo(source / "pipe.jsonl")
    refused = cli_update(source, data)
    assert refused.returncode == 0, refused.stderr[-2000:]
    assert "batch g1-b000002 retired when registered" in refused.stderr and "pipe.jsonl" in refused.stderr
    assert "up to date" in refused.stdout
    (entry,) = rejected(quarantine(data, "g1-b000002"))
    assert entry["path"] == "pipe.jsonl" and entry["reason"] == "not_a_regular_file" and "a FIFO" in entry["detail"]
    assert read_registry(data).batch("g1-b000002").retired

    write_batch_file(source / "b.jsonl", 20, seed=2)
    third = cli_update(source, data)
    assert third.returncode == 0, third.stderr[-2000:]
    batch = read_registry(data).batch("g1-b000003")
    assert set(batch.files) == {"b.jsonl"} and not batch.refused  # the FIFO was reported once
    assert published_batches(data) == ["g1-b000001", "g1-b000003"]


def test_a_broken_symlink_is_reported_and_read_by_a_later_batch_once_its_target_exists(tmp_path):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_batch_file(source / "good.jsonl", 5, seed=1)
    target = source / "store" / "later.dat"  # not a type the readers list: only the link reads it
    os.symlink(target, source / "link.jsonl")
    first = register(data, source)
    batch = read_registry(data).batch(first)
    assert set(batch.files) == {"good.jsonl"} and batch.refused["link.jsonl"][0] == "unreadable_file"
    stats = ingest_batch(source, tmp_path / "b1", data, first)
    assert stats.docs_out == 5 and stats.rejected_by_reason == {"unreadable_file": 1}
    (entry,) = rejected(tmp_path / "b1")
    assert entry["path"] == "link.jsonl" and f"a symlink to {target}, which does not exist" in entry["detail"]
    assert register(data, source) is None  # reported once, in the batch that first saw it

    target.parent.mkdir()
    write_batch_file(target, 4, seed=2)
    second = register(data, source)
    assert set(read_registry(data).batch(second).files) == {"link.jsonl"}
    assert ingest_batch(source, tmp_path / "b2", data, second).docs_out == 4
    assert register(data, source) is None


def test_a_file_whose_name_is_not_utf8_is_refused_and_counted_under_the_name_it_is_shown_with(tmp_path):
    source, data = tmp_path / "src", tmp_path / "data"
    source.mkdir()
    write_batch_file(source / "good.jsonl", 5, seed=1)
    write_batch_file(Path(os.fsdecode(bytes(source) + b"/caf\xe9.jsonl")), 4, seed=2)
    key = register(data, source)
    assert read_registry(data).batch(key).refused["caf\\xe9.jsonl"][0] == "bad_file_name"
    stats = ingest_batch(source, tmp_path / "out", data, key)
    assert stats.docs_out == 5 and stats.rejected_by_reason == {"bad_file_name": 1} and stats.skipped_files == []
    (entry,) = rejected(tmp_path / "out")
    assert entry["path"] == "caf\\xe9.jsonl" and "rename the file" in entry["detail"]


def test_a_folder_symlink_out_of_the_source_is_reported_not_silently_left_unwalked(tmp_path):
    source, data, outside = tmp_path / "src", tmp_path / "data", tmp_path / "outside"
    source.mkdir()
    outside.mkdir()
    write_batch_file(source / "good.jsonl", 5, seed=1)
    write_batch_file(outside / "elsewhere.jsonl", 4, seed=2)
    os.symlink(outside, source / "linked")
    os.symlink(source / "sub", source / "inside")  # a link to a folder of the source is walked where it lies
    (source / "sub").mkdir()
    write_batch_file(source / "sub" / "b.jsonl", 3, seed=3)
    key = register(data, source)
    assert {f: why[0] for f, why in read_registry(data).batch(key).refused.items()} == {"linked": "outside_source"}
    for settings in ({}, {"settings": _follow()}):  # following file symlinks does not walk linked folders
        stats = ingest_batch(source, tmp_path / f"out{len(settings)}", data, key, **settings)
        assert stats.docs_out == 8 and stats.rejected_by_reason == {"outside_source": 1}
        (entry,) = rejected(tmp_path / f"out{len(settings)}")
        assert entry["path"] == "linked" and f"the folder {outside}" in entry["detail"]
