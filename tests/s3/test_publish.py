"""`tokenmill publish --to s3://...` against a real S3 server on loopback: the layout the loader reads there as it
reads the local folder, the pointer last (a killed publish leaves the previous version and resumes without
uploading again what is there), multipart uploads, retention in the prefix, and no credentials anywhere."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import s3fs

from tokenmill.errors import ConfigError
from tokenmill.publish import publish_dataset
from tokenmill_loader import DatasetError, open_store
from tokenmill_loader.format import (
    CURRENT_FILE,
    DATASET_FILE,
    SHARD_META_FILE,
    SPLITS,
    TOKENIZER_FILE,
    data_file,
    dataset_manifest,
    dumps_compact,
    key_meta,
    shard_entry,
    shard_folder_name,
    version_file,
)

VOCAB = 4096
MIB = 1 << 20


def _entry(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_shard(folder: Path, index: int, tokens: int) -> dict:
    """A seq shard of `tokens` tokens, documents of 100, ids drawn from the shard's own seed."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(index).integers(3, VOCAB, size=tokens, dtype=np.uint16)
    ids.tofile(folder / data_file("sequence"))
    offsets = np.append(np.arange(0, tokens, 100), tokens)
    (folder / SHARD_META_FILE).write_bytes(dumps_compact({"sequence": key_meta(np.uint16, offsets)}))
    files = {name: _entry(folder / name) for name in (data_file("sequence"), SHARD_META_FILE)}
    return shard_entry(folder.name, tokens=tokens, records=len(offsets) - 1, max_token_id=int(ids.max()), files=files)


def write_version(bins: Path, version: int, shards: dict[int, int]) -> None:
    """Version `version` of train and val listing `shards` (index -> tokens; written when not there yet), with a
    tokenizer copy, published locally as tokenized_bins does: manifests, tokenizer.json, then current.json."""
    tokenizer = b'{"model": "stand-in"}'
    sha = hashlib.sha256(tokenizer).hexdigest()
    for split in SPLITS:
        folder = bins / split
        entries = []
        for index, tokens in shards.items():
            shard = folder / shard_folder_name(index)
            entries.append(write_shard(shard, index, tokens if split == "train" else min(tokens, 500)))
        (folder / f"tokenizer-{sha[:16]}.json").write_bytes(tokenizer)
        (folder / TOKENIZER_FILE).write_bytes(tokenizer)
        manifest = dataset_manifest(
            training_type="seq",
            split=split,
            vocab_size=VOCAB,
            token_dtype="uint16",
            special_tokens={"<s>": 0, "</s>": 1, "<pad>": 2},
            tokenizer={"file": f"tokenizer-{sha[:16]}.json", "sha256": sha, "vocab_size": VOCAB},
            keys=["sequence"],
            shards=entries,
            totals={"tokens": sum(e["tokens"] for e in entries), "records": sum(e["records"] for e in entries)},
            version={"version": version, "generation": 1, "batches": [f"g1-b{k:04d}" for k in range(version)]},
        )
        (folder / version_file(version)).write_bytes(json.dumps(manifest).encode())
        (folder / DATASET_FILE).write_bytes(json.dumps(manifest).encode())
    (bins / CURRENT_FILE).write_text(json.dumps({"version": version}))


@pytest.fixture
def destination(s3_env) -> str:
    return f"s3://{s3_env.make_bucket(f'publish-{uuid.uuid4().hex[:12]}')}/corpora/demo"


def keys_under(s3, url: str) -> dict[str, dict]:
    bucket, prefix = url[len("s3://") :].split("/", 1)
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"][len(prefix) + 1 :]: o for page in pages for o in page.get("Contents", [])}


def windows(store, n: int = 20, length: int = 64) -> list[bytes]:
    starts = np.linspace(0, store.num_items() - length, n).astype(np.int64)
    return [store.read("sequence", int(s), int(s) + length).tobytes() for s in starts]


def test_a_published_version_reads_from_s3_as_it_reads_here_with_large_files_in_parts(tmp_path, destination, s3_env):
    bins = tmp_path / "tokenized_bins"
    write_version(bins, 1, {0: 6 * MIB, 1: 3000})  # shard 0's 12 MiB go up in 5 MiB parts
    logged: list[str] = []
    result = publish_dataset(bins, destination, part_bytes=5 * MIB, log=logged.append)
    assert result.version == 1 and result.skipped == 0 and result.uploaded == result.files and result.multipart == 1
    there = keys_under(s3_env, destination)
    assert there["train/shard-00000/sequence.bin"]["ETag"].strip('"').endswith("-3")  # a multipart upload's ETag
    assert {CURRENT_FILE, "train/dataset.v000001.json", "val/dataset.json", "train/tokenizer.json"} <= set(there)
    for split in SPLITS:
        local = open_store(bins / split)
        remote = open_store(f"{destination}/{split}", cache_dir=tmp_path / "cache")
        assert remote.version == 1 and remote.fingerprint == local.fingerprint
        assert windows(remote) == windows(local)
        assert remote.tokenizer_path().read_bytes() == local.tokenizer_path().read_bytes()
    again = publish_dataset(bins, destination, part_bytes=5 * MIB)
    assert again.uploaded == 0 and again.skipped == again.files  # nothing to do
    secrets = (s3_env.secret_key, s3_env.access_key)
    text = " ".join(logged) + repr(result) + json.dumps(result.as_metadata())
    assert not any(secret in text for secret in secrets)


def publish_in_a_child(bins: Path, to: str, failpoint: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    code = f"from tokenmill.publish import publish_dataset; publish_dataset({str(bins)!r}, {to!r})"
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env, "TOKENMILL_FAILPOINT": failpoint}, capture_output=True
    )


def test_a_killed_publish_leaves_the_previous_version_readable_and_resumes_with_what_is_missing(
    tmp_path, destination, s3_env
):
    bins = tmp_path / "tokenized_bins"
    write_version(bins, 1, {0: 4000, 1: 4000})
    publish_dataset(bins, destination)
    write_version(bins, 2, {0: 4000, 1: 4000, 2: 4000, 3: 4000, 4: 4000})
    killed = publish_in_a_child(bins, destination, "publish:uploaded:train/shard-00003/sequence.bin", s3_env.env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    there = keys_under(s3_env, destination)
    assert "train/shard-00003/sequence.bin" in there and "train/dataset.v000002.json" not in there
    # a reader of the prefix still opens version 1, whole, as the local folder holds it
    reader = open_store(f"{destination}/train", cache_dir=tmp_path / "cache")
    assert reader.version == 1 and windows(reader) == windows(open_store(bins / "train", version=1))
    resumed = publish_dataset(bins, destination)
    assert resumed.version == 2 and resumed.skipped >= 1 + 2 * 4  # v1's shards (2 files each, per split) and more
    assert resumed.uploaded < resumed.files
    reader = open_store(f"{destination}/train", cache_dir=tmp_path / "cache")
    assert reader.version == 2 and windows(reader) == windows(open_store(bins / "train"))


def test_a_publish_killed_after_its_switch_completes_the_dataset_json_copies(tmp_path, destination, s3_env):
    bins = tmp_path / "tokenized_bins"
    write_version(bins, 1, {0: 3000})
    publish_dataset(bins, destination)
    write_version(bins, 2, {0: 3000, 1: 3000})
    assert publish_in_a_child(bins, destination, "publish:switched", s3_env.env).returncode == -signal.SIGKILL
    bucket, prefix = destination[len("s3://") :].split("/", 1)
    copy = s3_env.client().get_object(Bucket=bucket, Key=f"{prefix}/val/{DATASET_FILE}")["Body"].read()
    assert json.loads(copy)["version"] == 1  # lagging, while current.json already says 2
    assert open_store(f"{destination}/val", cache_dir=tmp_path / "cache").version == 2
    resumed = publish_dataset(bins, destination)
    assert resumed.uploaded == 2  # the two dataset.json copies
    copy = s3_env.client().get_object(Bucket=bucket, Key=f"{prefix}/val/{DATASET_FILE}")["Body"].read()
    assert json.loads(copy)["version"] == 2


def test_retention_applies_in_the_prefix_as_it_does_locally(tmp_path, destination, s3_env):
    bins = tmp_path / "tokenized_bins"
    write_version(bins, 1, {0: 3000, 1: 3000})
    publish_dataset(bins, destination)
    write_version(bins, 2, {2: 3000})  # a new generation: version 2 lists other shards only
    kept = publish_dataset(bins, destination, retention_hours=24)
    assert kept.removed_versions == [] and "train/shard-00000/sequence.bin" in keys_under(s3_env, destination)
    expired = publish_dataset(bins, destination, retention_hours=0, keep_versions=1)
    assert expired.removed_versions == [1] and expired.removed_objects == 2 * 2 * 2  # 2 shards x 2 files x 2 splits
    there = keys_under(s3_env, destination)
    assert not any(k.startswith(("train/shard-00000", "val/shard-00001")) for k in there)
    assert "train/dataset.v000001.json" not in there and "train/shard-00002/sequence.bin" in there
    with pytest.raises(DatasetError, match=r"dataset.v000001.json: not in object storage .*removed by retention"):
        open_store(f"{destination}/train", cache_dir=tmp_path / "other-cache", version=1)


def test_a_publish_never_moves_readers_back_nor_mixes_builds(tmp_path, destination):
    bins = tmp_path / "tokenized_bins"
    write_version(bins, 1, {0: 3000})
    write_version(bins, 2, {0: 3000, 1: 3000})
    publish_dataset(bins, destination)
    with pytest.raises(ConfigError, match=r"publishes version 2, newer than version 1 here"):
        publish_dataset(bins, destination, version=1)
    other = tmp_path / "other" / "tokenized_bins"
    write_version(other, 2, {0: 2000})
    with pytest.raises(ConfigError, match=r"train/dataset.v000002.json: another build's version 2"):
        publish_dataset(other, destination)


def test_credentials_stay_out_of_errors(tmp_path, destination, s3_env, monkeypatch, request):
    bins = tmp_path / "tokenized_bins"
    write_version(bins, 1, {0: 3000})
    with pytest.raises(ConfigError, match=r"s3://\*\*\*@bucket/p: credentials in the URL are not accepted"):
        publish_dataset(bins, "s3://AKIA123:topsecret@bucket/p")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all")
    s3fs.S3FileSystem.clear_instance_cache()  # a process's s3fs keeps the credentials it first met
    request.addfinalizer(s3fs.S3FileSystem.clear_instance_cache)  # ...and the wrong ones for the next tests
    with pytest.raises(OSError) as refused:
        publish_dataset(bins, destination)
    assert "not-the-secret-at-all" not in str(refused.value) and s3_env.access_key not in str(refused.value)
    assert destination.split("/")[2] in str(refused.value)  # names the bucket


def test_the_command_line_publishes_and_says_how_to_read_it(tmp_path, destination, capsys):
    import cli

    write_version(tmp_path / "tokenized_bins", 1, {0: 3000})
    assert cli.main(["publish", "--to", destination, "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"published version 1 to {destination}: " in out and f'open_store("{destination}/train"' in out
    assert cli.main(["publish", "--to", "s3://u:p@bucket/x", "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("or AWS_PROFILE")
    assert cli.main(["publish", "--to", destination, "--data", str(tmp_path / "nowhere")]) == 2
    assert "current.json: missing" in capsys.readouterr().err
