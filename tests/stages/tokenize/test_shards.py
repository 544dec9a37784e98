"""tokenized_bins stage: renderings and masks per training type, splits, shards, atomicity, determinism; the
round trip through tokenmill_loader; the pinned tokenizer and the re-encoding check."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokenmill.stages.tokenize.shards as shards_mod
import tokenmill.stages.tokenize.stage as stage_mod
from tokenmill.common.io import STATS_FILE, TIMINGS_FILE, atomic_write_json, read_json
from tokenmill.common.results import read_result
from tokenmill.errors import CapacityError, ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill.stages.tokenize import (
    ShardSettings,
    TokenizeResult,
    TokenizerSettings,
    tokenize_corpus,
    train_tokenizer,
    verify,
)
from tokenmill.stages.tokenize.checks import validate_token_shards
from tokenmill.stages.tokenize.encode import (
    MIN_TASK_BYTES,
    SplitChunk,
    check_ids,
    encoder,
    piece_ids,
    plan_ranges,
    save_splits,
)
from tokenmill.stages.tokenize.piece_bpe import PieceEncoder
from tokenmill.stages.tokenize.shards import REJECTED_JSON, PackPlan, ShardWriter, pack_shard, token_dtype_for
from tokenmill.stages.tokenize.tokenizer import load_tokenizer, pin_tokenizer
from tokenmill.stages.tokenize.verify import find_records
from tokenmill_loader import RecordDataset, TokenDataset, open_store
from tokenmill_loader.format import SPECIAL_TOKENS, TRAINING_TYPES, version_file

SP = {t: i for i, t in enumerate(SPECIAL_TOKENS)}

LINES = [
    "床前明月光，疑是地上霜。",
    "举头望明月，低头思故乡。",
    "白日依山尽，黄河入海流。",
    "欲穷千里目，更上一层楼。",
    "Shall I compare thee to a summer's day?",
    "Rough winds do shake the darling buds of May,",
]


def poem(i: int) -> dict:
    body = "\n".join(LINES[(i + k) % len(LINES)] for k in range(1 + i % 4)) + f"\n其{i}"
    meta = {"title": f"题目{i % 13}", "author": f"诗人{i % 7}"} if i % 10 else {}
    return {
        "id": hashlib.blake2b(f"p{i}".encode(), digest_size=8).hexdigest(),
        "text": body,
        "meta": meta,
        "source": {"path": "poems.json", "index": i},
    }


def chat(i: int) -> dict:
    r = {
        "id": hashlib.blake2b(f"c{i}".encode(), digest_size=8).hexdigest(),
        "text": f"chat {i}",
        "meta": {},
        "source": {"path": "chat.jsonl", "line": i + 1},
    }
    if i % 9 == 5:
        return r  # no messages: rejected for sft
    msgs = [{"role": "user", "content": f"写一首关于月亮的诗 {i}"}, {"role": "assistant", "content": LINES[i % 4]}]
    if i % 3 == 0:
        msgs = (
            [{"role": "system", "content": "你是诗人。"}]
            + msgs
            + [{"role": "user", "content": "再来一首"}, {"role": "assistant", "content": LINES[(i + 1) % 4]}]
        )
    r["messages"] = msgs
    r["prompt"] = f"题{i}：写月亮"
    r["chosen"] = LINES[i % 4]
    r["rejected"] = "月亮 " * (1 + i % 3)
    r["responses"] = [LINES[(i + k) % 6] for k in range(1 + i % 3)]
    r["rewards"] = [float(k) - 0.5 for k in range(1 + i % 3)]
    return r


def write_parts(folder: Path, recs: list[dict], per_part: int = 10**9, bad_line: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(0, len(recs), per_part):
        with open(folder / f"part-{k // per_part:05d}.jsonl", "w", encoding="utf-8") as f:
            for j, r in enumerate(recs[k : k + per_part]):
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
                if bad_line and j == 3:
                    f.write("{this is not json\n")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("tok")
    write_parts(base / "in", [poem(i) for i in range(200)] + [chat(i) for i in range(40)])
    train_tokenizer(base / "in", base / "tok", TokenizerSettings(vocab_size=500))
    return base / "tok"


def read_split(folder: Path) -> dict:
    """A minimal reader of docs/format.md: per key the list of items, plus record ids and the manifest."""
    manifest = read_json(folder / "dataset.json")
    items: dict = {}
    ids: list = []
    for sh in manifest["shards"]:
        d = folder / sh["name"]
        meta = read_json(d / "meta.json")
        for key, spec in meta.items():
            arr = np.fromfile(d / f"{key}.bin", dtype=spec["dtype"])
            assert arr.shape[0] == spec["shape"][0]
            offs = spec["offsets"]
            items.setdefault(key, []).extend(arr[a:b] for a, b in zip(offs, offs[1:]))
        ids.extend(read_json(d / "record_ids.json"))
    return {"manifest": manifest, "items": items, "ids": ids}


def run(tmp_path, tok_dir, recs, name="out", workers=1, **kw) -> tuple[dict, Path]:
    src = tmp_path / f"{name}_in"
    if not src.exists():
        write_parts(src, recs, per_part=kw.pop("per_part", 10**9), bad_line=kw.pop("bad_line", False))
    out = tmp_path / name
    stats = tokenize_corpus(src, tok_dir, out, ShardSettings(**kw), workers=workers)
    return stats, out


def by_id(recs):
    return {r["id"]: r for r in recs}


# ------------------------------------------------------------------------------------------------
def test_conditional_round_trip_mask_and_dropout(tmp_path, tok_dir):
    recs = [poem(i) for i in range(300)]
    stats, out = run(tmp_path, tok_dir, recs, training_type="conditional", val_fraction=0.2)
    tok = load_tokenizer(tok_dir)
    src = by_id(recs)
    seen, dropped = 0, 0
    for split in ("train", "val"):
        d = read_split(out / split)
        assert set(d["items"]) == {"sequence", "loss_mask"}
        assert d["manifest"]["keys"]["sequence"] == {"dtype": "uint16", "kind": "tokens"}
        for rid, seq, mask in zip(d["ids"], d["items"]["sequence"], d["items"]["loss_mask"]):
            r = src[rid]
            text = tok.decode(seq.tolist(), skip_special_tokens=False)
            with_meta = f"<|title|>{r['meta'].get('title', '')}<|author|>{r['meta'].get('author', '')}<|content|>"
            assert text in (with_meta + r["text"] + "</s>", "<|content|>" + r["text"] + "</s>")
            if text.startswith("<|content|>") and r["meta"]:
                dropped += 1
            # the prefix, up to and including <|content|>, is masked; body and </s> are trained
            k = int(np.flatnonzero(seq == SP["<|content|>"])[0])
            assert mask[: k + 1].sum() == 0 and mask[k + 1 :].all()
            assert seq[-1] == SP["</s>"]
            body = tok.decode(seq[k + 1 : -1].tolist())
            assert body == r["text"]
            seen += 1
    assert seen == len(recs) == stats.docs_out == stats.records
    with_meta = sum(1 for r in recs if r["meta"])
    assert stats.metadata_dropout == dropped
    assert stats.no_metadata == len(recs) - with_meta
    assert abs(dropped / with_meta - 0.25) < 0.08
    assert stats.supervised_tokens + stats.masked_tokens == stats.tokens
    assert stats.sample["markdown"].startswith("[~~<|")


def test_dropout_share_close_to_rate_and_per_document(tmp_path, tok_dir):
    recs = [poem(i) for i in range(1, 2000) if i % 10]
    s1, _ = run(tmp_path, tok_dir, recs, name="a", training_type="conditional", metadata_dropout=0.25)
    assert abs(s1.metadata_dropout / len(recs) - 0.25) < 0.03
    s0, _ = run(tmp_path, tok_dir, recs, name="b", training_type="conditional", metadata_dropout=0.0)
    assert s0.metadata_dropout == 0 and s0.masked_tokens > s1.masked_tokens
    s2, _ = run(tmp_path, tok_dir, recs, name="c", training_type="conditional", metadata_dropout=0.25, seed=7)
    assert s2.metadata_dropout != s1.metadata_dropout or s2.tokens != s1.tokens


def test_seq_documents_are_bos_text_eos(tmp_path, tok_dir):
    recs = [poem(i) for i in range(50)] + [dict(poem(50), text="")]
    stats, out = run(tmp_path, tok_dir, recs, training_type="seq", val_fraction=0.0)
    d = read_split(out / "train")
    assert set(d["items"]) == {"sequence"}
    tok = load_tokenizer(tok_dir)
    src = by_id(recs)
    for rid, seq in zip(d["ids"], d["items"]["sequence"]):
        assert tok.decode(seq.tolist(), skip_special_tokens=False) == "<s>" + src[rid]["text"] + "</s>"
    assert stats.dropped["empty_text"] == 1 and stats.docs_in == 51 == stats.docs_out + 1
    assert stats.supervised_tokens == stats.tokens
    assert read_split(out / "val")["ids"] == []  # an empty split still loads


def test_sft_mask_is_assistant_turns_only_and_rejects_are_listed(tmp_path, tok_dir):
    recs = [chat(i) for i in range(60)]
    stats, out = run(tmp_path, tok_dir, recs, training_type="sft", val_fraction=0.0)
    tok = load_tokenizer(tok_dir)
    src = by_id(recs)
    d = read_split(out / "train")
    assert len(d["ids"]) == sum(1 for r in recs if "messages" in r)
    for rid, seq, mask in zip(d["ids"], d["items"]["sequence"], d["items"]["loss_mask"]):
        msgs = src[rid]["messages"]
        rendered = "<s>" + "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in msgs) + "</s>"
        assert tok.decode(seq.tolist(), skip_special_tokens=False) == rendered
        trained = tok.decode(seq[mask == 1].tolist(), skip_special_tokens=False)
        assert trained == "".join(m["content"] + "<|end|>" for m in msgs if m["role"] == "assistant")
        # mask boundaries: after <|assistant|> up to and including its <|end|>
        starts = np.flatnonzero(seq == SP["<|assistant|>"])
        for s in starts:
            assert mask[s] == 0 and mask[s + 1] == 1
    rejected = json.loads((out / REJECTED_JSON).read_text(encoding="utf-8"))
    missing = [r for r in recs if "messages" not in r]
    assert stats.dropped["missing_messages"] == len(missing) == len(rejected)
    assert {r["id"] for r in rejected} == {r["id"] for r in missing}
    assert all(r["reason"] == "missing_messages" and r["where"].startswith("part-00000.jsonl:") for r in rejected)
    assert stats.docs_in == stats.docs_out + len(rejected)


def test_dpo_keys_offsets_and_masks(tmp_path, tok_dir):
    recs = [chat(i) for i in range(40)]
    stats, out = run(tmp_path, tok_dir, recs, training_type="dpo", val_fraction=0.0)
    tok = load_tokenizer(tok_dir)
    src = by_id(recs)
    d = read_split(out / "train")
    assert set(d["items"]) == {"chosen", "rejected", "chosen_mask", "rejected_mask"}
    assert all(len(v) == len(d["ids"]) for v in d["items"].values())  # one item per record
    for j, rid in enumerate(d["ids"]):
        r = src[rid]
        for key in ("chosen", "rejected"):
            seq, mask = d["items"][key][j], d["items"][f"{key}_mask"][j]
            assert (
                tok.decode(seq.tolist(), skip_special_tokens=False)
                == f"<s><|user|>{r['prompt']}<|end|><|assistant|>{r[key]}<|end|></s>"
            )
            assert tok.decode(seq[mask == 1].tolist(), skip_special_tokens=False) == f"{r[key]}<|end|></s>"
            k = int(np.flatnonzero(seq == SP["<|assistant|>"])[0])
            assert mask[: k + 1].sum() == 0 and mask[k + 1 :].all()
    assert stats.tokens == sum(len(x) for k in ("chosen", "rejected") for x in d["items"][k])
    assert d["manifest"]["totals"]["tokens"] == stats.tokens


def test_grpo_keeps_record_and_group_boundaries(tmp_path, tok_dir):
    recs = [chat(i) for i in range(40)] + [dict(chat(42), rewards=[1.0])]  # last one: rewards mismatch
    recs[-1]["responses"] = ["a", "b"]
    stats, out = run(tmp_path, tok_dir, recs, training_type="grpo", val_fraction=0.0, shard_tokens=300)
    tok = load_tokenizer(tok_dir)
    src = by_id(recs)
    d = read_split(out / "train")
    assert d["manifest"]["shards"][1:], "small shard_tokens: several shards"
    resp_iter = iter(zip(d["items"]["responses"], d["items"]["masks"]))
    for j, rid in enumerate(d["ids"]):
        r = src[rid]
        assert (
            tok.decode(d["items"]["prompts"][j].tolist(), skip_special_tokens=False)
            == f"<s><|user|>{r['prompt']}<|end|><|assistant|>"
        )
        rewards = d["items"]["rewards"][j]
        assert rewards.dtype == np.float32 and rewards.tolist() == r["rewards"]
        for resp in r["responses"]:  # the record's group, in order
            seq, mask = next(resp_iter)
            assert tok.decode(seq.tolist(), skip_special_tokens=False) == f"{resp}<|end|></s>"
            assert mask.all()
    assert next(resp_iter, None) is None
    assert stats.dropped["rewards_mismatch"] == 1
    # the meta.json of every shard: rewards offsets are response-index boundaries
    for sh in d["manifest"]["shards"]:
        meta = read_json(out / "train" / sh["name"] / "meta.json")
        assert meta["rewards"]["offsets"][-1] == len(meta["responses"]["offsets"]) - 1
        assert len(meta["rewards"]["offsets"]) == len(meta["prompts"]["offsets"]) == sh["records"] + 1


def test_literal_special_token_text_stays_text(tmp_path, tok_dir):
    recs = [dict(poem(i), text=f"他写下 </s> 与 <|content|> 和 <s>{i}") for i in range(1, 6)]
    _, out = run(tmp_path, tok_dir, recs, training_type="conditional", val_fraction=0.0, metadata_dropout=0.0)
    d = read_split(out / "train")
    tok = load_tokenizer(tok_dir)
    for rid, seq in zip(d["ids"], d["items"]["sequence"]):
        assert (seq == SP["</s>"]).sum() == 1 and (seq == SP["<|content|>"]).sum() == 1
        assert (seq == SP["<s>"]).sum() == 0
        k = int(np.flatnonzero(seq == SP["<|content|>"])[0])
        assert tok.decode(seq[k + 1 : -1].tolist()) == by_id(recs)[rid]["text"]


def test_shards_roll_over_and_records_never_straddle(tmp_path, tok_dir):
    recs = [poem(i) for i in range(200)]
    stats, out = run(tmp_path, tok_dir, recs, training_type="conditional", val_fraction=0.0, shard_tokens=500)
    m = read_json(out / "train" / "dataset.json")
    assert len(m["shards"]) > 3
    for sh in m["shards"]:
        meta = read_json(out / "train" / sh["name"] / "meta.json")
        n = meta["sequence"]["shape"][0]
        assert n == sh["tokens"] and (n <= 500 or sh["records"] == 1)
        record_ids = read_json(out / "train" / sh["name"] / "record_ids.json")
        assert len(meta["sequence"]["offsets"]) == sh["records"] + 1 == len(record_ids) + 1
        assert meta["loss_mask"]["offsets"] == meta["sequence"]["offsets"]
        for fname, info in sh["files"].items():
            data = (out / "train" / sh["name"] / fname).read_bytes()
            assert len(data) == info["bytes"] and hashlib.sha256(data).hexdigest() == info["sha256"]
    assert read_split(out / "train")["ids"] == [r["id"] for r in recs]  # input order kept
    assert (out / "train" / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()
    assert m["tokenizer"]["sha256"] == hashlib.sha256((tok_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert m["totals"]["tokens"] == stats.tokens == sum(s["tokens"] for s in m["shards"])


def tree_bytes(folder: Path) -> dict:
    """Every file's bytes; `_stats.json` without its settings (task_bytes is among them and differs by design)."""
    files = {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != TIMINGS_FILE
    }
    files[STATS_FILE] = {k: v for k, v in read_json(folder / STATS_FILE).items() if k != "settings"}
    return files


def test_identical_bytes_for_any_worker_count_and_task_cut(tmp_path, tok_dir):
    recs = [poem(i) for i in range(400)]
    write_parts(tmp_path / "in", recs, per_part=150)
    outs = []
    for name, workers, task_bytes in (("w1", 1, 0), ("w2", 2, 3000), ("w1b", 1, 5000)):
        s = tokenize_corpus(
            tmp_path / "in",
            tok_dir,
            tmp_path / name,
            ShardSettings(shard_tokens=2000, task_bytes=task_bytes),
            workers=workers,
        )
        outs.append(tree_bytes(tmp_path / name))
        assert s.docs_in == s.docs_out == 400
        assert s.workers == workers and (s.tasks > 3 or task_bytes == 0)
    assert outs[0] == outs[1] == outs[2]
    assert any(k.startswith("train/shard-00002") for k in outs[0])


def test_short_pieces_are_encoded_once_per_process_with_the_same_ids(tok_dir):
    enc = encoder(pin_tokenizer(tok_dir)[0])
    texts = ["李白", "床前明月光，疑是地上霜。" * 4, "李白", "", "静夜思", "</s>"]
    expected = [e.ids for e in enc.tok.encode_batch_fast(texts, add_special_tokens=False)]
    assert piece_ids(enc, texts) == expected  # encoded, the short ones kept
    assert {"李白", "静夜思", "", "</s>"} <= set(enc.short_pieces) and texts[1] not in enc.short_pieces
    assert piece_ids(enc, texts[::-1]) == expected[::-1]  # from what was kept


def test_planned_ranges_cover_every_line_and_shrink_towards_the_end(tmp_path):
    line = b'{"id": "x", "text": "' + b"a" * 90 + b'"}\n'
    for i in range(3):
        (tmp_path / f"part-{i:05d}.jsonl").write_bytes(line * 20_000)  # 2.1 MB each
    ranges = plan_ranges(tmp_path, 0, workers=2)
    for i in range(3):
        path = str(tmp_path / f"part-{i:05d}.jsonl")
        mine = [r for r in ranges if r.path == path]
        assert [r.start for r in mine[1:]] == [r.end for r in mine[:-1]] and mine[-1].end == len(line) * 20_000
        assert [r.first_line for r in mine] == [1 + r.start // len(line) for r in mine]  # newline-aligned
    sizes = [r.end - r.start for r in ranges]
    assert sizes[0] > 1.4 * MIN_TASK_BYTES  # about TASKS_PER_WORKER per worker ...
    assert max(sizes[-4:]) < MIN_TASK_BYTES + len(line)  # ... then smaller, so the workers finish together
    assert all(r.end - r.start <= 5000 + len(line) for r in plan_ranges(tmp_path, 5000, workers=2))  # as asked


def test_malformed_line_is_corruption_naming_file_and_line(tmp_path, tok_dir):
    """deduped_jsonl is tokenmill's own output: a line that does not parse fails the stage (never a counted drop)."""
    write_parts(tmp_path / "in", [poem(i) for i in range(20)], per_part=8, bad_line=True)
    with pytest.raises(CorruptOutputError, match=r"part-00000\.jsonl:5: not a JSON record"):
        tokenize_corpus(tmp_path / "in", tok_dir, tmp_path / "out", ShardSettings(), workers=1)
    assert not list((tmp_path / "out").rglob("dataset.json"))
    (tmp_path / "in" / "part-00000.jsonl").write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(CorruptOutputError, match=r"part-00000\.jsonl:1: not a JSON object"):
        tokenize_corpus(tmp_path / "in", tok_dir, tmp_path / "out", ShardSettings(), workers=1)
    good = json.dumps(poem(0), ensure_ascii=False)
    surrogate = good.replace("其", "\ud800").encode("utf-8", "surrogatepass")  # json would read it, HF would not
    (tmp_path / "in" / "part-00000.jsonl").write_bytes(b"\n".join([good.encode()] * 2 + [surrogate]))
    with pytest.raises(CorruptOutputError, match=r"part-00000\.jsonl:3: not UTF-8"):
        tokenize_corpus(tmp_path / "in", tok_dir, tmp_path / "out", ShardSettings(), workers=1)


def test_split_by_id_is_stable_when_documents_are_added(tmp_path, tok_dir):
    old = [poem(i) for i in range(300)]
    new = old + [poem(i) for i in range(300, 600)]
    _, out1 = run(tmp_path, tok_dir, old, name="old", training_type="seq", val_fraction=0.1)
    _, out2 = run(tmp_path, tok_dir, new, name="new", training_type="seq", val_fraction=0.1)
    val1, val2 = set(read_split(out1 / "val")["ids"]), set(read_split(out2 / "val")["ids"])
    train1, train2 = set(read_split(out1 / "train")["ids"]), set(read_split(out2 / "train")["ids"])
    assert val1 and val1 <= val2 and train1 <= train2 and not (val2 & train2)
    assert 0.04 < len(val2) / 600 < 0.18


def test_vocabulary_overflow_is_refused_at_write_time(tmp_path, tok_dir):
    with pytest.raises(ConfigError, match="tokenized_bins.token_dtype: .*overflows uint16"):
        token_dtype_for(70_000, "uint16")
    assert token_dtype_for(65_536) == np.uint16 and token_dtype_for(65_537) == np.uint32
    with pytest.raises(CapacityError, match="overflows"):
        ShardWriter(tmp_path / "w", "seq", 70_000, "uint16", 100)
    assert not (tmp_path / "w").exists()
    w = ShardWriter(tmp_path / "w2", "seq", 100, "uint16", 1000)
    bad = SplitChunk(
        ids=["a"],
        data={"sequence": np.array([0, 150, 1], np.uint16)},
        item_lens={"sequence": np.array([3])},
        rec_items={"sequence": np.array([1])},
        rec_tokens=np.array([3]),
    )
    with pytest.raises(CapacityError, match="token id 150 >= vocabulary size 100"):
        w.add(bad)
    with pytest.raises(CapacityError):
        check_ids(np.array([5, 99, 100]), 100)
    # whole stage: a tokenizer of 66k tokens forced into uint16 writes nothing
    tok = load_tokenizer(tok_dir)
    tok.add_tokens([f"zzq{i}" for i in range(66_000)])
    big = tmp_path / "big"
    big.mkdir()
    tok.save(str(big / "tokenizer.json"))
    write_parts(tmp_path / "in", [poem(i) for i in range(5)])
    with pytest.raises(ConfigError, match="overflows uint16"):
        tokenize_corpus(tmp_path / "in", big, tmp_path / "out", ShardSettings(token_dtype="uint16"), workers=1)
    assert not list((tmp_path / "out").rglob("dataset.json")) if (tmp_path / "out").exists() else True
    s = tokenize_corpus(tmp_path / "in", big, tmp_path / "out32", ShardSettings(val_fraction=0.0), workers=1)
    assert s.token_dtype == "uint32"
    assert read_json(tmp_path / "out32" / "train" / "shard-00000" / "meta.json")["sequence"]["dtype"] == "uint32"


def test_shards_written_by_pack_tasks_are_the_in_process_writers(tmp_path):
    """The run process plans shards from record token counts alone and a task per shard writes one: the same
    shards, byte for byte, as one writer fed every chunk in order (records larger than a shard, shards spanning
    several tasks, numbering after the shards already in the folder)."""
    rng = np.random.default_rng(7)
    chunks = []
    for c in range(6):
        lens = rng.integers(1, 120, 40)
        lens[rng.integers(0, 40, 2)] = 700  # each larger than a shard
        chunks.append(
            SplitChunk(
                ids=[f"c{c}r{i}" for i in range(len(lens))],
                data={"sequence": rng.integers(0, 4096, int(lens.sum())).astype(np.uint16)},
                item_lens={"sequence": lens},
                rec_items={"sequence": np.ones(len(lens), np.int64)},
                rec_tokens=lens,
            )
        )
    for root in ("one", "two"):
        (tmp_path / root / "train" / "shard-00002").mkdir(parents=True)
    writer = ShardWriter(tmp_path / "one" / "train", "seq", 4096, "uint16", shard_tokens=500, first_index=3, batch="b")
    for ch in chunks:
        writer.add(ch)
    expected = writer.close()

    plan = PackPlan(tmp_path / "two", "seq", 4096, np.dtype("uint16"), shard_tokens=500)
    plan.start_batch("b")
    for i, ch in enumerate(chunks):
        folder = str(tmp_path / f"task{i}")
        save_splits({"train": ch}, folder)
        plan.add(folder, {"train": ch})
    plan.finish_batch()
    assert len(plan.tasks) == len(expected) > len(chunks)
    assert any(len(t.pieces) > 1 for t in plan.tasks)  # some shards span tasks
    assert [pack_shard(t) for t in plan.tasks] == expected
    for entry in expected:
        one, two = (tmp_path / root / "train" / entry["name"] for root in ("one", "two"))
        assert sorted(f.name for f in one.iterdir()) == sorted(f.name for f in two.iterdir())
        for f in one.iterdir():
            assert f.read_bytes() == (two / f.name).read_bytes()


def test_interrupted_write_leaves_nothing_a_reader_accepts(tmp_path, tok_dir, monkeypatch):
    recs = [poem(i) for i in range(200)]
    write_parts(tmp_path / "in", recs)
    calls = {"n": 0}
    real = shards_mod.ShardWriter._finish

    def boom(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (simulated)")
        return real(self)

    monkeypatch.setattr(shards_mod.ShardWriter, "_finish", boom)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="simulated"):
        tokenize_corpus(tmp_path / "in", tok_dir, out, ShardSettings(shard_tokens=400), workers=1)
    assert calls["n"] == 3
    assert not list(out.rglob("dataset.json"))
    assert not list(out.rglob("shard-*"))  # no shard folder under its final name
    assert not [p for p in out.rglob("*") if p.is_file()]  # unfinished and unpublished files cleaned up


def complete_data_root(root: Path, tok_dir: Path, recs: list[dict]) -> Path:
    """A data root with every stage up to tokenizer, as the stages leave them: 5 records rejected by cleaning,
    3 removed by dedup (in = out + dropped at each step), then the tokenizer."""
    write_parts(root / "raw_records", recs)
    cleaned, rejected = recs[5:], [dict(r, reason="too_short") for r in recs[:5]]
    write_parts(root / "cleaned_jsonl", cleaned)
    (root / "cleaned_jsonl" / "_rejected.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejected), encoding="utf-8"
    )
    (root / "dedup_report").mkdir()
    (root / "dedup_report" / "report.json").write_text("{}", encoding="utf-8")
    write_parts(root / "deduped_jsonl", cleaned[3:])
    (root / "deduped_jsonl" / "removed.jsonl").write_text(
        "".join(json.dumps({"id": r["id"], "reason": "exact_duplicate"}) + "\n" for r in cleaned[:3]), encoding="utf-8"
    )
    shutil.copytree(tok_dir, root / "tokenizer")
    return root


@pytest.mark.parametrize("tt", TRAINING_TYPES)
def test_a_complete_data_root_passes_the_contract_check(tmp_path, tok_dir, shared_dir, tt):
    tool = shared_dir / "tools" / "check_contracts.py"
    if not tool.exists():
        pytest.skip(f"{tool} not present")
    root = complete_data_root(tmp_path / "data", tok_dir, [poem(i) for i in range(100)] + [chat(i) for i in range(60)])
    tokenize_corpus(
        root / "deduped_jsonl",
        root / "tokenizer",
        root / "tokenized_bins",
        ShardSettings(training_type=tt, shard_tokens=1000, val_fraction=0.2),
        workers=1,
    )
    r = subprocess.run([sys.executable, str(tool), str(root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "- 0 violations" in r.stdout and "tokenized_bins/train:" in r.stdout
    # the tool still sees a stage missing below tokenized_bins
    shutil.rmtree(root / "tokenizer")
    r = subprocess.run([sys.executable, str(tool), str(root)], capture_output=True, text=True)
    assert r.returncode == 1 and "tokenizer: missing" in r.stdout


def test_assets_materialize(tmp_path, tok_dir):
    import dagster as dg

    from assets.tokenize import tokenized_bins, tokenizer
    from resources import Compute, CorpusSource, DataRoot

    root = tmp_path / "data"
    write_parts(root / "deduped_jsonl" / "g1-b000001", [poem(i) for i in range(150)])
    published = root / "deduped_jsonl" / "g1-b000001"
    atomic_write_json(published / STATS_FILE, {"docs_in": 150, "docs_out": 150})  # a published batch
    res = dg.materialize(
        [tokenizer, tokenized_bins],
        resources={
            "source": CorpusSource(path=str(tmp_path)),
            "data_root": DataRoot(root=str(root)),
            "compute": Compute(),
        },
        run_config={
            "ops": {"tokenizer": {"config": {"vocab_size": 400}}, "tokenized_bins": {"config": {"shard_tokens": 3000}}}
        },
    )
    assert res.success
    md = res.asset_materializations_for_node("tokenized_bins")[0].metadata
    assert md["docs_out"].value == 150 and md["tokens"].value > 0
    assert 0 < md["masked_share"].value < 1
    stats = read_result(root / "tokenized_bins", TokenizeResult)
    assert stats.train["records"] + stats.val["records"] == 150
    arr = np.memmap(root / "tokenized_bins" / "train" / "shard-00000" / "sequence.bin", dtype=np.uint16, mode="r")
    assert arr.size and int(arr.max()) < 400
    tmd = res.asset_materializations_for_node("tokenizer")[0].metadata
    assert tmd["vocab_size"].value <= 400


# ------------------------------------------------------------------------------------------------ round trip
def expected_rendering(tok, rec: dict, tt: str) -> dict | None:
    """docs/format.md's rendering of one record, built from the spec alone: key -> list of (ids, mask) items, and
    grpo rewards; None when the training type cannot render it."""

    def enc(text):
        return tok.encode(text, add_special_tokens=False).ids

    def item(*parts):  # parts: (special token or text, mask bit)
        ids, mask = [], []
        for part, bit in parts:
            piece = [SP[part]] if part in SP else enc(part)
            ids += piece
            mask += [bit] * len(piece)
        return ids, mask

    text = rec.get("text")
    if tt == "seq":
        return {"sequence": [item(("<s>", 1), (text, 1), ("</s>", 1))]} if text else None
    if tt == "conditional":  # metadata_dropout 0
        if not text:
            return None
        meta = rec["meta"]
        prefix = (
            [("<|title|>", 0), (meta.get("title", ""), 0), ("<|author|>", 0), (meta.get("author", ""), 0)]
            if meta.get("title") or meta.get("author")
            else []
        )
        return {"sequence": [item(*prefix, ("<|content|>", 0), (text, 1), ("</s>", 1))]}
    if tt == "sft":
        if "messages" not in rec:
            return None
        parts = [("<s>", 0)]
        for m in rec["messages"]:
            trained = int(m["role"] == "assistant")
            parts += [(f"<|{m['role']}|>", 0), (m["content"], trained), ("<|end|>", trained)]
        return {"sequence": [item(*parts, ("</s>", 0))]}
    if "prompt" not in rec:
        return None
    prompt = [("<s>", 0), ("<|user|>", 0), (rec["prompt"], 0), ("<|end|>", 0), ("<|assistant|>", 0)]
    if tt == "dpo":
        return {k: [item(*prompt, (rec[k], 1), ("<|end|>", 1), ("</s>", 1))] for k in ("chosen", "rejected")}
    return {
        "prompts": [item(*prompt)],
        "rewards": rec["rewards"],
        "responses": [item((r, 1), ("<|end|>", 1), ("</s>", 1)) for r in rec["responses"]],
    }


def labels_of(ids, mask):
    return [i if m else -100 for i, m in zip(ids, mask)]


@pytest.mark.parametrize("tt", TRAINING_TYPES)
def test_round_trip_through_the_loader(tmp_path, tok_dir, tt):
    """Every training type written by the real stage reads back through tokenmill_loader as the spec renders it."""
    recs = [poem(i) for i in range(40)] + [chat(i) for i in range(40)]
    recs.insert(7, dict(poem(99), text="他写下 </s> 与 <|content|>"))  # literal special-token text stays text
    _, out = run(tmp_path, tok_dir, recs, training_type=tt, val_fraction=0.0, metadata_dropout=0.0, shard_tokens=300)
    tok = load_tokenizer(tok_dir)
    tok.encode_special_tokens = True
    want = [w for w in (expected_rendering(tok, r, tt) for r in recs) if w is not None]
    split = out / "train"
    store = open_store(split, verify=True)
    assert store.training_type == tt and len(store.parts) > 1 and store.num_records == len(want)
    ds = RecordDataset(split)
    for i, w in enumerate(want):
        got = ds[i]
        if tt in ("seq", "conditional", "sft"):
            ((ids, mask),) = w["sequence"]
            assert got["input_ids"].tolist() == ids and got["labels"].tolist() == labels_of(ids, mask)
        elif tt == "dpo":
            for side in ("chosen", "rejected"):
                ((ids, mask),) = w[side]
                assert got[f"{side}_input_ids"].tolist() == ids
                assert got[f"{side}_labels"].tolist() == labels_of(ids, mask)
        else:
            assert got["prompt_ids"].tolist() == w["prompts"][0][0]
            assert [r.tolist() for r in got["responses"]] == [ids for ids, _ in w["responses"]]
            assert [m.tolist() for m in got["response_masks"]] == [mask for _, mask in w["responses"]]
            assert got["rewards"].tolist() == w["rewards"]
    if tt in ("seq", "conditional", "sft"):  # the token stream: windows over every record in order
        stream = [t for w in want for t in w["sequence"][0][0]]
        labels = [x for w in want for x in labels_of(*w["sequence"][0])]
        windows = TokenDataset(split, seq_len=64)
        assert len(windows) == (len(stream) - 64) // 64 + 1
        batch = windows.get_batch(list(range(len(windows))))
        assert batch["input_ids"].flatten().tolist() == stream[: 64 * len(windows)]
        assert batch["labels"].flatten().tolist() == labels[: 64 * len(windows)]


# ------------------------------------------------------------------------------------------------ pinned tokenizer
def test_tokenizer_changed_mid_run_fails_and_publishes_nothing(tmp_path, tok_dir, monkeypatch):
    tok_copy = tmp_path / "tok"
    shutil.copytree(tok_dir, tok_copy)
    write_parts(tmp_path / "in", [poem(i) for i in range(200)])
    real, calls = stage_mod.encode_task, {"n": 0}

    def swap_then_encode(task):
        calls["n"] += 1
        if calls["n"] == 3:  # the tokenizer asset is rematerialized while tokenized_bins runs
            (tok_copy / "tokenizer.json").write_text((tok_copy / "tokenizer.json").read_text() + "\n")
        return real(task)

    monkeypatch.setattr(stage_mod, "encode_task", swap_then_encode)
    with pytest.raises(StaleUpstreamError, match=r"tok/tokenizer\.json: changed during the run"):
        tokenize_corpus(tmp_path / "in", tok_copy, tmp_path / "out", ShardSettings(task_bytes=2000), workers=1)
    assert calls["n"] == 3
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # no manifest, no shard, no stats


def test_check_re_encodes_and_catches_another_tokenizer(tmp_path, tok_dir):
    recs = [poem(i) for i in range(100)] + [chat(i) for i in range(30)]
    root = complete_data_root(tmp_path / "data", tok_dir, recs)
    tokenize_corpus(
        root / "deduped_jsonl",
        root / "tokenizer",
        root / "tokenized_bins",
        ShardSettings(shard_tokens=800, val_fraction=0.2),
        workers=1,
    )
    manifest = read_json(root / "tokenized_bins" / "train" / "dataset.json")
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256((tok_dir / "tokenizer.json").read_bytes()).hexdigest()
    ok = validate_token_shards(root / "tokenized_bins", root / "deduped_jsonl", root / "tokenizer")
    assert ok["problems"] == [] and ok["reencoded_records"] >= 32 and ok["tokens"] > 0

    # shards encoded by another tokenizer while dataset.json (and its copy) name the first one
    other = tmp_path / "other"
    train_tokenizer(root / "deduped_jsonl", other, TokenizerSettings(vocab_size=450))
    mixed = tmp_path / "mixed"
    tokenize_corpus(root / "deduped_jsonl", other, mixed, ShardSettings(shard_tokens=800, val_fraction=0.2), workers=1)
    for split in ("train", "val"):
        m = read_json(mixed / split / "dataset.json")
        shutil.copy(tok_dir / "tokenizer.json", mixed / split / m["tokenizer"]["file"])
        m["tokenizer"]["sha256"] = manifest["tokenizer"]["sha256"]
        for name in ("dataset.json", version_file(m["version"])):  # the copy, and the manifest current.json names
            (mixed / split / name).write_text(json.dumps(m), encoding="utf-8")
    bad = validate_token_shards(mixed, root / "deduped_jsonl", root / "tokenizer")
    assert bad["problems"] and all("differs from its record encoded with tokenizer.json" in p for p in bad["problems"])
    # and the upstream tokenizer changed after the shards were built: stale
    stale = validate_token_shards(root / "tokenized_bins", root / "deduped_jsonl", other)
    assert any("the shards are stale" in p for p in stale["problems"])


def test_the_check_re_encodes_with_hf_itself_not_the_piece_encoder(tmp_path, tok_dir, monkeypatch):
    root = complete_data_root(tmp_path / "data", tok_dir, [poem(i) for i in range(60)])
    real, calls = PieceEncoder.encode, []

    def one_id_off(self, texts):  # a piece encoder gone wrong: every ordinary token one id lower
        ids, counts = real(self, texts)
        calls.append(len(texts))
        return np.where(ids > 20, ids - 1, ids), counts

    monkeypatch.setattr(PieceEncoder, "encode", one_id_off)
    tokenize_corpus(root / "deduped_jsonl", root / "tokenizer", root / "tokenized_bins", ShardSettings(), workers=1)
    assert calls  # the shards were written by the piece encoder
    bad = validate_token_shards(root / "tokenized_bins", root / "deduped_jsonl", root / "tokenizer")
    assert bad["problems"] and all("differs from its record encoded with tokenizer.json" in p for p in bad["problems"])


def test_find_records_reads_ids_from_line_heads_and_parses_other_lines(tmp_path, monkeypatch):
    folder = tmp_path / "deduped"
    folder.mkdir()
    lines = [
        {"id": "a1", "text": "x", "meta": {}, "source": {"path": "f", "line": 1}},
        {"id": 'q"uote\\d', "text": "escaped id", "meta": {}, "source": {"path": "f", "line": 2}},
        {"text": "id not first", "id": "late", "meta": {}, "source": {"path": "f", "line": 3}},
        {"id": "a10", "text": "a longer id than a1", "meta": {}, "source": {"path": "f", "line": 4}},
    ]
    (folder / "part-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines[:2]), encoding="utf-8")
    (folder / "part-00001.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines[2:]), encoding="utf-8"
    )
    found = find_records(folder, {"a1", 'q"uote\\d', "late", "a10", "missing"})
    assert found == {r["id"]: r for r in lines}
    assert find_records(folder, {"a1"}) == {"a1": lines[0]}
    monkeypatch.setattr(verify, "FIND_BLOCK", 16)  # a block per line or two: lines found across block cuts
    assert find_records(folder, {"a1", "a10", "late"}) == {r["id"]: r for r in (lines[0], lines[2], lines[3])}
    with open(folder / "part-00001.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": "torn", "text": "cut sho\n')
    with pytest.raises(CorruptOutputError, match=r"part-00001.jsonl:3"):
        find_records(folder, {"torn"})
