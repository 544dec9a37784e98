"""tokenized_bins defaults that fit the corpus: training_type auto (chosen by the records' title/author, once per
generation), a val split that is never left empty on a small corpus (and a warning when it is small), and drop
samples that keep their record's text."""

import hashlib
import json
from pathlib import Path

import pytest

from assets.metadata import tokenized_bins_metadata
from tokenmill.common.io import read_json
from tokenmill.common.samples import SAMPLE_CHARS, SAMPLES_PER_REASON
from tokenmill.stages.tokenize import ShardSettings, TokenizerSettings, tokenize_batches, train_tokenizer
from tokenmill.stages.tokenize.checks import validate_token_shards
from tokenmill.stages.tokenize.render import TrainingTypeChoice, split_hash, split_of
from tokenmill.stages.tokenize.shards import REJECTED_JSON
from tokenmill.stages.tokenize.tokenizer import load_tokenizer
from tokenmill_loader import open_store
from tokenmill_loader.format import read_record_ids

LINES = ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。", "Shall I compare thee to a summer's day?"]


def record(batch: str, i: int, titled: bool = False, text: bool = True) -> dict:
    rec = {
        "id": hashlib.blake2b(f"{batch}/{i}".encode(), digest_size=8).hexdigest(),
        "meta": {"title": f"题{i % 5}", "author": f"诗人{i % 3}"} if titled else {},
        "source": {"path": f"{batch}.jsonl", "line": i + 1},
    }
    if text:
        rec["text"] = "\n".join(LINES[(i + k) % len(LINES)] for k in range(1 + i % 3)) + f"\n{batch} {i}"
    return rec


def write_batch(root: Path, key: str, recs: list[dict], per_part: int = 10**9) -> tuple[str, Path]:
    folder = root / key
    folder.mkdir(parents=True)
    for k in range(0, len(recs), per_part):
        (folder / f"part-{k // per_part:05d}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs[k : k + per_part]), encoding="utf-8"
        )
    return key, folder


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    _, folder = write_batch(root, "in", [record("t", i, titled=True) for i in range(60)])
    train_tokenizer(folder, root / "tok", TokenizerSettings(vocab_size=400))
    return root / "tok"


def build(tok_dir: Path, bins: Path, batches, workers: int = 1, **settings) -> dict:
    return tokenize_batches(batches, tok_dir, bins, ShardSettings(**settings), workers=workers)


def published_bytes(bins: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(bins)): p.read_bytes()
        for p in sorted(bins.rglob("*"))
        if p.is_file() and not p.name.startswith("_") and "_batches" not in p.parts
    }


def split_ids(bins: Path, split: str) -> list[str]:
    return [rid for part in open_store(bins / split).parts for rid in read_record_ids(part.folder)]


# ------------------------------------------------------------------------------------------- training type auto
def test_auto_rule_needs_a_tenth_of_the_records_titled():
    assert TrainingTypeChoice.auto(2700, 1215).resolved == "conditional"  # the demo corpus: 45%
    assert TrainingTypeChoice.auto(7108, 0).resolved == "seq"  # tinyshakespeare
    assert TrainingTypeChoice.auto(100, 10).resolved == "conditional"
    assert TrainingTypeChoice.auto(100, 9).resolved == "seq"  # a few stray titles do not switch a plain corpus
    assert TrainingTypeChoice.auto(0, 0).resolved == "seq"


def test_auto_is_the_default_and_encodes_as_the_type_it_chose(tmp_path, tok_dir):
    plain = write_batch(tmp_path / "plain", "b1", [record("p", i) for i in range(40)])
    titled = write_batch(tmp_path / "titled", "b1", [record("q", i, titled=i % 5 == 0) for i in range(40)])
    assert ShardSettings().training_type == "auto"
    for batch, chosen in ((plain, "seq"), (titled, "conditional")):
        auto = build(tok_dir, tmp_path / f"auto-{chosen}", [batch])
        explicit = build(tok_dir, tmp_path / f"explicit-{chosen}", [batch], training_type=chosen)
        assert (auto.training_type, auto.training_type_setting) == (chosen, "auto")
        assert auto.training_type_reason.startswith(f"auto: {8 if chosen == 'conditional' else 0} of 40 records")
        assert explicit.training_type_setting == chosen and explicit.training_type_reason == "set explicitly"
        # the same shards as the type set explicitly; the manifest adds what auto decided on
        a, e = published_bytes(tmp_path / f"auto-{chosen}"), published_bytes(tmp_path / f"explicit-{chosen}")
        assert {k: v for k, v in a.items() if "dataset" not in k} == {k: v for k, v in e.items() if "dataset" not in k}
        manifest = read_json(tmp_path / f"auto-{chosen}" / "train" / "dataset.json")
        assert manifest["training_type"] == manifest["encoding"]["training_type"] == chosen
        assert manifest["training_type_choice"] == {"records": 40, "with_title_or_author": 8 if chosen != "seq" else 0}
        check = validate_token_shards(tmp_path / f"auto-{chosen}", batch[1], tok_dir)
        assert check["problems"] == [] and check["reencoded_records"] > 0
    # plain text gets no masked <|content|> (every token trained)
    content = load_tokenizer(tok_dir / "tokenizer.json").token_to_id("<|content|>")
    store = open_store(tmp_path / "auto-seq" / "train")
    assert all(content not in store.read_record(i, "sequence").tolist() for i in range(store.num_records))
    assert build(tok_dir, tmp_path / "auto-seq", [plain]).masked_tokens == 0


@pytest.mark.parametrize("first_titled", [True, False])
def test_a_first_build_guessed_wrong_from_its_first_records_is_encoded_again_as_all_records_choose(
    tmp_path, tok_dir, monkeypatch, first_titled
):
    import tokenmill.stages.tokenize.stage as stage

    monkeypatch.setattr(stage, "GUESS_BYTES", 1)  # the guess reads the first record only
    # the first record alone says one type, all 40 the other
    recs = [record("g", i, titled=(i == 0) == first_titled) for i in range(40)]
    chosen = "conditional" if not first_titled else "seq"
    batch = write_batch(tmp_path / "in", "b1", recs)
    auto = build(tok_dir, tmp_path / "auto", [batch])
    build(tok_dir, tmp_path / "explicit", [batch], training_type=chosen)
    assert auto.training_type == chosen
    assert auto.training_type_reason.startswith(f"auto: {1 if first_titled else 39} of 40 records")
    a, e = published_bytes(tmp_path / "auto"), published_bytes(tmp_path / "explicit")
    assert {k: v for k, v in a.items() if "dataset" not in k} == {k: v for k, v in e.items() if "dataset" not in k}
    manifest = read_json(tmp_path / "auto" / "train" / "dataset.json")
    assert manifest["training_type_choice"] == {"records": 40, "with_title_or_author": 1 if first_titled else 39}


def test_auto_choice_is_kept_by_appends_and_made_again_by_a_new_generation(tmp_path, tok_dir):
    titled = write_batch(tmp_path / "in", "b1", [record("a", i, titled=True) for i in range(20)])
    plain = write_batch(tmp_path / "in", "b2", [record("b", i) for i in range(400)])
    bins = tmp_path / "bins"
    first = build(tok_dir, bins, [titled], val_fraction=0.2)
    assert first.training_type == "conditional" and first.generation == 1
    # 20 of 420 records titled (< 10%), but an append never flips the generation's choice
    append = build(tok_dir, bins, [titled, plain], val_fraction=0.2)
    assert (append.generation, append.rebuild_reason, append.training_type) == (1, None, "conditional")
    assert append.training_type_reason.startswith("auto: 20 of 20 records")
    assert build(tok_dir, bins, [titled, plain], val_fraction=0.2).new_version is False
    # a new generation (another setting) chooses again, from all its records
    regen = build(tok_dir, bins, [titled, plain], val_fraction=0.3)
    assert (regen.generation, regen.training_type) == (2, "seq")
    assert regen.rebuild_reason == "encoding settings changed: val_fraction"
    assert regen.training_type_reason.startswith("auto: 20 of 420 records")


def test_auto_over_an_explicit_generation_appends_when_it_chooses_the_same_type(tmp_path, tok_dir):
    plain = [write_batch(tmp_path / "in", f"b{k}", [record(f"b{k}", i) for i in range(30)]) for k in (1, 2)]
    bins = tmp_path / "bins"
    build(tok_dir, bins, plain[:1], training_type="seq")
    same = build(tok_dir, bins, plain, training_type="auto")
    assert (same.generation, same.rebuild_reason, same.training_type) == (1, None, "seq")
    other = build(tok_dir, tmp_path / "bins2", plain[:1], training_type="conditional")
    assert other.generation == 1
    switched = build(tok_dir, tmp_path / "bins2", plain)
    assert (switched.generation, switched.training_type) == (2, "seq")
    assert switched.rebuild_reason == "encoding settings changed: training_type"


# ------------------------------------------------------------------------------------------------ small val split
def hashed_to_train(batch: str, n: int, val_fraction: float) -> list[dict]:
    """n records whose ids all hash into train: the hash split alone leaves val empty."""
    recs = (record(batch, i) for i in range(10**4))
    return [r for r in recs if not split_of(r["id"], val_fraction)][:n]


def test_a_small_corpus_gets_one_val_record_and_a_warning(tmp_path, tok_dir):
    recs = hashed_to_train("s", 20, 0.05)
    moved = min(recs, key=lambda r: split_hash(r["id"]))["id"]
    batch = write_batch(tmp_path / "in", "b1", recs, per_part=5)
    stats = build(tok_dir, tmp_path / "w1", [batch], val_fraction=0.05)
    assert (stats.train_records, stats.val_records) == (19, 1)
    assert split_ids(tmp_path / "w1", "val") == [moved] and stats.val_moved == [moved]
    assert "val holds 1 of 20 records, under min_val_records 10" in stats.val_warning
    meta = tokenized_bins_metadata(stats, tmp_path / "w1")
    assert meta["val_warning"] == stats.val_warning and meta["val_moved"] == moved
    assert read_json(tmp_path / "w1" / "val" / "dataset.json")["val_moved"] == [moved]
    # the same output with several workers (tasks report their smallest train hash; the least of them moves)
    build(tok_dir, tmp_path / "w2", [batch], workers=2, val_fraction=0.05)
    assert published_bytes(tmp_path / "w2") == published_bytes(tmp_path / "w1")
    assert build(tok_dir, tmp_path / "quiet", [batch], val_fraction=0.05, min_val_records=1).val_warning is None
    # appends never move a published record, and the moved one stays listed
    more = write_batch(tmp_path / "in", "b2", hashed_to_train("t", 5, 0.05))
    appended = build(tok_dir, tmp_path / "w1", [batch, more], val_fraction=0.05)
    assert appended.rebuild_reason is None and appended.val_moved == [moved]
    assert split_ids(tmp_path / "w1", "val") == [moved] and appended.train_records == 24


def test_no_val_asked_or_one_record_moves_nothing(tmp_path, tok_dir):
    recs = hashed_to_train("s", 20, 0.05)
    batch = write_batch(tmp_path / "in", "b1", recs)
    none_asked = build(tok_dir, tmp_path / "none", [batch], val_fraction=0.0)
    assert (none_asked.val_records, none_asked.val_moved, none_asked.val_warning) == (0, [], None)
    single = write_batch(tmp_path / "in", "b2", recs[:1])
    one = build(tok_dir, tmp_path / "one", [single], val_fraction=0.05)
    assert (one.train_records, one.val_records, one.val_moved) == (1, 0, [])
    assert one.val_warning.startswith("val holds 0 of 1 records")


# --------------------------------------------------------------------------------------------------- drop samples
def test_dropped_records_keep_a_bounded_sample_with_their_text(tmp_path, tok_dir):
    """The first SAMPLES_PER_REASON drops of each reason per batch carry their record's line (cut), for any
    worker count; the stats and the UI table show them."""
    bins = {w: tmp_path / f"w{w}" for w in (1, 2)}
    batches = []
    for b in ("b1", "b2"):
        recs = [record(b, i, text=i % 3 != 0) for i in range(60)]
        recs[4]["text"] = ""  # empty text: the same reason as a missing one
        batches.append(write_batch(tmp_path / "in", b, recs, per_part=7))
    for w, out in bins.items():
        stats = build(tok_dir, out, batches, workers=w, training_type="seq")
    assert published_bytes(bins[1]) == published_bytes(bins[2])
    rejected = json.loads((bins[1] / REJECTED_JSON).read_text(encoding="utf-8"))
    assert len(rejected) == stats.dropped["empty_text"] == 2 * 21
    for b, (_, folder) in zip(("b1", "b2"), batches):
        mine = [e for e in rejected if e["batch"] == b]
        with_text = [e for e in mine if "text" in e]
        assert with_text == mine[:SAMPLES_PER_REASON]  # the first ones, in record order
        lines = {json.loads(line)["id"]: line for p in sorted(folder.glob("*.jsonl")) for line in p.open()}
        for e in with_text:
            assert e["text"] == lines[e["id"]].rstrip("\n")[:SAMPLE_CHARS] and e["text_chars"] > 0
    samples = stats.rejected_samples["empty_text"]
    assert len(samples) == SAMPLES_PER_REASON and all(e["batch"] == "b1" for e in samples)
    table = tokenized_bins_metadata(stats, bins[1])["rejected_samples"].value
    wheres = [r.data["record and reason"].split()[0] for r in table.records]
    assert wheres == [f"b1.jsonl:{e['source']['line']}" for e in samples[:5]]
