"""Publishing a stage folder survives a kill at any point: the stage is wholly old or wholly new, and the next
run removes or restores what the interrupted one left."""

import os

import pytest

from tokenmill.common.io import record_shards, recover_data_root, staged_output


def publish(data, text):
    with staged_output(data / "stage") as out:
        (out / "part.txt").write_text(text)


def hidden(data):
    return sorted(p.name for p in data.iterdir() if p.name.startswith("."))


def test_publish_replaces_the_output_and_leaves_one_version(tmp_path):
    publish(tmp_path, "one")
    publish(tmp_path, "two")
    assert (tmp_path / "stage" / "part.txt").read_text() == "two"
    assert len(hidden(tmp_path)) == 1 and (tmp_path / "stage").is_symlink()


def test_a_failed_stage_keeps_the_previous_output(tmp_path):
    publish(tmp_path, "one")
    with pytest.raises(RuntimeError):
        with staged_output(tmp_path / "stage") as out:
            (out / "part.txt").write_text("half")
            raise RuntimeError("stage failed")
    assert (tmp_path / "stage" / "part.txt").read_text() == "one"
    assert len(hidden(tmp_path)) == 1


def test_an_earlier_releases_plain_folder_is_replaced(tmp_path):
    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / "part.txt").write_text("legacy")
    publish(tmp_path, "new")
    assert (tmp_path / "stage" / "part.txt").read_text() == "new"
    assert len(hidden(tmp_path)) == 1


@pytest.mark.parametrize(
    "kill_point", ["while_writing", "after_version_rename", "legacy_moved_aside", "legacy_two_rename_swap"]
)
def test_recovery_after_a_kill(tmp_path, kill_point):
    """Each case recreates on disk what a SIGKILL at that point of the swap leaves, then recovers."""
    publish(tmp_path, "old")
    current = os.readlink(tmp_path / "stage")
    if kill_point == "while_writing":
        (tmp_path / ".stage.staging-20990101T000000000000000-aaaaaa").mkdir()
        expected = "old"
    elif kill_point == "after_version_rename":
        new = tmp_path / ".stage.v-20990101T000000000000000-aaaaaa"
        new.mkdir()
        (new / "part.txt").write_text("new")
        expected = "old"  # the pointer still names the old version: the new one was never published
    elif kill_point == "legacy_moved_aside":  # plain folder renamed aside, pointer not yet created
        os.unlink(tmp_path / "stage")
        os.rename(tmp_path / current, tmp_path / ".stage.v-0-legacy-x")
        new = tmp_path / ".stage.v-20990101T000000000000000-aaaaaa"
        new.mkdir()
        (new / "part.txt").write_text("new")
        expected = "new"  # complete and newest
    else:  # the earlier release's swap: final renamed to .old-*, staging not yet renamed in
        os.unlink(tmp_path / "stage")
        os.rename(tmp_path / current, tmp_path / ".stage.old-1234abcd")
        (tmp_path / ".stage.staging-1234abcd").mkdir()
        expected = "old"
    actions = recover_data_root(tmp_path)
    assert actions
    assert (tmp_path / "stage" / "part.txt").read_text() == expected
    assert len(hidden(tmp_path)) == (1 if (tmp_path / "stage").is_symlink() else 0)
    assert recover_data_root(tmp_path) == []  # nothing left to do


def test_recovery_reaches_the_batch_folders_of_a_partitioned_stage(tmp_path):
    data = tmp_path / "data"
    with staged_output(data / "raw_records" / "g1-b000001") as out:
        (out / "part-00000.jsonl").write_text("{}\n")
    (data / "raw_records" / ".g1-b000002.staging-20260101T000000000000000-abcdef").mkdir()
    actions = recover_data_root(data)
    assert actions == ["raw_records/g1-b000002: removed unfinished .g1-b000002.staging-20260101T000000000000000-abcdef"]
    assert (data / "raw_records" / "g1-b000001" / "part-00000.jsonl").exists()


def test_record_shards_of_a_partitioned_stage_are_the_published_batches_only(tmp_path):
    """A batch folder is a link to a hidden version folder; a run may be writing a hidden staging folder beside
    it. Readers of the whole stage (exports, lineage, checks) see each published shard once."""
    stage = tmp_path / "deduped_jsonl"
    for batch in ("b1", "b2"):
        with staged_output(stage / batch) as out:
            (out / "part-00000.jsonl").write_text("{}\n")
    (stage / ".b3.staging-x").mkdir()
    (stage / ".b3.staging-x" / "part-00000.jsonl").write_text("{}\n")
    assert record_shards(stage) == [stage / "b1" / "part-00000.jsonl", stage / "b2" / "part-00000.jsonl"]
