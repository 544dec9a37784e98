"""A partition key never becomes a path: every per-batch asset refuses a key that is no registered source batch
(`../` keys, absolute paths, a typo) before it touches the disk, and the stray partition is removed again."""

import os
from pathlib import Path

import dagster as dg
import pytest

from definitions import build_defs
from resources import Compute, CorpusSource, DataRoot
from tests.support import BATCH, materialize_batch, published_files, write_batch_file
from tokenmill.batches import PARTITIONS_NAME, is_batch_key

PER_BATCH = ["raw_records", "cleaned_jsonl", "dedup_report", "deduped_jsonl"]
HOSTILE_KEYS = [
    "../../../out/x",  # publishes outside the data root without the check
    "../raw_records/g1-b000001",  # replaces raw batch 1 with cleaned records without the check
    "g1-b000001/../../escape",
    "/tmp/tokenmill-absolute",
    "g1-b000001\n",
    "g1-b000009",  # the form of a key, but no batch has it: a typo in the partition dialog
]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A data root with batch 1 materialized through every per-batch asset."""
    base = tmp_path_factory.mktemp("keys")
    source, data = base / "source", base / "work" / "data"
    source.mkdir()
    write_batch_file(source / "a.jsonl", 40, seed=1)
    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
    assets = [defs.get_assets_def(k) for k in PER_BATCH]
    assert materialize_batch(assets, data, source).success
    return base, source, data, assets


def test_the_key_form():
    assert is_batch_key("g1-b000001") and is_batch_key("g12-b1234567")
    for key in HOSTILE_KEYS[:-1] + ["g1-b٠٠١", "", "g1-b", "x/g1-b000001"]:
        assert not is_batch_key(key), key


@pytest.mark.parametrize("asset", PER_BATCH)
def test_a_key_that_is_no_batch_is_refused_and_removed(built, asset):
    base, source, data, assets = built
    before_base = tree(base)
    before_data = published_files(data)
    # a file a `../` key would overwrite outside the data root
    outside = base / "out"
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(PARTITIONS_NAME, [BATCH, *HOSTILE_KEYS])
        for key in HOSTILE_KEYS:
            result = dg.materialize(
                [a for a in assets if asset in {k.to_user_string() for k in a.keys}],
                instance=instance,
                partition_key=key,
                raise_on_error=False,
                resources={
                    "source": CorpusSource(path=str(source)),
                    "data_root": DataRoot(root=str(data)),
                    "compute": Compute(),
                },
            )
            assert not result.success
            (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
            message = failure.step_failure_data.error.to_string()
            assert "UnknownBatchError" in message and repr(key) in message and "was removed" in message, message
            assert key not in instance.get_dynamic_partitions(PARTITIONS_NAME)
        assert instance.get_dynamic_partitions(PARTITIONS_NAME) == [BATCH]
    assert not outside.exists() and not Path("/tmp/tokenmill-absolute").exists()
    assert published_files(data) == before_data  # nothing replaced, nothing added under the data root
    after_base = {k: v for k, v in tree(base).items() if not k.startswith("work/data/")}
    assert after_base == {k: v for k, v in before_base.items() if not k.startswith("work/data/")}


def test_a_batch_another_data_root_materialized_keeps_its_partition(built, tmp_path):
    """One instance may serve several data roots, whose batches share the partitions: a run against a data root
    that lacks a batch is refused, but the partition another root materialized stays."""
    _, source, data, assets = built
    empty_root = tmp_path / "other"
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(PARTITIONS_NAME, [BATCH])
        resources = {"source": CorpusSource(path=str(source)), "compute": Compute()}
        raw = [a for a in assets if "raw_records" in {k.to_user_string() for k in a.keys}]
        kw = dict(instance=instance, partition_key=BATCH, raise_on_error=False)
        assert dg.materialize(raw, resources={**resources, "data_root": DataRoot(root=str(data))}, **kw).success
        refused = dg.materialize(raw, resources={**resources, "data_root": DataRoot(root=str(empty_root))}, **kw)
        assert not refused.success
        assert instance.get_dynamic_partitions(PARTITIONS_NAME) == [BATCH]
    assert not os.path.exists(empty_root / "raw_records" / BATCH)
