"""`tokenmill update` over the demo corpus in a bucket: the whole graph from s3://, the same counts as from the
folder, a new object as the next batch, a changed one named and waiting, and the credentials nowhere in what it
printed or wrote."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import REPO

DEMO_SOURCE = REPO / "demo_corpus" / "source"


def update(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "tokenmill"), "update"], env=env, capture_output=True, text=True, timeout=600
    )


def test_update_runs_the_graph_from_a_bucket_and_takes_new_objects_as_batches(s3, tmp_path):
    bucket = s3.make_bucket("demo-update")
    client = s3.client()
    for path in sorted(p for p in DEMO_SOURCE.rglob("*") if p.is_file()):
        client.put_object(
            Bucket=bucket, Key="corpus/" + path.relative_to(DEMO_SOURCE).as_posix(), Body=path.read_bytes()
        )
    url, data = f"s3://{bucket}/corpus/", tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # an ephemeral instance
    env |= {**s3.env, "TOKENMILL_SOURCE": url, "TOKENMILL_DATA": str(data)}

    first = update(env)
    assert first.returncode == 0, first.stderr
    assert f"{url} -> {data}" in first.stdout and "raw_records          2,856 records  (dropped 13)" in first.stdout

    text = '{"text": "A new document arrives in the bucket, long enough to pass every filter of the cleaning stage."}\n'
    client.put_object(Bucket=bucket, Key="corpus/extra/new.jsonl", Body=text.encode())
    second = update(env)
    assert second.returncode == 0, second.stderr
    assert "batch g1-b000002 (1 files)" in second.stdout
    registry = json.loads((data / "_batches.json").read_text())
    assert registry["source"] == url and list(registry["batches"][1]["files"]) == [url + "extra/new.jsonl"]
    raw = Path(data / "raw_records" / "g1-b000002").resolve()
    (record,) = [json.loads(line) for part in sorted(raw.glob("part-*.jsonl")) for line in part.open()]
    assert record["source"] == {"path": url + "extra/new.jsonl", "line": 1}

    client.put_object(Bucket=bucket, Key="corpus/extra/new.jsonl", Body=text.replace("new", "NEW").encode())
    third = update(env)
    assert f"{url}extra/new.jsonl (batch g1-b000002)" in third.stderr

    said = [run.stdout + run.stderr for run in (first, second, third)]
    written = [p.read_bytes().decode("utf-8", "replace") for p in data.rglob("*") if p.is_file()]
    assert not [text for text in said + written if s3.secret_key in text or s3.access_key in text]
