"""Loader edges (issue 13): malformed manifests, shard names leaving the dataset, token ids beyond the vocabulary,
a file truncated under an open reader, workers that would open another dataset than their parent."""

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from tm_writer import random_docs, write_dataset

from tokenmill_loader import DataLoader, DatasetError, RecordDataset, TokenDataset, open_store
from tokenmill_loader.format import validate_dataset

DEEP = "[" * 100_000 + "]" * 100_000  # past the recursion limit: json raises RecursionError
NESTED = "[" * 900 + "0" + "]" * 900  # parses, then is the wrong shape everywhere


def _seq(path: Path, n: int = 12, seed: int = 0, **kw) -> Path:
    return write_dataset(path, random_docs(n, seed=seed), "seq", shard_records=4, **kw)


def _set(obj, where: tuple, value):
    for k in where[:-1]:
        obj = obj[k]
    obj[where[-1]] = value


def _relist(path: Path) -> None:
    """dataset.json lists every meta.json's current size and hash, so only the meta.json edit is wrong."""
    dpath = path / "dataset.json"
    info = json.loads(dpath.read_text())
    for entry in info["shards"]:
        data = (path / entry["name"] / "meta.json").read_bytes()
        entry["files"]["meta.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    dpath.write_text(json.dumps(info))


# each case: (file, edit): edit is the raw text to write, or (path in the parsed JSON, value) to set there;
# a str value starting with "@" is spliced in raw (NaN, huge numbers, deep nesting)
MALFORMED = {
    "dataset.json": {
        "top-level list": (("@",), "[1, 2]"),
        "top-level null": (("@",), "null"),
        "empty file": (("@",), ""),
        "not UTF-8": (("@",), "\udcff"),
        "past the recursion limit": (("@",), DEEP),
        "format_version true": (("format_version",), True),
        "training_type a list": (("training_type",), ["seq"]),
        "shards an object": (("shards",), {"shard-00000": {}}),
        "shard entry a list": (("shards", 0), ["shard-00000"]),
        "shard entry nested 900 deep": (("shards", 0), "@" + NESTED),
        "shard name a number": (("shards", 0, "name"), 0),
        "files a list": (("shards", 0, "files"), ["sequence.bin"]),
        "file entry a list": (("shards", 0, "files", "sequence.bin"), [12, "abc"]),
        "bytes NaN": (("shards", 0, "files", "sequence.bin", "bytes"), "@NaN"),
        "bytes Infinity": (("shards", 0, "files", "sequence.bin", "bytes"), "@Infinity"),
        "bytes 5000 digits": (("shards", 0, "files", "sequence.bin", "bytes"), "@" + "9" * 5000),
        "sha256 a number": (("shards", 0, "files", "sequence.bin", "sha256"), 12),
        "records negative": (("shards", 0, "records"), -4),
        "records a float": (("shards", 0, "records"), 4.0),
        "max_token_id a string": (("shards", 0, "max_token_id"), "12"),
        "max_token_id below -1": (("shards", 0, "max_token_id"), -7),
        "max_token_id huge": (("shards", 0, "max_token_id"), 10**30),
        "vocab_size negative": (("vocab_size",), -1),
        "vocab_size zero": (("vocab_size",), 0),
        "vocab_size 1e400": (("vocab_size",), "@1e400"),
        "vocab_size huge": (("vocab_size",), 10**40),
        "vocab_size nested": (("vocab_size",), "@" + NESTED),
        "token_dtype a list": (("token_dtype",), ["uint16"]),
        "keys a list": (("keys",), ["sequence"]),
        "key spec a string": (("keys", "sequence"), "uint16"),
        "key dtype a list": (("keys", "sequence", "dtype"), ["uint16"]),
        "key dtype object": (("keys", "sequence", "dtype"), "object"),
        "key name a path": (("keys", "../sequence"), {"dtype": "uint16", "kind": "tokens"}),
        "special token a string": (("special_tokens", "<pad>"), "two"),
        "special token a list": (("special_tokens", "<pad>"), [2]),
        "special token beyond vocab": (("special_tokens", "<pad>"), 10**6),
        "totals a list": (("totals",), [1]),
        "totals.records an object": (("totals", "records"), {"n": 12}),
        "tokenizer file leaves": (("tokenizer",), {"file": "../../secret.json"}),
    },
    "meta.json": {
        "top-level list": (("@",), "[]"),
        "past the recursion limit": (("@",), DEEP),
        "key a list": (("sequence",), [0, 1]),
        "key a path": (("../../x",), {"shape": [0], "dtype": "uint16", "offsets": [0]}),
        "shape a string": (("sequence", "shape"), "12"),
        "shape 1e400": (("sequence", "shape"), "@[1e400]"),
        "shape NaN": (("sequence", "shape"), "@[NaN]"),
        "shape negative": (("sequence", "shape"), [-1]),
        "shape nested": (("sequence", "shape"), [[40]]),
        "dtype object": (("sequence", "dtype"), "object"),
        "dtype a subarray": (("sequence", "dtype"), "(2,)u2"),
        "dtype big-endian": (("sequence", "dtype"), ">u2"),
        "dtype a list": (("sequence", "dtype"), ["uint16"]),
        "offsets ragged": (("sequence", "offsets"), [[0], [1, 2]]),
        "offsets nested 900 deep": (("sequence", "offsets"), "@" + NESTED),
        "offsets an object": (("sequence", "offsets"), {"0": 0}),
        "offsets floats": (("sequence", "offsets"), [0.0, 1.5]),
        "offsets huge": (("sequence", "offsets"), [0, 10**30]),
        "offsets missing": (("sequence", "offsets"), "@null"),
    },
}
CASES = [(f, name) for f, cases in MALFORMED.items() for name in cases]


def _write_malformed(path: Path, file: str, where: tuple, value) -> Path:
    target = path / "dataset.json" if file == "dataset.json" else path / "shard-00000" / "meta.json"
    if where == ("@",):
        target.write_bytes(value.encode("utf-8", "surrogateescape"))
    else:
        obj = json.loads(target.read_text())
        raw = isinstance(value, str) and value.startswith("@")
        _set(obj, where, "@RAW@" if raw else value)
        text = json.dumps(obj)
        target.write_text(text.replace('"@RAW@"', value[1:]) if raw else text)
    if file == "meta.json":
        _relist(path)
    return target


@pytest.mark.parametrize("file, case", CASES, ids=[f"{f}: {c}" for f, c in CASES])
def test_malformed_manifest_is_a_dataset_error_naming_the_file(tmp_path, file, case):
    path = _seq(tmp_path / "d")
    where, value = MALFORMED[file][case]
    _write_malformed(path, file, where, value)
    opens = [lambda verify: open_store(path, verify=verify)]
    if file == "meta.json":  # the shard folder opened alone reads the same meta.json
        opens.append(lambda verify: open_store(path / "shard-00000", verify=verify))
    for open_ in opens:
        for verify in (False, True):
            with pytest.raises(DatasetError, match=file.replace(".", r"\.")) as e:
                ds = RecordDataset(open_(verify))
                ds.pad_id, ds.store.tokenizer_path()  # what reads special_tokens and tokenizer.file
            assert len(str(e.value)) < 1000  # a hostile value is not echoed whole


# ---------------------------------------------------------------------------- confinement
def _outside_copy(tmp_path: Path, path: Path) -> Path:
    outside = tmp_path / "outside"
    shutil.copytree(path / "shard-00000", outside)
    return outside


@pytest.mark.parametrize("verify", [False, True])
def test_shard_names_leaving_the_dataset_are_refused(tmp_path, verify):
    path = _seq(tmp_path / "d")
    outside = _outside_copy(tmp_path, path)
    original = (path / "dataset.json").read_text()

    def with_name(name):
        info = json.loads(original)
        info["shards"][0]["name"] = name
        (path / "dataset.json").write_text(json.dumps(info))

    for name in ("../outside", str(outside), "shard-00000/..", ".", "..", "shard-00000/../../outside", ""):
        with_name(name)
        with pytest.raises(DatasetError, match=r"dataset\.json: shard name .* is not a plain name"):
            open_store(path, verify=verify)
    (path / "dataset.json").write_text(original)
    open_store(path, verify=verify)


@pytest.mark.parametrize("verify", [False, True])
def test_symlinks_leaving_the_dataset_are_refused(tmp_path, verify):
    path = _seq(tmp_path / "d")
    outside = _outside_copy(tmp_path, path)
    shard = path / "shard-00000"
    backup = tmp_path / "backup"
    shutil.copytree(shard, backup)

    def restore():
        shutil.rmtree(shard) if not shard.is_symlink() else shard.unlink()
        shutil.copytree(backup, shard)

    # the whole shard folder, the data file, meta.json: identical bytes, but outside the dataset
    shutil.rmtree(shard)
    shard.symlink_to(outside)
    with pytest.raises(DatasetError, match=r"shard-00000: resolves to .*outside"):
        open_store(path, verify=verify)
    for name in ("sequence.bin", "meta.json"):
        restore()
        (shard / name).unlink()
        (shard / name).symlink_to(outside / name)
        with pytest.raises(DatasetError, match=rf"shard-00000/{name.replace('.', '[.]')}: resolves to .*outside"):
            open_store(path, verify=verify)
        with pytest.raises(DatasetError, match="outside"):  # the shard folder opened alone, too
            open_store(shard, verify=verify)
    restore()
    # a dataset reached through a symlink (the data root publishes stage folders so) is fine
    (tmp_path / "link").symlink_to(path)
    assert open_store(tmp_path / "link", verify=verify).num_records == 12


def test_listed_file_names_and_keys_are_confined(tmp_path):
    path = _seq(tmp_path / "d")
    (tmp_path / "secret.bin").write_bytes(b"\0" * 8)
    info = json.loads((path / "dataset.json").read_text())
    info["shards"][0]["files"]["../../secret.bin"] = {"bytes": 8}
    (path / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"dataset\.json: file of shard shard-00000 '\.\./\.\./secret\.bin'"):
        open_store(path)


# ---------------------------------------------------------------------------- token ids and the vocabulary
def _vocab4096(path: Path, n: int = 40) -> Path:
    return write_dataset(
        path, random_docs(n, seed=3, vocab=4096, min_len=30, max_len=80), "seq", shard_records=10, vocab_size=4096
    )


def test_the_test_writer_records_each_shards_max_token_id(tmp_path):
    path = _vocab4096(tmp_path / "d")
    info = json.loads((path / "dataset.json").read_text())
    for entry, shard in zip(info["shards"], validate_dataset(path, scan=True).shards):
        data = np.fromfile(path / entry["name"] / "sequence.bin", dtype="<u2")
        assert entry["max_token_id"] == shard.max_token_id == int(data.max())


def test_tokenmill_writer_records_each_shards_max_token_id(tmp_path):
    shards = pytest.importorskip("tokenmill.stages.tokenize.shards")
    from tokenmill.stages.tokenize.encode import SplitChunk

    rng = np.random.default_rng(0)
    lens = rng.integers(1, 50, 30)
    data = rng.integers(0, 3000, int(lens.sum())).astype(np.uint16)
    ch = SplitChunk(
        ids=[f"{i:016x}" for i in range(30)],
        data={"sequence": data},
        item_lens={"sequence": lens},
        rec_items={"sequence": np.ones(30, np.int64)},
        rec_tokens=lens,
    )
    writer = shards.ShardWriter(tmp_path / "train", "seq", 4096, "uint16", shard_tokens=200)
    writer.add(ch)
    entries = writer.close()
    assert len(entries) > 3
    bounds = np.concatenate([[0], np.cumsum([e["tokens"] for e in entries])])
    for e, lo, hi in zip(entries, bounds[:-1], bounds[1:]):
        assert e["max_token_id"] == int(data[lo:hi].max())


def _set_max_id(path: Path, shard: int, value) -> None:
    info = json.loads((path / "dataset.json").read_text())
    info["shards"][shard]["max_token_id"] = value
    (path / "dataset.json").write_text(json.dumps(info))


def test_recorded_max_token_id_beyond_the_vocabulary_is_refused_at_open(tmp_path):
    path = _vocab4096(tmp_path / "d")
    _set_max_id(path, 2, 65535)
    for verify in (False, True):
        with pytest.raises(
            DatasetError,
            match=r"dataset\.json: shard shard-00002 holds token id 65535 >= "
            r"vocab_size 4096",
        ):
            TokenDataset(path, 64, verify=verify)


def test_recorded_max_token_id_disagreeing_with_the_data_is_refused_with_verify(tmp_path):
    path = _vocab4096(tmp_path / "d")
    true_max = json.loads((path / "dataset.json").read_text())["shards"][1]["max_token_id"]
    _set_max_id(path, 1, true_max - 1)
    open_store(path)  # without verify the data is not read at open
    with pytest.raises(
        DatasetError,
        match=rf"shard-00001: largest token id in the data is {true_max}, "
        rf".*dataset\.json records {true_max - 1}",
    ):
        open_store(path, verify=True)


def test_manifest_without_max_token_id_still_opens(tmp_path):
    """Manifests written before the field keep loading (format_version unchanged)."""
    path = _vocab4096(tmp_path / "d")
    info = json.loads((path / "dataset.json").read_text())
    for entry in info["shards"]:
        del entry["max_token_id"]
    (path / "dataset.json").write_text(json.dumps(info))
    for verify in (False, True):
        ds = TokenDataset(path, 64, verify=verify)
        assert len(ds.get_batch(list(range(len(ds))))["input_ids"]) == len(ds)


def test_token_id_65535_with_vocab_4096_never_reaches_a_batch(tmp_path):
    """The reported case: an id poked into a .bin in place (same size, manifest untouched), verify off."""
    path = _vocab4096(tmp_path / "d")
    f = path / "shard-00002" / "sequence.bin"
    data = np.fromfile(f, dtype="<u2")
    data[17] = 65535
    data.tofile(f)
    with pytest.raises(DatasetError, match=r"shard-00002/sequence\.bin: sha256 differs"):
        open_store(path, verify=True)
    for num_workers in (0, 2):
        ds = TokenDataset(path, 16)
        served = []
        with pytest.raises(DatasetError, match=r"shard-00002/sequence\.bin.*token id 65535 >= vocab_size 4096"):
            for batch in DataLoader(ds, batch_size=4, shuffle=True, seed=1, num_workers=num_workers):
                served.append(batch["input_ids"])
        assert served and max(int(b.max()) for b in served) < 4096
    # record reads and stream reads are guarded too
    rd = RecordDataset(path)
    with pytest.raises(DatasetError, match=r"shard-00002/sequence\.bin \(record 0 of shard-00002\)"):
        [rd[i] for i in range(len(rd))]
    with pytest.raises(DatasetError, match="65535"):
        rd.store.fetch(0, rd.store.num_items())


# ---------------------------------------------------------------------------- truncation under a reader
TRUNCATE_CHILD = textwrap.dedent("""
    import os, sys
    from tokenmill_loader import TokenDataset, RecordDataset
    path, mode = sys.argv[1], sys.argv[2]
    ds = TokenDataset(path, 256) if mode == "windows" else RecordDataset(path)
    last = len(ds) - 1
    ds.get_batch([0, last]) if mode == "windows" else (ds[0], ds[last])  # every shard file mapped
    for name in sorted(os.listdir(path)):
        if name.startswith("shard-"):
            os.truncate(os.path.join(path, name, "sequence.bin"), 4096)
    ds.get_batch([last]) if mode == "windows" else ds[last]  # pages past the new end: SIGBUS without the guard
    print("read past the truncation")
""")


@pytest.mark.parametrize("mode", ["windows", "records"])
def test_truncation_under_an_open_reader_is_an_exception_not_sigbus(tmp_path, mode):
    path = write_dataset(tmp_path / "d", random_docs(400, seed=2, min_len=200, max_len=400), "seq", shard_records=200)
    assert (path / "shard-00001" / "sequence.bin").stat().st_size > 8 * 4096
    child = subprocess.run(
        [sys.executable, "-c", TRUNCATE_CHILD, str(path), mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,
    )
    assert child.returncode == 1, (child.returncode, child.stderr[-2000:])  # a Python exception, not -SIGBUS
    assert "tokenmill_loader.format.DatasetError" in child.stderr
    assert "sequence.bin: 4096 bytes" in child.stderr and "truncated or rewritten in place" in child.stderr


# ---------------------------------------------------------------------------- workers see their parent's dataset
def _replace(path: Path, seed: int) -> None:
    shutil.rmtree(path)
    _seq(path, n=12, seed=seed)


def test_pickled_store_carries_real_path_and_fingerprint(tmp_path):
    path = _seq(tmp_path / "v1")
    (tmp_path / "link").symlink_to(path)
    st = open_store(tmp_path / "link")
    clone = pickle.loads(pickle.dumps(st))
    assert clone.real_path == str(path) and clone.fingerprint == st.fingerprint
    assert torch.equal(clone.fetch(0, 50), st.fetch(0, 50))
    _replace(path, seed=9)
    stale = pickle.loads(pickle.dumps(st))
    for _ in range(2):  # and nothing of the other dataset stays loaded after the refusal
        with pytest.raises(DatasetError, match=r"the dataset changed under the reader"):
            stale.fetch(0, 50)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_refuse_a_dataset_replaced_after_the_parent_opened_it(tmp_path, context):
    path = _seq(tmp_path / "d")
    ds = TokenDataset(path, 8)
    _replace(path, seed=9)  # same path, other content: rewritten in place under the reader
    loader = DataLoader(ds, batch_size=4, shuffle=False, num_workers=2, multiprocessing_context=context)
    with pytest.raises(DatasetError, match=r"the dataset changed under the reader since it was opened"):
        next(iter(loader))


def test_workers_keep_reading_the_version_the_parent_opened(tmp_path):
    """The data root swaps a symlink to publish a new version: a reader keeps the one it opened."""
    v1, v2 = _seq(tmp_path / ".v-1", seed=1), _seq(tmp_path / ".v-2", seed=2)
    link = tmp_path / "tokenized_bins"
    link.symlink_to(v1)
    ds = TokenDataset(link, 8)
    expected = TokenDataset(v1, 8).get_batch(list(range(len(ds))))["input_ids"]
    tmp_link = tmp_path / "tokenized_bins.tmp"
    tmp_link.symlink_to(v2)
    os.replace(tmp_link, link)  # published: the link now names v2
    for context in ("fork", "spawn"):
        loader = DataLoader(ds, batch_size=len(ds), shuffle=False, num_workers=2, multiprocessing_context=context)
        assert torch.equal(next(iter(loader))["input_ids"], expected)


def test_large_meta_json_offsets_parse_as_arrays_equal_to_plain_json(tmp_path):
    """Past 1 MiB, meta.json's plain integer offset lists are parsed by numpy; what comes out equals json's, and
    lists numpy must not take (negative, spaced, strings) still reach the offsets checks as json."""
    from tokenmill_loader.format import load_json

    big = list(range(0, 3_000_000, 7))
    meta = {
        "tokens": {"offsets": big},
        "neg": {"offsets": [0, -1, 5]},
        "gap": {"offsets": "0,,2"},
        "text": {"offsets": "offsets-0-0"},  # a string stays a string, whatever it looks like
    }
    data = json.dumps(meta, separators=(",", ":")).encode()
    path = tmp_path / "meta.json"
    path.write_bytes(data.replace(b'"gap":{"offsets":"0,,2"}', b'"gap":{"offsets":[0, 2]}'))  # a spaced list
    assert path.stat().st_size > 1 << 20
    got, digest = load_json(path, "shard metadata", offsets_as_arrays=True)
    want, want_digest = load_json(path, "shard metadata")
    assert isinstance(got["tokens"]["offsets"], np.ndarray) and got["tokens"]["offsets"].tolist() == big
    assert got["neg"]["offsets"] == [0, -1, 5] and got["gap"]["offsets"] == [0, 2]
    assert got["text"]["offsets"] == "offsets-0-0"
    assert digest == want_digest and {k: v for k, v in got.items() if k != "tokens"} == {
        k: v for k, v in want.items() if k != "tokens"
    }
