"""exports: nanogpt_bins, megatron_indexed, hf_parquet and the transformers tokenizer files, each read back by the
library it targets (numpy memmap as nanoGPT's get_batch, megatron-core's IndexedDataset, datasets' parquet loader,
transformers' AutoTokenizer) and compared with what tokenmill_loader reads from the shards."""

import json
import pickle
import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest

from assets.exports import EXPORT_ASSETS
from resources import Compute, DataRoot
from tokenmill.common.io import SHARDS_FILE, iter_jsonl, read_json, record_shards
from tokenmill.errors import ConfigError
from tokenmill.exports.hf_parquet import _record_counts, meta_source_json
from tokenmill.stages.clean import clean_corpus
from tokenmill.stages.dedup import build_dedup_report, write_deduped
from tokenmill.stages.raw import ingest
from tokenmill.stages.tokenize import ShardSettings, TokenizerSettings, tokenize_batches, train_tokenizer
from tokenmill_loader import open_store
from tokenmill_loader.format import SPLITS

SUBJECTS = ["月亮", "江水", "秋风", "高山", "春雨", "孤舟", "the sea", "a lantern", "winter", "the old road"]
VERSES = [
    "床前明月光，疑是地上霜。",
    "举头望明月，低头思故乡。",
    "白日依山尽，黄河入海流。",
    "欲穷千里目，更上一层楼。",
    "Shall I compare thee to a summer's day?",
    "Rough winds do shake the darling buds of May,",
]


def words(i: int, n: int) -> str:
    """n pseudo-random CJK characters of record i: enough of its own that dedup keeps every record."""
    rng = np.random.default_rng(i)
    return "".join(chr(0x4E00 + int(c)) for c in rng.integers(0, 3000, n))


def source_record(i: int) -> dict:
    """A chat record that every training type can render: messages (sft), prompt/chosen/rejected (dpo),
    responses/rewards (grpo)."""
    subject, verse = SUBJECTS[i % len(SUBJECTS)], VERSES[i % len(VERSES)]
    answer = f"{verse}{words(i, 24)}，{subject}。"
    messages = [{"role": "user", "content": f"请写一首关于{subject}的诗：{words(10_000 + i, 8)}"}]
    if i % 3 == 0:
        messages.insert(0, {"role": "system", "content": f"你是诗人{i % 11}号。"})
    messages.append({"role": "assistant", "content": answer})
    if i % 4 == 0:
        messages += [{"role": "user", "content": f"再来一首 {i}"}, {"role": "assistant", "content": words(i + 7, 12)}]
    return {
        "text": "\n".join(m["content"] for m in messages),
        "meta": {"title": f"题{i}", "author": f"诗人{i % 7}"} if i % 5 else {},
        "messages": messages,
        "prompt": messages[-2]["content"],
        "chosen": answer,
        "rejected": f"{subject} " * (1 + i % 3) + words(i + 3, 6),
        "responses": [answer, f"{subject}{i}"][: 1 + i % 2],
        "rewards": [1.0, -0.5][: 1 + i % 2],
    }


BATCHES = ("b1", "b2")  # deduped_jsonl is partitioned by source batch: <stage>/<batch>/part-*.jsonl


def build_data_root(root: Path, source: Path, training_type: str, upstream: Path | None = None) -> Path:
    """raw -> clean -> dedup per source batch, tokenizer (small vocabulary) -> tokenized_bins over the batches, with
    the plain stage functions, each into root/<asset key>[/<batch>] like the assets; `upstream` reuses another
    root's deduped_jsonl and tokenizer."""
    if upstream is None:
        for b in BATCHES:
            ingest(source / b, root / "raw_records" / b, workers=1)
            clean_corpus(root / "raw_records" / b, root / "cleaned_jsonl" / b, workers=1)
            build_dedup_report(root / "cleaned_jsonl" / b, root / "dedup_report" / b, workers=1)
            write_deduped(root / "cleaned_jsonl" / b, root / "dedup_report" / b, root / "deduped_jsonl" / b, workers=1)
        train_tokenizer(root / "deduped_jsonl", root / "tokenizer", TokenizerSettings(vocab_size=600))
    else:
        for key in ("deduped_jsonl", "tokenizer"):
            shutil.copytree(upstream / key, root / key)
    batches = [(b, root / "deduped_jsonl" / b) for b in BATCHES]
    settings = ShardSettings(training_type=training_type, val_fraction=0.2)
    tokenize_batches(batches, root / "tokenizer", root / "tokenized_bins", settings, workers=1)
    return root


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    """One data root per training type the exports treat differently, all from the same 240 source records in two
    source batches."""
    base = tmp_path_factory.mktemp("exports")
    for b, part in zip(BATCHES, (range(0, 130), range(130, 240))):
        (base / "source" / b).mkdir(parents=True)
        lines = "".join(json.dumps(source_record(i), ensure_ascii=False) + "\n" for i in part)
        (base / "source" / b / f"chats-{b}.jsonl").write_text(lines)
    sft = build_data_root(base / "sft", base / "source", "sft")
    return {
        "sft": sft,
        **{tt: build_data_root(base / tt, base / "source", tt, upstream=sft) for tt in ("seq", "dpo", "grpo")},
    }


def materialize(root: Path, assets=EXPORT_ASSETS, workers: int = 0, **kw) -> dg.ExecuteInProcessResult:
    resources = {"data_root": DataRoot(root=str(root)), "compute": Compute(workers=workers)}
    return dg.materialize(assets, resources=resources, **kw)


def exports_of(training_type: str) -> list:
    """nanoGPT takes one token stream: seq, conditional and sft."""
    return [a for a in EXPORT_ASSETS if training_type not in ("dpo", "grpo") or a.key.path[-1] != "nanogpt_bins"]


RUN_CONFIG = {"ops": {"hf_parquet": {"config": {"rows_per_file": 50}}}}  # several Parquet files per folder


@pytest.fixture(scope="module")
def exported(roots) -> dict[str, dg.ExecuteInProcessResult]:
    """The exports of each data root materialized through Dagster."""
    return {tt: materialize(root, exports_of(tt), run_config=RUN_CONFIG) for tt, root in roots.items()}


def stores(root: Path) -> dict:
    return {split: open_store(root / "tokenized_bins" / split) for split in SPLITS}


def records(store, key: str) -> list[np.ndarray]:
    return [store.read_record(i, key) for i in range(store.num_records)]


def test_every_export_materializes_with_usage_metadata(exported, roots):
    for tt, result in exported.items():
        assert result.success
        for asset in exports_of(tt):
            asset = asset.key.path[-1]
            meta = result.asset_materializations_for_node(asset)[0].metadata
            assert "```python" in meta["usage"].value
            assert Path(meta["path"].value) == roots[tt] / asset and (roots[tt] / asset).is_symlink()
    sft = exported["sft"].asset_materializations_for_node("nanogpt_bins")[0].metadata
    assert sft["bytes_per_token"].value == 2.0  # uint16 tokens only
    assert "ignores" in sft["usage"].value  # nanoGPT's own train.py ignores the loss mask: said where it is used


def test_nanogpt_refuses_training_types_without_one_stream(roots):
    with pytest.raises(ConfigError, match="nanogpt_bins needs one token stream"):
        materialize(roots["dpo"], EXPORT_ASSETS[:1])
    assert not (roots["dpo"] / "nanogpt_bins").exists()


def test_nanogpt_get_batch_reads_the_loaders_tokens(exported, roots):
    root = roots["sft"]
    folder = root / "nanogpt_bins"
    meta = pickle.loads((folder / "meta.pkl").read_bytes())
    for split, store in stores(root).items():
        assert meta["vocab_size"] == store.vocab_size and meta["dtype"] == "uint16"
        # nanoGPT's get_batch: a fresh memmap, windows of block_size + 1 at random starts, x and y shifted by one
        data = np.memmap(folder / f"{split}.bin", dtype=np.uint16, mode="r")
        mask = np.memmap(folder / f"{split}_loss_mask.bin", dtype=np.uint8, mode="r")
        assert len(data) == len(mask) == store.num_items("sequence")
        block_size = 16
        starts = np.random.default_rng(0).integers(0, len(data) - block_size, 32)
        for i in starts:
            x = data[i : i + block_size].astype(np.int64)
            y = data[i + 1 : i + 1 + block_size].astype(np.int64)
            assert (x == store.read("sequence", i, i + block_size)).all()
            assert (y == store.read("sequence", i + 1, i + 1 + block_size)).all()
            assert (mask[i : i + block_size] == store.read("loss_mask", i, i + block_size)).all()
        assert (np.asarray(data) == store.read("sequence", 0, store.num_items("sequence"))).all()


def test_megatron_indexed_dataset_reads_every_record(exported, roots):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    for tt in ("sft", "dpo", "grpo"):
        folder = roots[tt] / "megatron_indexed"
        for split, store in stores(roots[tt]).items():
            for key in store.keys:
                ds = IndexedDataset(str(folder / f"{split}_{key}_document"))
                ours = records(store, key)
                documents = ds.document_indices
                assert len(documents) == store.num_records + 1, (tt, split, key)
                for r, item in enumerate(ours):
                    sequences = [ds[s] for s in range(documents[r], documents[r + 1])]
                    expected = item if isinstance(item, list) else [item]
                    assert len(sequences) == len(expected)
                    for got, want in zip(sequences, expected):
                        assert (
                            got.dtype
                            == {"uint16": np.uint16, "uint8": np.uint8, "float32": np.float32}[str(want.dtype)]
                        )
                        assert np.array_equal(got, want), (tt, split, key, r)


def test_hf_parquet_loads_with_datasets_and_round_trips(exported, roots):
    from datasets import load_dataset

    folder = roots["sft"] / "hf_parquet"
    loaded = load_dataset("parquet", data_files=str(folder / "records" / "*.parquet"), split="train")
    ours = [rec for part in record_shards(roots["sft"] / "deduped_jsonl") for rec in iter_jsonl(part)]
    assert len(list((folder / "records").glob("*.parquet"))) == -(-len(ours) // 50)
    assert len(loaded) == len(ours)
    for row, rec in zip(loaded, ours):
        assert row["id"] == rec["id"] and row["text"] == rec["text"]
        assert json.loads(row["meta"]) == rec["meta"] and json.loads(row["source"]) == rec["source"]

    files = {split: str(folder / "tokenized" / split / "*.parquet") for split in SPLITS}
    tokenized = load_dataset("parquet", data_files=files)
    for split, store in stores(roots["sft"]).items():
        rows = tokenized[split]
        assert rows.column_names == ["input_ids", "attention_mask", "labels"] and len(rows) == store.num_records
        for i, row in enumerate(rows):
            tokens, mask = store.read_record(i, "sequence").astype(np.int64), store.read_record(i, "loss_mask")
            assert row["input_ids"] == tokens.tolist()
            assert row["attention_mask"] == [1] * len(tokens)
            assert row["labels"] == np.where(mask == 1, tokens, -100).tolist()

    dpo = load_dataset("parquet", data_files=str(roots["dpo"] / "hf_parquet" / "tokenized" / "train" / "*.parquet"))
    store = stores(roots["dpo"])["train"]
    rows = dpo["train"]
    assert rows.column_names == ["prompt_ids", "chosen_ids", "rejected_ids"] and len(rows) == store.num_records
    for i, row in enumerate(rows):
        chosen, chosen_mask = store.read_record(i, "chosen"), store.read_record(i, "chosen_mask")
        rejected, rejected_mask = store.read_record(i, "rejected"), store.read_record(i, "rejected_mask")
        assert row["prompt_ids"] == chosen[chosen_mask == 0].tolist() == rejected[rejected_mask == 0].tolist()
        assert row["chosen_ids"] == chosen[chosen_mask == 1].tolist()
        assert row["rejected_ids"] == rejected[rejected_mask == 1].tolist()
    assert not (roots["grpo"] / "hf_parquet" / "tokenized").exists()


def split_record_ids(split_dir: Path) -> list[str]:
    """The record id of each record of a split, in order (docs/format.md: record_ids.json per shard)."""
    manifest = read_json(split_dir / "dataset.json")
    return [rid for sh in manifest["shards"] for rid in read_json(split_dir / sh["name"] / "record_ids.json")]


def test_transformers_tokenizer_renders_the_sft_tokens(exported, roots):
    from transformers import AutoTokenizer

    root = roots["sft"]
    tok = AutoTokenizer.from_pretrained(str(root / "tokenizer"))
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert tok.pad_token_id == tok.convert_tokens_to_ids("<pad>")
    batch = tok(["床前明月光", "举头望明月，低头思故乡。白日依山尽"], padding=True)  # no pad token passed by hand
    padded = np.array(batch["input_ids"])[np.array(batch["attention_mask"]) == 0]
    assert len(padded) and (padded == tok.pad_token_id).all()

    by_id = {rec["id"]: rec for part in record_shards(root / "deduped_jsonl") for rec in iter_jsonl(part)}
    checked = 0
    for split, store in stores(root).items():
        for i, rid in enumerate(split_record_ids(root / "tokenized_bins" / split)):
            rendered = tok.apply_chat_template(
                by_id[rid]["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            assert rendered["input_ids"] == store.read_record(i, "sequence").tolist(), rid
            assert rendered["assistant_masks"] == store.read_record(i, "loss_mask").tolist(), rid
            checked += 1
    assert checked == sum(s.num_records for s in stores(root).values()) > 150
    # the generation prompt is the dpo/grpo prompt rendering: <s><|user|>P<|end|><|assistant|>
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "写月亮"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<s><|user|>写月亮<|end|><|assistant|>"


def test_exports_are_byte_identical_when_rerun(exported, roots, tmp_path):
    """Rerun in the run process (hf_parquet's files were written by the worker pool the first time)."""
    root = roots["sft"]
    again = tmp_path / "again"
    for key in ("deduped_jsonl", "tokenized_bins"):
        shutil.copytree(root / key, again / key, symlinks=False)
    assert materialize(again, workers=1, run_config=RUN_CONFIG).success
    for asset in ("nanogpt_bins", "megatron_indexed", "hf_parquet"):
        first = {p.relative_to(root / asset): p.read_bytes() for p in (root / asset).rglob("*") if p.is_file()}
        second = {p.relative_to(again / asset): p.read_bytes() for p in (again / asset).rglob("*") if p.is_file()}
        assert first == second and len(first) >= 3, asset


def test_trl_dpo_tokenization_of_the_records_gives_the_exported_ids(exported, roots):
    """TRL's DPOTrainer tokenizes conversational prompt/chosen/rejected itself with the chat template (prompt with
    add_generation_prompt, then prompt + response cut after the prompt): with tokenmill's tokenizer that gives
    exactly hf_parquet's dpo columns."""
    from datasets import load_dataset
    from transformers import AutoTokenizer

    root = roots["dpo"]
    tok = AutoTokenizer.from_pretrained(str(root / "tokenizer"))
    by_id = {rec["id"]: rec for part in record_shards(root / "deduped_jsonl") for rec in iter_jsonl(part)}
    rows = load_dataset("parquet", data_files=str(root / "hf_parquet" / "tokenized" / "train" / "*.parquet"))["train"]
    for row, rid in zip(rows, split_record_ids(root / "tokenized_bins" / "train")):
        rec = by_id[rid]
        prompt = [{"role": "user", "content": rec["prompt"]}]
        prompt_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert row["prompt_ids"] == prompt_ids
        for key in ("chosen", "rejected"):
            full = tok.apply_chat_template(prompt + [{"role": "assistant", "content": rec[key]}], return_dict=True)
            assert row[f"{key}_ids"] == full["input_ids"][len(prompt_ids) :]


@pytest.mark.parametrize(
    "rec",
    [
        {
            "id": "a",
            "text": 'x, "meta": {}, "source": {}',
            "meta": {"source": {"k": [1, 2.5]}, "t": "é"},
            "source": {"path": "p", "line": 3},
        },
        {"id": "b", "text": "", "meta": {}, "source": {"path": 'q", "source": ', "index": 0}},
        {"id": "c", "text": "t", "meta": None, "source": {"path": "p", "source": 1}},  # ambiguous: written again
        {"id": "d", "text": "t", "meta": {}, "source": {"path": {"nested": 1}}},  # ambiguous: written again
        {"id": "e", "text": "t", "source": {"path": "p"}, "meta": {"x": float("nan")}},  # another order
        {"id": 5, "text": "t", "meta": {"n": -0.0}, "source": {"line": 1}},
    ],
)
def test_hf_parquet_meta_and_source_json_are_what_json_dumps_writes(rec):
    line = (json.dumps(rec, ensure_ascii=False) + "\n").encode()
    expected = (json.dumps(rec["meta"], ensure_ascii=False), json.dumps(rec["source"], ensure_ascii=False))
    assert meta_source_json(line, json.loads(line)) == expected


def test_hf_parquet_counts_records_from_the_shard_figures_or_else_the_lines(roots, tmp_path):
    deduped = shutil.copytree(roots["sft"] / "deduped_jsonl", tmp_path / "deduped_jsonl", symlinks=True)

    def lines() -> tuple[tuple[str, int], ...]:
        return tuple(
            (str(p), sum(1 for line in p.read_bytes().splitlines() if line.strip())) for p in record_shards(deduped)
        )

    assert _record_counts(deduped) == lines()
    changed = record_shards(deduped / BATCHES[1])[0]  # no longer as written: its figures do not count
    record = changed.read_bytes().splitlines(keepends=True)[0]
    changed.write_bytes(changed.read_bytes() + b"\n" + record)
    assert _record_counts(deduped) == lines()
    (deduped / BATCHES[0] / SHARDS_FILE).write_text('{"shards": [')  # figures that are not JSON count for nothing
    assert _record_counts(deduped) == lines()


def test_an_empty_split_exports_as_empty_files(roots, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    root = tmp_path / "empty_val"
    for key in ("deduped_jsonl", "tokenizer"):
        shutil.copytree(roots["sft"] / key, root / key)
    settings = ShardSettings(training_type="sft", val_fraction=0.0)
    batches = [(b, root / "deduped_jsonl" / b) for b in BATCHES]
    tokenize_batches(batches, root / "tokenizer", root / "tokenized_bins", settings, workers=1)
    assert materialize(root).success
    assert (root / "nanogpt_bins" / "val.bin").stat().st_size == 0
    # numpy cannot map an empty file, so megatron-core opens an empty split only with mmap=False
    ds = IndexedDataset(str(root / "megatron_indexed" / "val_sequence_document"), mmap=False)
    assert len(ds) == 0 and list(ds.document_indices) == [0]
    # datasets refuses a split of 0 rows ("corresponds to no data"); the file still holds the columns
    empty = pq.read_table(root / "hf_parquet" / "tokenized" / "val")
    assert empty.num_rows == 0 and empty.column_names == ["input_ids", "attention_mask", "labels"]


def test_definitions_with_the_exports_load():
    defs = dg.Definitions(assets=EXPORT_ASSETS, resources={"data_root": DataRoot(root="unused"), "compute": Compute()})
    dg.Definitions.validate_loadable(defs)
    assert {a.group_names_by_key[a.key] for a in EXPORT_ASSETS} == {"exports"}
