"""tokenmill trace / where: real DataLoader batches (several ranks, workers, after a resume) traced back to their
records, token spans, source lines and folded duplicates; `where` agrees with `trace` on every position of a small
data root; the record index (kept, folded, folded into a folded one, into a val record, into none); the commands.
A small data root written directly (the loader tests' shard writer, deduped_jsonl as dedup writes it); the whole
graph, run in two source batches, end to end in the slow test."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from support import two_batch_graph

from cli import main
from tokenmill.common.io import record_id
from tokenmill.lineage import locate_token
from tokenmill.trace import (
    INDEX_DIR,
    LoaderSettings,
    _record_sources,
    _source_fields,
    id_text,
    record_index,
    trace,
    where,
)
from tokenmill_loader import DataLoader, TokenDataset
from tokenmill_loader.format import RECORD_IDS_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loaders" / "tests"))
from tm_writer import random_docs, write_dataset  # noqa: E402 (the loader tests' folder first)

BATCH = "g1-b000001"
SETTINGS = dict(seq_len=9, stride=8, batch_size=4, seed=3)


def write_split(folder: Path, docs: list[dict], ids: list[str]) -> None:
    write_dataset(folder, docs, "seq", shard_records=7)
    shards = sorted(folder.glob("shard-*"))
    for i, shard in enumerate(shards):
        (shard / RECORD_IDS_FILE).write_text(json.dumps(ids[i * 7 : (i + 1) * 7]), encoding="utf-8")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """a.jsonl lines 1-30 and b.jsonl lines 1-20, every 5th record in val, b.jsonl:21 deduped but in neither split;
    c.jsonl's four duplicates: of a.jsonl:3, of a.jsonl:5 (val), of the first duplicate, of a record not in the
    version; a.jsonl:31 dropped by clean."""
    root = tmp_path_factory.mktemp("trace") / "data"
    sources = [("a.jsonl", n) for n in range(1, 31)] + [("b.jsonl", n) for n in range(1, 21)]
    ids = [record_id(path, line=n) for path, n in sources]
    docs = random_docs(len(ids), seed=4, min_len=1, max_len=20)
    val = set(range(4, len(ids), 5))
    train_at = [i for i in range(len(ids)) if i not in val]
    write_split(root / "tokenized_bins" / "train", [docs[i] for i in train_at], [ids[i] for i in train_at])
    write_split(root / "tokenized_bins" / "val", [docs[i] for i in sorted(val)], [ids[i] for i in sorted(val)])
    batch = root / "deduped_jsonl" / BATCH
    batch.mkdir(parents=True)
    with open(batch / "part-00000.jsonl", "w", encoding="utf-8") as f:
        for rid, (path, n) in zip(ids, sources):
            record = {
                "id": rid,
                "text": 'a "source": {"path": "x"} in the text',
                "meta": {},
                "source": {"path": path, "line": n},
            }
            if n == 10:  # a line in another field order: parsed whole, not by the index's line pattern
                record = {"id": rid, "source": record["source"], "text": "t", "meta": {}}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        absent = {
            "id": record_id("b.jsonl", line=21),
            "text": "t",
            "meta": {},
            "source": {"path": "b.jsonl", "line": 21},
        }
        f.write(json.dumps(absent) + "\n")  # deduped, then not rendered by tokenized_bins: in no split
    dups = [record_id("c.jsonl", line=n) for n in range(1, 5)]
    kept_of = [ids[2], ids[4], dups[0], "0123456789abcdef"]
    with open(batch / "removed.jsonl", "w", encoding="utf-8") as f:
        for n, (rid, kept) in enumerate(zip(dups, kept_of), 1):
            entry = {
                "id": rid,
                "duplicate_of": kept,
                "level": "exact",
                "reason": "exact_duplicate",
                "source": {"path": "c.jsonl", "line": n},
                "text": "t",
            }
            f.write(json.dumps(entry) + "\n")
    (batch / "_stats.json").write_text("{}", encoding="utf-8")
    cleaned = root / "cleaned_jsonl" / BATCH
    cleaned.mkdir(parents=True)
    dropped = {
        "id": record_id("a.jsonl", line=31),
        "source": {"path": "a.jsonl", "line": 31},
        "reason": "too_short",
        "text": "x",
    }
    (cleaned / "_rejected.jsonl").write_text(json.dumps(dropped) + "\n", encoding="utf-8")
    (cleaned / "_stats.json").write_text("{}", encoding="utf-8")
    return root


def train_ids(data: Path) -> list[str]:
    return [
        rid
        for shard in sorted((data / "tokenized_bins" / "train").glob("shard-*"))
        for rid in json.loads((shard / RECORD_IDS_FILE).read_text())
    ]


def drawn(loader, epochs: int) -> list[dict]:
    out = []
    for epoch in range(loader.epoch, loader.epoch + epochs):
        loader.set_epoch(epoch)
        out += list(loader)
    return out


def check_rows(data: Path, batches: list[dict], settings: LoaderSettings, rank: int, first_step: int = 0) -> None:
    """Every row of a rank's batches is the sample trace names: its pieces' tokens are the row's, each piece names
    its record's id and source line."""
    store = TokenDataset(data / "tokenized_bins" / "train", 9, 8).store
    ids = train_ids(data)
    for k, batch in enumerate(batches):
        found = trace(data, first_step + k, settings, rank=rank)
        assert [s["row"] for s in found["samples"]] == list(range(len(batch["input_ids"])))
        for sample, row in zip(found["samples"], batch["input_ids"]):
            tokens = [store.read_record(p["record"], "sequence")[p["begin"] : p["end"]] for p in sample["pieces"]]
            assert np.array_equal(np.concatenate(tokens), row.numpy())
            for p in sample["pieces"]:
                assert p["id"] == ids[p["record"]]
                assert p["source"] == _source_of(p["id"])
            assert sample["worker"] == (None if settings.num_workers == 0 else k % settings.num_workers)


def _source_of(rid: str) -> dict:
    for path, count in (("a.jsonl", 30), ("b.jsonl", 20)):
        for n in range(1, count + 1):
            if record_id(path, line=n) == rid:
                return {"path": path, "line": n}
    raise AssertionError(rid)


def loader(data: Path, rank: int, **settings) -> DataLoader:
    ds = TokenDataset(data / "tokenized_bins" / "train", settings.pop("seq_len"), settings.pop("stride"))
    return DataLoader(ds, rank=rank, **settings)


def test_trace_names_the_records_of_every_row_of_real_batches(data):
    settings = {**SETTINGS, "world_size": 2, "num_workers": 2}
    for rank in range(2):
        batches = drawn(loader(data, rank, **settings), epochs=2)
        check_rows(data, batches, LoaderSettings(**settings), rank)


def test_trace_after_a_resume_counts_steps_from_it(data):
    before = loader(data, 0, **SETTINGS, world_size=2)
    it = iter(before)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(before.state_dict()))
    after = {**SETTINGS, "batch_size": 3, "world_size": 3, "num_workers": 2}
    for rank in range(3):
        resumed = loader(data, rank, **after)
        resumed.load_state_dict(state)
        check_rows(data, drawn(resumed, epochs=1), LoaderSettings(**after, state=state, resumed_at=3), rank, 3)
    with pytest.raises(ValueError, match="before the resume"):
        trace(data, 2, LoaderSettings(**after, state=state, resumed_at=3))


def sightings(found: dict) -> set[tuple]:
    return {
        (s["epoch"], s["step"], s["rank"], s["row"], s["window"], p["at"], p["id"])
        for s in found["seen"]
        for p in s["pieces"]
    }


def test_where_agrees_with_trace_on_every_position(data):
    settings = LoaderSettings(**SETTINGS, world_size=3)
    traced, step = set(), 0
    while (found := trace(data, step, settings))["epoch"] < 2:
        for s in found["samples"]:
            traced |= {(s["epoch"], step, s["rank"], s["row"], s["window"], p["at"], p["id"]) for p in s["pieces"]}
        step += 1
    by_record = {rid: sightings(where(data, settings, key=rid, epochs=2)) for rid in train_ids(data)}
    assert set().union(*by_record.values()) == traced
    assert all({x[-1] for x in seen} <= {rid} for rid, seen in by_record.items())
    a_ids = {record_id("a.jsonl", line=n) for n in range(1, 31)}
    from_a = sightings(where(data, settings, source="a.jsonl", epochs=2))
    assert from_a == {x for x in traced if x[-1] in a_ids}


def test_index_resolves_folded_records_and_where_names_each_fate(data):
    settings = LoaderSettings(**SETTINGS)
    kept, in_val = record_id("a.jsonl", line=3), record_id("a.jsonl", line=5)
    first, second = record_id("c.jsonl", line=1), record_id("c.jsonl", line=3)
    for dup in (first, second):  # c.jsonl:3 was folded into c.jsonl:1, itself folded into a.jsonl:3
        found = where(data, settings, key=dup)
        assert found["records"][0]["folded_into"] == kept
        assert {p[-1] for p in sightings(found)} == {kept} and found["seen"]
    assert sightings(where(data, settings, key=first)) == sightings(where(data, settings, key=kept))
    val = where(data, settings, key="c.jsonl:2")
    assert val["records"][0]["split"] == "val" and val["records"][0]["folded_into"] == in_val and not val["seen"]
    assert where(data, settings, key="c.jsonl:4")["records"][0]["split"] is None
    dropped = where(data, settings, key="a.jsonl:31")
    assert (
        dropped["not_in_dataset"][0]["stage"] == "cleaned_jsonl"
        and dropped["not_in_dataset"][0]["reason"] == "too_short"
    )
    assert [m["reason"] for m in where(data, settings, source="a.jsonl")["not_in_dataset"]] == ["too_short"]
    for unknown in ("ffffffffffffffff", "not-an-id"):
        assert where(data, settings, key=unknown)["not_in_dataset"][0]["fate"] == "unknown"
    absent = where(data, settings, key="b.jsonl:21")
    assert not absent["records"] and absent["not_in_dataset"][0]["stage"] == "deduped_jsonl"
    assert [m["id"] for m in where(data, settings, source="b.jsonl")["not_in_dataset"]] == [
        record_id("b.jsonl", line=21)
    ]
    step0 = trace(data, 0, settings)
    folded = {p["id"]: [f["id"] for f in p["folded"]] for s in step0["samples"] for p in s["pieces"]}
    assert all(v == [] or k == kept for k, v in folded.items())
    index = record_index(data)
    folds = index.folded_into("train", [train_ids(data).index(kept)])
    assert sorted(id_text(index.ids[e]) for entries in folds.values() for e in entries) == sorted([first, second])
    assert len(list((data / INDEX_DIR).iterdir())) == 1  # built once, then read


def test_commands_print_the_samples_and_the_sightings(data, capsys):
    args = ["--data", str(data), "--seq-len", "9", "--stride", "8", "--batch-size", "4", "--seed", "3"]
    assert main(["trace", "--step", "1", "--world", "2", *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 1 (epoch 0): 8 samples of train version None") and "a.jsonl:" in out
    assert main(["trace", "--step", "1", "--workers", "2", "--rank", "1", "--world", "2", *args]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("  rank 1 row 0 (worker 1): window ")
    assert main(["where", "c.jsonl:1", *args]) == 0
    out = capsys.readouterr().out
    kept = record_id("a.jsonl", line=3)
    assert f"c.jsonl:1  folded by dedup into {kept} (train record {train_ids(data).index(kept)})" in out
    assert "epoch 0 step" in out
    assert main(["where", *args]) == 2
    assert main(["trace", "--step", "0", "--state", str(data / "missing.json"), *args]) == 2
    assert "missing.json" in capsys.readouterr().err


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """The graph run in two batches (tests/support.py two_batch_graph): a.jsonl with copies of its records 1 and 2
    (lines 41, 42), a line that is not JSON (43) and a too-short text (44); b.jsonl with copies of a.jsonl's 3, 4."""
    return two_batch_graph(tmp_path_factory.mktemp("trace-graph"))[0]


def test_graph_batches_trace_to_the_records_lineage_names(graph):
    settings = dict(seq_len=33, stride=32, batch_size=4, seed=1, world_size=2, num_workers=2)
    traced = set()
    for rank in range(2):
        batches = drawn(loader(graph, rank, **settings), epochs=1)
        for step, batch in enumerate(batches):
            found = trace(graph, step, LoaderSettings(**settings), rank=rank)
            assert found["dataset_version"] == 2
            for sample, row in zip(found["samples"], batch["input_ids"], strict=True):
                assert sample["end"] - sample["begin"] == len(row)
                for p in sample["pieces"]:
                    lineage = locate_token(graph, sample["begin"] + p["at"])
                    assert (p["id"], p["source"], p["begin"]) == (
                        lineage["record_id"],
                        lineage["source"],
                        lineage["offset_in_record"],
                    )
                    assert [f["id"] for f in p["folded"]] == [f["id"] for f in lineage["folded_duplicates"]]
                    traced.add((step, rank, sample["row"], p["at"], p["id"]))
    run = LoaderSettings(**settings)
    copy, kept = where(graph, run, key="a.jsonl:41"), where(graph, run, key="a.jsonl:1")
    assert copy["records"][0]["folded_into"] == record_id("a.jsonl", line=1) and copy["seen"] == kept["seen"]
    assert where(graph, run, key="b.jsonl:41")["records"][0]["folded_into"] == record_id("a.jsonl", line=3)
    for line, stage in ((43, "raw_records"), (44, "cleaned_jsonl")):
        assert where(graph, run, key=f"a.jsonl:{line}")["not_in_dataset"][0]["stage"] == stage
    from_a = where(graph, run, source="a.jsonl")
    a_ids = {record_id("a.jsonl", line=n) for n in range(1, 45)}
    assert {(s["step"], s["rank"], s["row"], p["at"], p["id"]) for s in from_a["seen"] for p in s["pieces"]} == {
        x for x in traced if x[-1] in a_ids
    }
    assert {m["reason"] for m in from_a["not_in_dataset"]} == {"malformed_json", "too_short"}


def test_record_lines_give_the_sources_json_gives():
    records = [
        {"id": f"{i:016x}", "text": 'x "source": {"path": "y", "line": 1}}', "meta": {}, "source": source}
        for i, source in enumerate(
            [
                {"path": 'a"b\\c.jsonl', "line": 3},
                {"path": "中文/诗.json", "index": 7},
                {"path": "w.warc.gz", "index": 2, "offset": 99},
            ]
        )
    ]
    lines = [json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in records]
    ids, fields = _record_sources(lines)
    assert [id_text(x) for x in ids] == [r["id"] for r in records]
    assert fields == [_source_fields(r) for r in records]
    assert [json.loads(b'"' + f[0] + b'"') for f in fields] == [r["source"]["path"] for r in records]
