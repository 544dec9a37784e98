"""`tokenmill forget`: a takedown removes exactly the records named (by id, source path, regex, with the duplicates
dedup folded into them), re-packs only their shards (every byte of the others identical, the older version still
readable), records the removal in the version's manifest and keeps the records out of appends and new generations
(by id and by text); a selector naming nothing publishes nothing; on a graph run, explain says a record was
forgotten, the exports are written again without it, and a later batch with its text stays out."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
from support import run_config, two_batch_graph

from assets.batches import register_batches
from cli import main
from definitions import build_defs
from resources import CorpusSource, DataRoot
from runs import run_batches
from tokenmill.common.io import STATS_FILE, read_json, record_id, staged_output
from tokenmill.common.lock import DataRootLock
from tokenmill.explain import explain, render
from tokenmill.exports import hf_parquet, nanogpt
from tokenmill.forget import Selector, forget
from tokenmill.stages.telemetry import read_funnel
from tokenmill.stages.tokenize import ShardSettings, TokenizerSettings, tokenize_batches, train_tokenizer
from tokenmill.stages.tokenize.forgotten import FORGOTTEN_FILE, text_key
from tokenmill_loader import open_store
from tokenmill_loader.format import KEYS, SPLITS, read_record_ids, validate_dataset, version_file

LINES = ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。", "白日依山尽，黄河入海流。", "Shall I compare thee?"]
SETTINGS = ShardSettings(training_type="conditional", shard_tokens=300, val_fraction=0.2)
BATCHES = (("g1-b0001", 80), ("g1-b0002", 40), ("g1-b0003", 20))


def record(batch: str, i: int) -> dict:
    rid = hashlib.blake2b(f"{batch}/{i}".encode(), digest_size=8).hexdigest()
    text = "\n".join(LINES[(i + k) % len(LINES)] for k in range(1 + i % 3)) + f"\n{batch} 其{i}"
    return {"id": rid, "text": text, "meta": {"title": f"题{i % 5}"}, "source": {"path": f"{batch}/{i % 4}.json"}}


def write_batch(deduped: Path, key: str, records: list[dict]) -> tuple[str, Path]:
    folder = deduped / key
    folder.mkdir(parents=True)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    (folder / "part-00000.jsonl").write_text(lines, encoding="utf-8")
    return key, folder


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("forget-tokenizer")
    key, folder = write_batch(root, BATCHES[0][0], [record(BATCHES[0][0], i) for i in range(BATCHES[0][1])])
    train_tokenizer(folder, root / "tokenizer", TokenizerSettings(vocab_size=400))
    return root / "tokenizer"


@pytest.fixture
def root(tmp_path, tokenizer) -> Path:
    """A data root with two deduped batches published as version 1 (several shards per split)."""
    for key, n in BATCHES[:2]:
        write_batch(tmp_path / "deduped_jsonl", key, [record(key, i) for i in range(n)])
    build(tmp_path, tokenizer, 2)
    return tmp_path


def build(data: Path, tokenizer: Path, batches: int, settings: ShardSettings = SETTINGS):
    keys = [key for key, _ in BATCHES[:batches]]
    pairs = [(key, data / "deduped_jsonl" / key) for key in keys]
    return tokenize_batches(pairs, tokenizer, data / "tokenized_bins", settings, workers=1)


def records(data: Path, split: str, version: int | None = None) -> dict[str, list[list[int]]]:
    """record id -> its arrays (every key), in dataset order."""
    store = open_store(data / "tokenized_bins" / split, version=version)
    ids = [rid for part in store.parts for rid in read_record_ids(part.folder)]
    keys = list(KEYS[store.training_type])
    return {rid: [as_lists(store.read_record(i, k)) for k in keys] for i, rid in enumerate(ids)}


def as_lists(arrays) -> list:
    """A record's key as lists (grpo's responses and masks: a list of arrays, one per response)."""
    return [a.tolist() for a in arrays] if isinstance(arrays, list) else arrays.tolist()


def folder_bytes(split_dir: Path) -> dict[str, bytes]:
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in sorted(split_dir.glob("shard-*/*"))}


def run(data: Path, *args: str, capsys) -> tuple[int, str, str]:
    rc = main(["forget", *args, "--data", str(data)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_takedown_removes_exactly_the_named_records_and_no_other_byte(root, capsys):
    bins = root / "tokenized_bins"
    before = {s: records(root, s) for s in SPLITS}
    files = {s: folder_bytes(bins / s) for s in SPLITS}
    v1 = {s: read_json(bins / s / version_file(1)) for s in SPLITS}
    first = v1["train"]["shards"][0]["name"]
    in_first = read_record_ids(bins / "train" / first)
    gone = {in_first[1], in_first[3], next(iter(before["val"]))}
    rc, out, err = run(root, "--id", *sorted(gone), "--reason", "DMCA 118", "--by", "legal", capsys=capsys)
    assert rc == 0 and err == "" and out.startswith("forgot 3 records") and "version 2" in out

    for s in SPLITS:  # exactly those records gone, every other one's arrays unchanged, in the same order
        assert records(root, s) == {rid: arrays for rid, arrays in before[s].items() if rid not in gone}
        assert records(root, s, version=1) == before[s]  # the pinned version, untouched
        assert folder_bytes(bins / s).items() >= files[s].items()  # no byte of an existing shard changed
        v2 = read_json(bins / s / version_file(2))
        old, new = v1[s]["shards"], v2["shards"]
        unaffected = [e for e in old if not gone & set(read_record_ids(bins / s / e["name"]))]
        assert [e for e in new if e in old] == unaffected  # listed as they were, in the same order
        assert len(new) == len(old) and all(e["name"] > old[-1]["name"] for e in new if e not in old)
        validate_dataset(bins / s, version=2, checksums=True, scan=True)
    (removal,) = v2["removals"]
    assert removal["selector"] == {"id": sorted(gone), "with_duplicates": False}
    assert (removal["records"], removal["reason"], removal["by"], removal["version"]) == (
        sorted(gone),
        "DMCA 118",
        "legal",
        2,
    )
    assert removal["at"].endswith("+00:00") and removal["duplicates"] == []
    stats = read_json(bins / STATS_FILE)
    assert stats["dropped_forgotten"] == 3 and stats["docs_in"] == stats["docs_out"] + 3 == 120
    assert stats["records"] == sum(len(r) for r in before.values()) - 3 and stats["version"] == 2
    listed = [json.loads(line) for line in (bins / FORGOTTEN_FILE).read_text().splitlines()]
    assert {e["id"] for e in listed} == gone and all(len(e["key"]) == 64 for e in listed)


def test_appends_and_new_generations_keep_the_records_and_their_text_out(root, tokenizer):
    bins = root / "tokenized_bins"
    batch1 = [record(BATCHES[0][0], i) for i in range(BATCHES[0][1])]
    gone = batch1[5]
    assert forget(root, Selector(ids=(gone["id"],))).result.version == 2
    # a later batch: new records, and the same text again under another id (dedup's exact key: case and spaces)
    copy = {**record("g1-b0003", 99), "text": "  " + gone["text"].upper() + " "}
    key, _ = write_batch(root / "deduped_jsonl", "g1-b0003", [record("g1-b0003", i) for i in range(20)] + [copy])
    appended = build(root, tokenizer, 3)
    ids = {rid for s in SPLITS for rid in records(root, s)}
    assert appended.version == 3 and appended.batches_added == [key] and not {gone["id"], copy["id"]} & ids
    assert appended.dropped == {"forgotten": 2} and appended.docs_in == appended.docs_out + 2 == 141
    (entry,) = [e for e in read_json(bins / "_rejected.json") if e["id"] == copy["id"]]
    assert entry["reason"] == "forgotten" and "text" not in entry  # a taken-down text is never copied
    assert read_json(bins / "train" / version_file(3))["removals"][0]["records"] == [gone["id"]]

    rebuilt = build(root, tokenizer, 3, SETTINGS.model_copy(update={"seed": 7}))  # a new generation: all again
    assert (rebuilt.generation, rebuilt.dropped) == (2, {"forgotten": 2})
    assert not {gone["id"], copy["id"]} & {rid for s in SPLITS for rid in records(root, s)}
    assert read_json(bins / "train" / version_file(4))["removals"][0]["records"] == [gone["id"]]


def test_source_and_match_selectors_and_a_selector_naming_nothing(root, capsys):
    bins = root / "tokenized_bins"
    rc, out, err = run(root, "--match", "不存在的文字", capsys=capsys)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and "matches no record of version 1" in err
    rc, _, err = run(root, "--id", "0123456789abcdef", capsys=capsys)
    assert rc == 2 and "holds no record 0123456789abcdef" in err
    rc, _, err = run(root, "--match", "(", capsys=capsys)
    assert rc == 2 and err.startswith("tokenmill forget: --match '(':")
    assert read_json(bins / "current.json") == {"version": 1} and not (bins / FORGOTTEN_FILE).exists()

    batch2 = [record(BATCHES[1][0], i) for i in range(BATCHES[1][1])]
    rc, out, _ = run(root, "--source", "g1-b0002/1.json", "g1-b0002/2.json", capsys=capsys)
    by_source = {r["id"] for r in batch2 if r["source"]["path"] in ("g1-b0002/1.json", "g1-b0002/2.json")}
    assert rc == 0 and out.startswith(f"forgot {len(by_source)} records")
    rc, out, _ = run(root, "--match", r"g1-b0002 其3\d$", capsys=capsys)  # 30-39, the ones not already gone
    by_text = {r["id"] for r in batch2[30:40]} - by_source
    assert rc == 0 and out.startswith(f"forgot {len(by_text)} records")
    ids = {rid for s in SPLITS for rid in records(root, s)}
    assert not (by_source | by_text) & ids and len(ids) == 120 - len(by_source | by_text)
    removals = read_json(bins / "train" / version_file(3))["removals"]
    assert [r["selector"] for r in removals] == [
        {"source": ["g1-b0002/1.json", "g1-b0002/2.json"], "with_duplicates": False},
        {"match": r"g1-b0002 其3\d$", "with_duplicates": False},
    ]
    assert [set(r["records"]) for r in removals] == [by_source, by_text]


def forget_killed_at(root: Path, point: str, rid: str) -> int:
    """`tokenmill forget --id rid` in a process SIGKILLed at failpoint `point`; its exit status."""
    script = "import sys; from cli import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", script, "forget", "--id", rid, "--data", str(root)]
    env = {**os.environ, "TOKENMILL_FAILPOINT": point}
    return subprocess.run(command, cwd=Path(__file__).parents[1], env=env, capture_output=True).returncode


def test_a_takedown_killed_before_or_after_its_switch_leaves_one_consistent_version(root, tokenizer):
    bins, gone = root / "tokenized_bins", record(BATCHES[0][0], 7)["id"]
    assert forget_killed_at(root, "tokenized_bins:version_written", gone) == -signal.SIGKILL
    assert read_json(bins / "current.json") == {"version": 1} and gone in records(root, "train") | records(root, "val")
    assert forget_killed_at(root, "tokenized_bins:split_published", gone) == -signal.SIGKILL
    assert read_json(bins / "current.json") == {"version": 2}  # switched: the next run settles the batch counts
    appended = build(root, tokenizer, 2)  # nothing new: recovers, reports the published version
    assert (appended.version, appended.new_version, appended.dropped) == (2, False, {"forgotten": 1})
    assert appended.docs_in == appended.docs_out + 1 == 120 and not list((bins / "_batches").glob("*.pending"))


def test_a_takedown_waits_for_no_running_update(root, capsys):
    with DataRootLock(root).acquire("tokenmill update"):  # a run writing the data root
        rc, _, err = run(root, "--id", record(BATCHES[0][0], 0)["id"], capsys=capsys)
    assert rc == 2 and "is in use by run tokenmill update" in err
    assert read_json(root / "tokenized_bins" / "current.json") == {"version": 1}


def chat(batch: str, i: int) -> dict:
    """A record every training type renders: messages (sft), prompt/chosen/rejected (dpo), responses/rewards
    (grpo: 1-3 responses)."""
    n = 1 + i % 3
    return {
        **record(batch, i),
        "messages": [{"role": "user", "content": f"问{i}"}, {"role": "assistant", "content": LINES[i % 4]}],
        "prompt": f"题{i}：写月亮",
        "chosen": LINES[i % 4],
        "rejected": "月亮 " * n,
        "responses": [LINES[(i + k) % 4] for k in range(n)],
        "rewards": [k - 0.5 for k in range(n)],
    }


@pytest.mark.parametrize("training_type", ["seq", "sft", "dpo", "grpo"])
def test_every_training_type_is_re_packed_by_its_item_offsets(tmp_path, tokenizer, training_type):
    key = BATCHES[0][0]
    write_batch(tmp_path / "deduped_jsonl", key, [chat(key, i) for i in range(40)])
    settings = SETTINGS.model_copy(update={"training_type": training_type, "val_fraction": 0.0})
    build(tmp_path, tokenizer, 1, settings)
    before = records(tmp_path, "train")
    gone = {chat(key, i)["id"] for i in (2, 3, 11)}  # one, two and three responses (grpo)
    outcome = forget(tmp_path, Selector(ids=tuple(sorted(gone))))  # its check re-encodes a sample of the batch
    assert outcome.result.version == 2 and outcome.removed == sorted(gone)
    assert records(tmp_path, "train") == {rid: arrays for rid, arrays in before.items() if rid not in gone}
    validate_dataset(tmp_path / "tokenized_bins" / "train", checksums=True, scan=True)


def test_a_record_is_keyed_by_its_text_as_dedup_keys_it():
    assert text_key({"text": "Hello, World!"}) == text_key({"text": "hello world"})
    assert text_key({"text": "hello world"}) != text_key({"text": "hello there"})
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert text_key(chat) == text_key({**chat, "id": "x"}) != text_key({"messages": []})


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """The two-batch graph of test_explain (a.jsonl: record 1 copied exactly at line 41, record 2 nearly at 42),
    with nanogpt_bins and hf_parquet materialized from its version."""
    root = tmp_path_factory.mktemp("forget-graph")
    data, first = two_batch_graph(root)
    bins = data / "tokenized_bins"
    with staged_output(data / "nanogpt_bins") as out:
        nanogpt.write_nanogpt(bins, out)
    with staged_output(data / "hf_parquet") as out:
        hf_parquet.write_hf_parquet(data / "deduped_jsonl", bins, out, hf_parquet.ParquetSettings())
    return root, data, first


def test_on_a_graph_run_explain_exports_and_a_later_batch_agree(graph, capsys):
    root, data, first = graph
    kept, copy = record_id("a.jsonl", line=1), record_id("a.jsonl", line=41)
    rc, out, _ = run(data, "--match", "^" + re.escape(first[0][:40]), "--with-duplicates", "--by", "ops", capsys=capsys)
    assert rc == 0 and "with 1 duplicate dedup" in out and "nanogpt_bins, hf_parquet, funnel_telemetry" in out
    (tokenized,) = [s for s in read_funnel(data).stages if s.stage == "tokenized_bins"]
    assert (tokenized.dropped, tokenized.docs_in - tokenized.docs_out) == ({"forgotten": 1}, 1)
    fate = explain(data, kept)
    assert (fate["fate"], fate["why"], fate["by"], fate["selector"]["with_duplicates"]) == (
        "forgotten",
        None,
        "ops",
        True,
    )
    shown = render(fate)
    assert f"forgotten   in tokenized_bins version {fate['version']} (no reason given, by ops" in shown
    assert first[0] not in shown and "(withheld: taken down)" in shown
    removal = read_json(data / "tokenized_bins" / "train" / "dataset.json")["removals"][0]
    assert (removal["records"], removal["duplicates"]) == ([kept], [copy])

    store = open_store(data / "tokenized_bins" / "train")
    tokens = np.fromfile(data / "nanogpt_bins" / "train.bin", dtype=np.uint16)
    assert len(tokens) == store.num_items("sequence")  # written again from the new version
    exported = {
        i
        for p in sorted((data / "hf_parquet" / "records").glob("*.parquet"))
        for i in pq.read_table(p)["id"].to_pylist()
    }
    assert kept not in exported and record_id("a.jsonl", line=2) in exported

    # a later batch holding the text again: kept out of the dataset (dedup or the takedown list drops it)
    (root / "src" / "c.jsonl").write_text(json.dumps({"text": first[0], "title": "again"}) + "\n", encoding="utf-8")
    with dg.instance_for_test() as instance:
        defs = build_defs(CorpusSource(path=str(root / "src")), DataRoot(root=str(data)))
        pending, _ = register_batches(instance, data, root / "src", False)
        for key, result in run_batches(defs.resolve_job_def("tokenmill_all"), instance, pending, run_config()):
            assert result.success, key
    again = record_id("c.jsonl", line=1)
    ids = {rid for s in SPLITS for rid in records(data, s)}
    assert again not in ids and kept not in ids
    for rid in (again, copy):  # a copy of the forgotten text, before or after: dropped, its text withheld too
        fate = explain(data, rid)
        assert fate["fate"] == "dropped" and first[0] not in render(fate) and "(withheld: taken down)" in render(fate)
