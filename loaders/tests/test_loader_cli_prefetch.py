"""`python -m tokenmill_loader inspect` and DevicePrefetcher (CPU pass-through; CUDA when present)."""

import json
import subprocess
import sys

import pytest
import torch
from tm_writer import random_docs, write_dataset

from tokenmill_loader import DataLoader, DevicePrefetcher, TokenDataset
from tokenmill_loader.__main__ import main


def _tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, **{f"w{i}": i for i in range(3, 1000)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = None
    path = tmp_path / "tok.json"
    tok.save(str(path))
    return path


def test_inspect_prints_summary(tmp_path, capsys):
    recs = random_docs(12, seed=1, masked=True)
    tok = _tokenizer(tmp_path)
    path = write_dataset(tmp_path / "ds", recs, "sft", shard_records=5, tokenizer_file=str(tok))
    assert main(["inspect", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["type"] == "dataset" and out["training_type"] == "sft"
    assert out["records"] == 12 and out["documents"] == 12 and out["shards"] == 3
    assert out["tokens"] == sum(len(r["sequence"]) for r in recs)
    assert out["keys"]["sequence"]["dtype"] == "uint16" and out["keys"]["loss_mask"]["dtype"] == "uint8"
    assert out["vocab_size"] == 1000
    assert out["supervised_tokens"] == sum(sum(r["loss_mask"]) for r in recs)
    assert out["sample"]["ids"] == recs[0]["sequence"]
    assert out["sample"]["text"].split() == [("<s>" if t == 0 else f"w{t}") for t in recs[0]["sequence"]]


def test_inspect_counts_dpo_masks(tmp_path, capsys):
    recs = [
        {"chosen": [5, 6, 7, 8], "rejected": [5, 6, 9], "chosen_mask": [0, 0, 1, 1], "rejected_mask": [0, 0, 1]}
    ] * 3
    assert main(["inspect", str(write_dataset(tmp_path / "dpo", recs, "dpo"))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["supervised_tokens"] == 9 and out["masked_tokens"] == 12


def test_inspect_errors_and_module_entry(tmp_path):
    recs = random_docs(5, seed=1)
    path = write_dataset(tmp_path / "ds", recs, "seq")
    (path / "shard-00000" / "sequence.bin").write_bytes(b"\0")
    proc = subprocess.run(
        [sys.executable, "-m", "tokenmill_loader", "inspect", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "shard-00000/sequence.bin" in proc.stderr


def test_prefetcher_cpu_passthrough_and_upcast(tmp_path):
    path = write_dataset(tmp_path / "ds", random_docs(30, seed=2, masked=True), "sft", shard_records=8)
    ds = TokenDataset(path, 16, cu_seqlens=True)
    plain = list(DataLoader(ds, batch_size=4, seed=1))
    dl = DataLoader(ds, batch_size=4, seed=1)
    pf = DevicePrefetcher(dl, "cpu")
    got = []
    for b in pf:
        got.append(b)
        assert pf.state_dict() == dl.state_dict()
    assert len(got) == len(plain)
    for a, b in zip(plain, got):
        for k in ("input_ids", "labels", "position_ids"):
            assert b[k].dtype == torch.int64 and torch.equal(b[k], a[k].long())
        assert b["cu_seqlens"].dtype == torch.int32  # varlen kernels take int32 boundaries
    raw = next(iter(DevicePrefetcher(DataLoader(ds, batch_size=4, seed=1), "cpu", upcast=False)))
    assert raw["input_ids"].dtype == torch.int32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_prefetcher_cuda(tmp_path):
    path = write_dataset(tmp_path / "ds", random_docs(60, seed=2, masked=True), "sft", shard_records=8)
    ds = TokenDataset(path, 32)
    plain = list(DataLoader(ds, batch_size=4, seed=1))
    dl = DataLoader(ds, batch_size=4, seed=1)
    assert dl.pin_memory
    seen = 0
    states = []
    for b, a in zip(DevicePrefetcher(dl, "cuda"), plain):
        assert b["input_ids"].is_cuda and b["input_ids"].dtype == torch.int64
        assert torch.equal(b["input_ids"].cpu(), a["input_ids"].long())
        seen += 1
        states.append(dl.state_dict())
    assert seen == len(plain)
