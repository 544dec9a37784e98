"""The wiring over a source on object storage: the sensor plans the bucket's objects as a batch, raw_records registers
and reads it (its metadata free of credentials), and `tokenmill update`'s registration takes new objects as the next
batch and names a changed one."""

from __future__ import annotations

import json

import dagster as dg
import s3fs

from assets.batches import register_batches
from assets.raw import raw_records
from automation import next_batch
from resources import Compute, CorpusSource, DataRoot
from tokenmill.batches import PLANNED_BATCH_TAG, read_registry
from tokenmill.common.io import iter_jsonl, record_shards


def test_sensor_plans_objects_raw_records_reads_them_and_update_sees_new_and_changed_ones(s3_env, tmp_path):
    s3fs.S3FileSystem.clear_instance_cache()  # one made with another test's variables must not answer
    s3 = s3_env
    bucket = s3.make_bucket("wiring")
    client = s3.client()
    client.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=b'{"text": "first"}\n{"text": "second"}\n')
    client.put_object(Bucket=bucket, Key="corpus/sub/b.jsonl", Body=b'{"text": "third"}\n')
    url, data = f"s3://{bucket}/corpus/", tmp_path / "data"
    source, data_root = CorpusSource(path=url), DataRoot(root=str(data))

    with dg.instance_for_test() as instance:
        planned = next_batch(source, data_root, instance)
        assert not isinstance(planned, str), planned
        assert (planned.key, planned.planned, planned.files) == ("g1-b000001", True, 2)
        instance.add_dynamic_partitions("source_batch", [planned.key])
        run = dg.materialize(
            [raw_records],
            instance=instance,
            partition_key=planned.key,
            tags={PLANNED_BATCH_TAG: planned.key},
            resources={"source": source, "data_root": data_root, "compute": Compute()},
        )
        metadata = run.asset_materializations_for_node("raw_records")[0].metadata
        assert metadata["docs_out"].value == 3 and metadata["remote_retries"].value == 0
        shown = json.dumps({k: str(v.value) for k, v in metadata.items()})
        assert s3.secret_key not in shown and s3.access_key not in shown
        folder = data / "raw_records" / planned.key
        assert [r["source"]["path"] for s in record_shards(folder) for r in iter_jsonl(s)] == [url + "a.jsonl"] * 2 + [
            url + "sub/b.jsonl"
        ]

        client.put_object(Bucket=bucket, Key="corpus/sub/c.jsonl", Body=b'{"text": "fourth"}\n')
        pending, waiting = register_batches(instance, data, source.resolved())
        assert pending == ["g1-b000001", "g1-b000002"] and waiting is None
        assert list(read_registry(data).batch("g1-b000002").files) == [url + "sub/c.jsonl"]

        client.put_object(Bucket=bucket, Key="corpus/a.jsonl", Body=b'{"text": "FIRST"}\n{"text": "second"}\n')
        pending, waiting = register_batches(instance, data, source.resolved())
        assert pending == ["g1-b000001", "g1-b000002"]
        assert waiting is not None and f"{url}a.jsonl (batch g1-b000001)" in waiting


def test_an_unreachable_bucket_skips_the_tick_naming_it_without_credentials(s3_env, tmp_path, monkeypatch):
    """A sensor tick over a store that does not answer is skipped with one line naming the URL (the next tick tries
    again), not failed with a stack; the secret stays out of it."""
    from devtools.s3_server import free_port_pair

    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port_pair()}")  # nothing listens there
    source, data_root = CorpusSource(path="s3://gone/corpus/"), DataRoot(root=str(tmp_path / "data"))
    with dg.instance_for_test() as instance:
        skipped = next_batch(source, data_root, instance)
    assert isinstance(skipped, str) and "s3://gone/corpus/" in skipped, skipped
    assert s3_env.secret_key not in skipped and "Traceback" not in skipped
    s3fs.S3FileSystem.clear_instance_cache()
