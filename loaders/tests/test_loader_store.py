"""Store: stream/record access, sources (dataset, shard, .bin, JSONL), validation errors, pickling."""

import json
import pickle

import numpy as np
import pytest
import torch
from tm_writer import random_docs, write_dataset

from tokenmill_loader import DatasetError, RecordDataset, TokenDataset, open_store


@pytest.fixture
def sft(tmp_path):
    recs = random_docs(60, seed=1, masked=True)
    return write_dataset(tmp_path / "sft", recs, "sft", shard_records=9), recs


def test_fetch_stream_across_shards(sft):
    path, recs = sft
    st = open_store(path)
    assert len(st.parts) == 7
    seq = np.concatenate([r["sequence"] for r in recs])
    mask = np.concatenate([r["loss_mask"] for r in recs])
    assert st.num_items("sequence") == len(seq)
    rng = np.random.default_rng(0)
    for _ in range(200):
        b = int(rng.integers(0, len(seq)))
        e = int(rng.integers(b, min(len(seq), b + 300) + 1))
        t = st.fetch(b, e, "sequence")
        assert t.dtype == torch.int32
        assert np.array_equal(t.numpy(), seq[b:e])
        d = st.fetch(b, e, ["sequence", "loss_mask"])
        assert np.array_equal(d["loss_mask"].numpy(), mask[b:e])
    # a range spanning every shard boundary
    assert np.array_equal(st.fetch(0, len(seq)).numpy(), seq)
    with pytest.raises(IndexError):
        st.fetch(0, len(seq) + 1)


def test_gather_matches_fetch(sft):
    path, recs = sft
    st = open_store(path)
    seq = np.concatenate([r["sequence"] for r in recs])
    starts = np.arange(0, len(seq) - 33, 7)  # many windows straddle shard boundaries
    g = st.gather("sequence", starts, 33)
    for i, s in enumerate(starts):
        assert np.array_equal(g[i], seq[s : s + 33])


def test_fetch_record_sft(sft):
    path, recs = sft
    st = open_store(path)
    assert st.num_records == len(recs) and st.training_type == "sft"
    for j in (0, 8, 9, 10, 35, len(recs) - 1, -1):
        r = recs[j]
        d = st.fetch_record(j, ["sequence", "loss_mask"])
        assert d["sequence"].tolist() == r["sequence"]
        assert d["loss_mask"].tolist() == r["loss_mask"]
        assert st.fetch_record(j, "sequence").tolist() == r["sequence"]
    with pytest.raises(IndexError):
        st.fetch_record(len(recs))
    assert st.record_lengths().tolist() == [len(r["sequence"]) for r in recs]


def _dpo(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = rng.integers(3, 100, int(rng.integers(2, 6))).tolist()
        c = p + rng.integers(3, 100, int(rng.integers(1, 5))).tolist()
        r = p + rng.integers(3, 100, int(rng.integers(1, 5))).tolist()
        out.append(
            {
                "chosen": c,
                "rejected": r,
                "chosen_mask": [0] * len(p) + [1] * (len(c) - len(p)),
                "rejected_mask": [0] * len(p) + [1] * (len(r) - len(p)),
            }
        )
    return out


def _grpo(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 4))
        resp = [rng.integers(3, 100, int(rng.integers(1, 6))).tolist() for _ in range(k)]
        out.append(
            {
                "prompts": rng.integers(3, 100, int(rng.integers(2, 6))).tolist(),
                "responses": resp,
                "masks": [[1] * len(x) for x in resp],
                "rewards": rng.random(k).astype(np.float32).tolist(),
            }
        )
    return out


def test_record_mode_dpo(tmp_path):
    recs = _dpo(20)
    path = write_dataset(tmp_path / "dpo", recs, "dpo", shard_records=6)
    st = open_store(path)
    assert st.training_type == "dpo" and st.num_records == 20
    for j in (0, 5, 6, 19):
        d = st.fetch_record(j, ["chosen", "rejected", "chosen_mask"])
        assert d["chosen"].tolist() == recs[j]["chosen"]
        assert d["rejected"].tolist() == recs[j]["rejected"]
        assert d["chosen_mask"].tolist() == recs[j]["chosen_mask"]
    rd = RecordDataset(path)
    item = rd[7]
    c, m = recs[7]["chosen"], recs[7]["chosen_mask"]
    assert item["chosen_input_ids"].tolist() == c
    assert item["chosen_labels"].tolist() == [t if k else -100 for t, k in zip(c, m)]
    assert item["rejected_input_ids"].tolist() == recs[7]["rejected"]
    with pytest.raises(DatasetError, match="RecordDataset"):
        TokenDataset(path, 4)


def test_record_mode_grpo(tmp_path):
    recs = _grpo(15)
    path = write_dataset(tmp_path / "grpo", recs, "grpo", shard_records=4)
    st = open_store(path)
    assert st.training_type == "grpo" and st.num_records == 15
    for j in range(15):
        resp = st.fetch_record(j, "responses")
        assert [x.tolist() for x in resp] == recs[j]["responses"]
        assert np.allclose(st.fetch_record(j, "rewards").numpy(), recs[j]["rewards"])
        assert st.fetch_record(j, "prompts").tolist() == recs[j]["prompts"]
    item = RecordDataset(path)[9]
    assert item["prompt_ids"].tolist() == recs[9]["prompts"]
    assert [x.tolist() for x in item["responses"]] == recs[9]["responses"]
    assert item["rewards"].dtype == torch.float32 and len(item["rewards"]) == len(recs[9]["responses"])
    assert len(item["response_masks"]) == len(item["responses"])


def test_open_shard_folder_bin_and_jsonl(sft, tmp_path):
    path, recs = sft
    sh = open_store(path / "shard-00001")
    assert sh.kind == "shard" and sh.num_records == 9 and sh.training_type == "sft"
    assert sh.fetch_record(0, "sequence").tolist() == recs[9]["sequence"]
    # nanoGPT-style headerless .bin
    seq = np.concatenate([r["sequence"] for r in recs]).astype(np.uint16)
    seq.tofile(tmp_path / "train.bin")
    with pytest.raises(DatasetError, match="dtype"):
        open_store(tmp_path / "train.bin")
    b = open_store(tmp_path / "train.bin", dtype=np.uint16)
    assert b.kind == "bin" and np.array_equal(b.fetch(5, 50).numpy(), seq[5:50])
    ds = TokenDataset(tmp_path / "train.bin", 16, dtype="uint16")
    assert ds[3]["position_ids"].tolist() == list(range(16))  # no document boundaries known
    # JSONL detected by format: input_ids + labels, or format.md names
    with open(tmp_path / "toks.jsonl", "w") as f:
        for r in recs[:10]:
            labels = [t if m else -100 for t, m in zip(r["sequence"], r["loss_mask"])]
            f.write(json.dumps({"id": "x", "input_ids": r["sequence"], "labels": labels}) + "\n")
    j = open_store(tmp_path / "toks.jsonl")
    assert j.kind == "jsonl" and j.num_records == 10 and j.training_type == "sft"
    assert j.fetch_record(4, "loss_mask").tolist() == recs[4]["loss_mask"]
    assert np.array_equal(j.fetch(0, 30).numpy(), seq[:30])
    (tmp_path / "bad.jsonl").write_text('{"text": "no tokens"}\n')
    with pytest.raises(DatasetError, match="bad.jsonl:1"):
        open_store(tmp_path / "bad.jsonl")


def test_jsonl_grpo(tmp_path):
    recs = _grpo(6)
    with open(tmp_path / "g.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    st = open_store(tmp_path / "g.jsonl")
    assert st.training_type == "grpo"
    assert [x.tolist() for x in st.fetch_record(3, "responses")] == recs[3]["responses"]


# ---------------------------------------------------------------------------- errors
def test_missing_dataset_json(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="dataset.json"):
        open_store(tmp_path / "empty")


def test_truncated_shard_names_file(sft):
    path, _ = sft
    f = path / "shard-00002" / "sequence.bin"
    data = f.read_bytes()
    f.write_bytes(data[:-3])
    with pytest.raises(DatasetError, match=r"shard-00002/sequence\.bin"):
        open_store(path)
    # the single shard (no dataset.json): caught against meta.json
    with pytest.raises(DatasetError, match=r"shard-00002/sequence\.bin.*meta\.json"):
        open_store(path / "shard-00002")


def test_truncated_after_open_names_file(sft):
    """A file that shrinks after open (e.g. rewritten) is caught when it is first mapped."""
    path, _ = sft
    st = open_store(path)
    f = path / "shard-00003" / "loss_mask.bin"
    f.write_bytes(f.read_bytes()[:-1])
    with pytest.raises(DatasetError, match=r"shard-00003/loss_mask\.bin"):
        st.fetch(0, st.num_items("loss_mask"), "loss_mask")


def test_bad_offsets_names_meta(sft):
    path, _ = sft
    m = path / "shard-00001" / "meta.json"
    meta = json.loads(m.read_text())
    offs = meta["sequence"]["offsets"]
    offs[2], offs[3] = offs[3], offs[2]
    meta["sequence"]["offsets"] = offs
    meta["loss_mask"]["offsets"] = offs
    m.write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=r"shard-00001/meta\.json.*decrease"):
        open_store(path / "shard-00001")
    with pytest.raises(DatasetError, match=r"shard-00001/meta\.json"):  # size differs from dataset.json
        open_store(path)


def test_offsets_end_and_dtype_mismatch(sft):
    path, _ = sft
    m = path / "shard-00000" / "meta.json"
    orig = m.read_text()
    meta = json.loads(orig)
    meta["sequence"]["offsets"][-1] -= 1
    meta["loss_mask"]["offsets"][-1] -= 1
    m.write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="offsets must start at 0 and end"):
        open_store(path / "shard-00000")
    m.write_text(orig)
    d = path / "dataset.json"
    info = json.loads(d.read_text())
    info["keys"]["loss_mask"]["dtype"] = "uint16"
    d.write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"shard-00000/meta\.json.*loss_mask.*dtype"):
        open_store(path)


def test_shard_list_mismatch(sft):
    path, _ = sft
    d = path / "dataset.json"
    info = json.loads(d.read_text())
    info["shards"][4]["records"] += 1
    d.write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"shard-00004/meta\.json.*records"):
        open_store(path)
    info["shards"][4]["records"] -= 1
    info["shards"].append({"name": "shard-00099", "tokens": 0, "records": 0, "files": {}})
    d.write_text(json.dumps(info))
    with pytest.raises(DatasetError, match="shard-00099"):
        open_store(path)


def test_verify_sha256(sft):
    path, _ = sft
    f = path / "shard-00005" / "sequence.bin"
    b = bytearray(f.read_bytes())
    b[3] ^= 0xFF
    f.write_bytes(bytes(b))
    open_store(path)  # same size: only the checksum can tell
    with pytest.raises(DatasetError, match=r"shard-00005/sequence\.bin.*sha256"):
        open_store(path, verify=True)


def test_pickle_keeps_only_paths(sft):
    path, recs = sft
    st = open_store(path)
    st.fetch(0, 100)  # maps files, builds caches
    st.doc_starts()
    blob = pickle.dumps(st)
    assert len(blob) < 400
    assert str(path).encode() in blob
    st2 = pickle.loads(blob)
    assert st2.__dict__.get("_loaded") is False and "parts" not in st2.__dict__  # nothing loaded yet
    assert np.array_equal(st2.fetch(10, 90).numpy(), st.fetch(10, 90).numpy())
    ds = TokenDataset(path, 16)
    ds.get_batch([0, 1, 2])
    assert len(pickle.dumps(ds)) < 1000


def test_verify_token_ids_below_vocab(tmp_path):
    recs = [{"sequence": [0, 5, 999]}, {"sequence": [0, 1000, 3]}]
    path = write_dataset(tmp_path / "v", recs, "seq", vocab_size=1000)
    with pytest.raises(DatasetError, match=r"dataset\.json: shard shard-00000 holds token id 1000 >= vocab_size"):
        open_store(path)  # the shard's recorded max_token_id
    info = json.loads((path / "dataset.json").read_text())
    del info["shards"][0]["max_token_id"]  # a manifest from before the field: only reading the data tells
    (path / "dataset.json").write_text(json.dumps(info))
    open_store(path)
    with pytest.raises(DatasetError, match=r"shard-00000/sequence\.bin: token id 1000 >= vocab_size 1000"):
        open_store(path, verify=True)


def test_record_batches_of_dpo_and_grpo_mark_their_padding(tmp_path):
    """Every padded token key gets its own mask, padding uses <pad>, padded rewards are NaN (never a real 0)."""
    from tokenmill_loader import DataLoader, RecordDataset

    dpo = RecordDataset(write_dataset(tmp_path / "dpo", _dpo(8), "dpo"))
    batch = next(iter(DataLoader(dpo, batch_size=4, shuffle=False)))
    for side in ("chosen", "rejected"):
        lengths = [len(dpo[i][f"{side}_input_ids"]) for i in range(4)]
        assert batch[f"{side}_attention_mask"].sum(1).tolist() == lengths
        ids = batch[f"{side}_input_ids"]
        assert (ids[batch[f"{side}_attention_mask"] == 0] == dpo.pad_id).all() and dpo.pad_id == 2
    grpo = RecordDataset(write_dataset(tmp_path / "grpo", _grpo(8), "grpo"))
    batch = next(iter(DataLoader(grpo, batch_size=4, shuffle=False)))
    assert batch["prompt_attention_mask"].sum(1).tolist() == [len(grpo[i]["prompt_ids"]) for i in range(4)]
    groups = [len(grpo[i]["rewards"]) for i in range(4)]
    assert (~torch.isnan(batch["rewards"])).sum(1).tolist() == groups


def test_set_epoch_of_the_current_epoch_keeps_a_resumed_position():
    from tokenmill_loader import ResumableSampler

    s = ResumableSampler(100, seed=3)
    s.load_state_dict({**s.state_dict(), "epoch": 2, "position": 40})
    s.set_epoch(2)  # the usual epoch loop after a resume
    assert s.state_dict()["position"] == 40 and len(s.remaining()) == 60
    s.set_epoch(3)
    assert s.state_dict()["position"] == 0 and s.epoch == 3


def test_malformed_metadata_gives_dataset_errors_naming_the_file(tmp_path):
    def with_meta(name, edit):
        """A dpo dataset whose shard meta.json is edited; dataset.json re-lists its size so only the edit is wrong."""
        path = write_dataset(tmp_path / name, _dpo(6), "dpo")
        meta_path = path / "shard-00000" / "meta.json"
        meta = json.loads(meta_path.read_text())
        edit(meta)
        meta_path.write_text(json.dumps(meta))
        info = json.loads((path / "dataset.json").read_text())
        info["shards"][0]["files"]["meta.json"] = {"bytes": meta_path.stat().st_size}
        (path / "dataset.json").write_text(json.dumps(info))
        return path

    path = with_meta("offsets", lambda m: m["chosen"]["offsets"].__setitem__(1, "x"))
    with pytest.raises(DatasetError, match="meta.json.*offsets must be integers"):
        open_store(path)
    # meta.json says uint32 where dataset.json declares uint16: reported as a dtype error, not truncation
    path = with_meta("dtype", lambda m: m["chosen"].__setitem__("dtype", "uint32"))
    with pytest.raises(DatasetError, match="chosen has dtype uint32.*declares uint16"):
        open_store(path)

    path = write_dataset(tmp_path / "entry", _dpo(6), "dpo")
    info = json.loads((path / "dataset.json").read_text())
    info["shards"].append("shard-00009")
    (path / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match="dataset.json.*not an object"):
        open_store(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda info: [info], "expected a JSON object"),
        (lambda info: {**info, "keys": ["sequence"]}, "'keys' must be an object"),
        (lambda info: {**info, "totals": {"records": "many"}}, "totals.records must be an integer"),
        (lambda info: {**info, "shards": [{**info["shards"][0], "files": ["sequence.bin"]}]}, "'files' of shard"),
        (lambda info: {**info, "shards": [{**info["shards"][0], "name": "../elsewhere"}]}, "not a plain name inside"),
        (lambda info: {**info, "vocab_size": "4096"}, "vocab_size must be an integer"),
        (lambda info: {**info, "token_dtype": "float64"}, "token_dtype 'float64' is not one of"),
    ],
)
def test_malformed_manifests_raise_dataset_errors(tmp_path, edit, message):
    path = write_dataset(tmp_path / "m", random_docs(5), "seq")
    info = json.loads((path / "dataset.json").read_text())
    (path / "dataset.json").write_text(json.dumps(edit(info)))
    for verify in (False, True):
        with pytest.raises(DatasetError, match=message):
            open_store(path, verify=verify)


def test_deeply_nested_manifest_is_a_dataset_error(tmp_path):
    path = write_dataset(tmp_path / "deep", random_docs(5), "seq")
    (path / "dataset.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DatasetError, match="dataset.json: not valid JSON"):
        open_store(path)


def test_format_module_needs_no_torch_and_the_test_writer_follows_it(tmp_path):
    import subprocess
    import sys

    code = "import sys, tokenmill_loader.format; assert 'torch' not in sys.modules and 'tokenmill' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    from tokenmill_loader.format import KEYS

    path = write_dataset(tmp_path / "g", _grpo(3), "grpo")
    declared = json.loads((path / "dataset.json").read_text())["keys"]
    assert {k: v["kind"] for k, v in declared.items()} == KEYS["grpo"]  # rewards: "values", as docs/format.md says
