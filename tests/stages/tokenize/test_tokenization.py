"""tokenizer stage: special token ids, byte-level round trip, bounded deterministic sample, existing tokenizer.json."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.conftest import REPO
from tokenmill.common.results import read_result
from tokenmill.errors import ConfigError, CorruptOutputError
from tokenmill.stages.tokenize import TokenizerSettings, train, train_tokenizer
from tokenmill.stages.tokenize.tokenizer import load_tokenizer
from tokenmill.stages.tokenize.train import build_trainer_tokenizer
from tokenmill_loader.format import SPECIAL_TOKENS

POEMS = [
    "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。",
    "白日依山尽，黄河入海流。\n欲穷千里目，更上一层楼。",
    "春眠不觉晓，处处闻啼鸟。\n夜来风雨声，花落知多少。",
    "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.",
    "The quick brown fox jumps over the lazy dog; 12345 67890!",
]


def write_records(folder: Path, n: int = 300, start: int = 0) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    recs = []
    for i in range(start, start + n):
        recs.append(
            {
                "id": f"{i:016x}",
                "text": POEMS[i % len(POEMS)] + f"\n第{i}首 line {i}",
                "meta": {"title": f"题{i % 17}", "author": f"作者{i % 11}"},
                "source": {"path": "poems.json", "index": i},
            }
        )
    with open(folder / "part-00000.jsonl", "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return recs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("tok")
    write_records(base / "in")
    stats = train_tokenizer(base / "in", base / "out", TokenizerSettings(vocab_size=400))
    return base, stats


def test_special_tokens_first_in_fixed_order(trained):
    base, stats = trained
    tok = load_tokenizer(base / "out" / "tokenizer.json")
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert stats.special_tokens == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    assert stats.vocab_size == tok.get_vocab_size() <= 400


ODD = ["  leading spaces\n\ttabs  ", "emoji 🙂 and é, ñ!?", "锟斤拷\u3000全角　空格", "", "「曰：」…—", "a,b;c 1.5e3%"]


@pytest.mark.parametrize("text", POEMS + ODD)
def test_byte_level_round_trip(trained, text):
    tok = load_tokenizer(trained[0] / "out" / "tokenizer.json")
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


def test_pretokenizers_round_trip_and_punctuation_attachment(tmp_path):
    import unicodedata

    write_records(tmp_path / "in", n=300)
    isolated = {}
    for pt in ("bytelevel", "punct_attach"):
        train_tokenizer(tmp_path / "in", tmp_path / pt, TokenizerSettings(vocab_size=600, pretokenizer=pt))
        tok = load_tokenizer(tmp_path / pt / "tokenizer.json")
        for text in POEMS + ODD:
            assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
        ids = [i for t in POEMS for i in tok.encode(t, add_special_tokens=False).ids]
        isolated[pt] = sum(1 for i in ids if len(s := tok.decode([i])) == 1 and unicodedata.category(s)[0] == "P")
    assert isolated["punct_attach"] < isolated["bytelevel"]
    with pytest.raises(ValidationError, match="pretokenizer"):
        TokenizerSettings(pretokenizer="nope")


def test_stats_held_out_and_examples(trained):
    base, stats = trained
    assert read_result(base / "out", type(stats)) == stats
    assert stats.mode == "trained"
    assert stats.held_out_records > 0 and stats.sample_records > 0
    assert stats.sample_records + stats.held_out_records <= stats.docs_in == 300
    assert stats.chars_per_token > 0.5
    assert stats.examples and all(e["roundtrip"] for e in stats.examples)


def test_sample_is_bounded(tmp_path):
    write_records(tmp_path / "in", n=400)
    s = train_tokenizer(tmp_path / "in", tmp_path / "out", TokenizerSettings(vocab_size=300, sample_chars=2000))
    assert 0 < s.sample_chars <= 2000
    assert s.sample_records < 60


def test_deterministic_bytes(tmp_path, trained):
    base, _ = trained
    train_tokenizer(base / "in", tmp_path / "again", TokenizerSettings(vocab_size=400))
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (base / "out" / "tokenizer.json").read_bytes()


def test_existing_tokenizer_is_copied(tmp_path, trained):
    base, _ = trained
    src = base / "out" / "tokenizer.json"
    s = train_tokenizer(base / "in", tmp_path / "copy", TokenizerSettings(tokenizer_path=str(src)))
    assert s.mode == "existing" and s.special_tokens_added == []
    assert (tmp_path / "copy" / "tokenizer.json").read_bytes() == src.read_bytes()
    # a folder holding tokenizer.json works too
    s2 = train_tokenizer(base / "in", tmp_path / "copy2", TokenizerSettings(tokenizer_path=str(base / "out")))
    assert (tmp_path / "copy2" / "tokenizer.json").read_bytes() == src.read_bytes()
    assert s2.vocab_size == s.vocab_size


def test_existing_tokenizer_without_our_specials_gets_them(tmp_path):
    write_records(tmp_path / "in", n=50)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        POEMS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<unk>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.save(str(tmp_path / "foreign.json"))
    n0 = tok.get_vocab_size()
    s = train_tokenizer(
        tmp_path / "in", tmp_path / "out", TokenizerSettings(tokenizer_path=str(tmp_path / "foreign.json"))
    )
    assert s.special_tokens_added == list(SPECIAL_TOKENS)
    assert s.vocab_size == n0 + len(SPECIAL_TOKENS)
    out = load_tokenizer(tmp_path / "out" / "tokenizer.json")
    assert all(out.token_to_id(t) is not None for t in SPECIAL_TOKENS)


def test_bad_tokenizer_path_is_a_clear_error(tmp_path):
    write_records(tmp_path / "in", n=10)
    with pytest.raises(ConfigError, match="not found"):
        train_tokenizer(tmp_path / "in", tmp_path / "o1", TokenizerSettings(tokenizer_path=str(tmp_path / "nope.json")))
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="not a loadable"):
        train_tokenizer(
            tmp_path / "in", tmp_path / "o2", TokenizerSettings(tokenizer_path=str(tmp_path / "broken.json"))
        )


def test_trainer_thread_count_does_not_change_bytes(tmp_path):
    """HF BPE training is deterministic whatever the thread count (we train single-threaded anyway)."""
    import os
    import subprocess
    import sys

    write_records(tmp_path / "in", n=120)
    code = (
        "import sys; from pathlib import Path; from tokenmill.stages.tokenize.train import *; "
        "tok, tr = build_trainer_tokenizer(350, 2); "
        "from tokenmill.common.io import iter_jsonl; texts=[r['text'] for r in iter_jsonl(sys.argv[1])]; "
        "tok.train_from_iterator(texts, trainer=tr); Path(sys.argv[2]).write_text(tok.to_str())"
    )
    outs = []
    for threads in ("1", "2"):
        out = tmp_path / f"t{threads}.json"
        env = {**os.environ, "RAYON_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "true"}
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "in" / "part-00000.jsonl"), str(out)],
            check=True,
            env=env,
            cwd=REPO,
        )
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert build_trainer_tokenizer  # imported for the subprocess


def test_sample_does_not_depend_on_file_order_or_cut(tmp_path):
    recs = write_records(tmp_path / "one", n=400)
    (tmp_path / "three").mkdir()
    for k in range(3):  # same records, other order and cut
        with open(tmp_path / "three" / f"part-{k:05d}.jsonl", "w", encoding="utf-8") as f:
            for r in recs[::-1][k::3]:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    s = TokenizerSettings(vocab_size=300, sample_chars=3000, held_out_chars=500)
    a = train_tokenizer(tmp_path / "one", tmp_path / "a", s)
    b = train_tokenizer(tmp_path / "three", tmp_path / "b", s)
    assert (a.sample_records, a.sample_chars, a.held_out_chars) == (
        b.sample_records,
        b.sample_chars,
        b.held_out_chars,
    )
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_sample_is_the_same_whatever_cutoff_pass_1_starts_from(tmp_path, monkeypatch):
    """Pass 1 keeps only the records hashing below a cutoff (a bounded candidate list, not a hash per record); a
    cutoff too low to fill the budgets grows and pass 1 runs again, and the sample is the one every record gives."""
    write_records(tmp_path / "in", n=2000)
    s = TokenizerSettings(vocab_size=300, sample_chars=3000, held_out_chars=500)
    everything = train.sample_corpus(tmp_path / "in", s)
    passes = []
    id_hashes = train.id_hashes

    def counted(part, below=train.ALL_HASHES):
        passes.append(below)
        return id_hashes(part, below)

    monkeypatch.setattr(train, "first_cutoff", lambda settings, corpus_bytes: 1 << 50)  # ~0.01% of the records
    monkeypatch.setattr(train, "id_hashes", counted)
    cut = train.sample_corpus(tmp_path / "in", s)
    assert (cut.train, cut.held_out, cut.records) == (everything.train, everything.held_out, everything.records)
    assert len(passes) > 1 and passes[-1] < train.ALL_HASHES  # grew, and filled the budgets before every record
    assert train.first_cutoff(s, 10**9) < train.ALL_HASHES  # a large corpus: a share of the hashes
    assert train.first_cutoff(s, 10**4) == train.first_cutoff(s.model_copy(update={"sample_chars": 0}), 10**9)


def test_settings_refuse_bad_values_naming_the_field():
    from tokenmill.settings import validate_run_settings

    with pytest.raises(ValidationError, match="vocab_size 200 is below the 10 special tokens"):
        TokenizerSettings(vocab_size=200)
    assert TokenizerSettings(vocab_size=200, tokenizer_path="x.json").vocab_size == 200  # not trained: unused
    with pytest.raises(ConfigError, match=r"tokenizer\.min_frequency: .*greater than or equal to 0"):
        validate_run_settings({"ops": {"tokenizer": {"config": {"min_frequency": -1}}}})
    with pytest.raises(ConfigError, match=r"tokenized_bins\.val_fraction: .*less than 1"):
        validate_run_settings({"ops": {"tokenized_bins": {"config": {"val_fraction": 1.0}}}})
    with pytest.raises(ConfigError, match=r"tokenized_bins\.training_type"):
        validate_run_settings({"ops": {"tokenized_bins": {"config": {"training_type": "rlhf"}}}})
    with pytest.raises(ConfigError, match=r"tokenized_bins\.token_dtype"):
        validate_run_settings({"ops": {"tokenized_bins": {"config": {"token_dtype": "int8"}}}})
    # across the two assets: uint16 chosen explicitly for a vocabulary it cannot hold
    big = {"tokenizer": {"config": {"vocab_size": 70_000}}, "tokenized_bins": {"config": {"token_dtype": "uint16"}}}
    with pytest.raises(ConfigError, match=r"tokenized_bins\.token_dtype: uint16 cannot hold the 70,000 ids"):
        validate_run_settings({"ops": big})
    validate_run_settings({"ops": {**big, "tokenized_bins": {"config": {"token_dtype": "auto"}}}})


def test_malformed_line_is_corruption_naming_file_and_line(tmp_path):
    write_records(tmp_path / "in", n=10)
    with open(tmp_path / "in" / "part-00000.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": 12, oops\n')
    with pytest.raises(CorruptOutputError, match=r"part-00000\.jsonl:11: not a JSON record"):
        train_tokenizer(tmp_path / "in", tmp_path / "out", TokenizerSettings(vocab_size=300))
