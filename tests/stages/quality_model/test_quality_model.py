"""Quality models: a fastText classifier trained here on two kinds of generated text, and a tiny transformers model
with random weights and a tokenizer trained on the test corpus, both scored on the CPU. Nothing is downloaded."""

import hashlib
import json
import random

import numpy as np
import pytest
from support import FAST, SCIENCE, SPAM, paragraph

from cli import main
from devtools.tiny_models import random_bert
from tokenmill.errors import ConfigError, SourceError
from tokenmill.quality_training import train_quality_model
from tokenmill.stages.quality_model import QualityTrainSettings, load_quality_model, model_id


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """120 science paragraphs as JSONL, 120 spam ones as blank-line-separated .txt blocks."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    good, bad = folder / "good.jsonl", folder / "bad.txt"
    good.write_text("".join(json.dumps({"text": paragraph(rng, SCIENCE)}) + "\n" for _ in range(120)))
    bad.write_text("\n\n".join(paragraph(rng, SPAM) for _ in range(120)) + "\n")
    return good, bad


def test_training_separates_the_classes_and_writes_the_card(corpus, tmp_path):
    good, bad = corpus
    card = train_quality_model([good], [bad], tmp_path / "m", QualityTrainSettings(**FAST))
    assert card.metrics["roc_auc"] > 0.95
    assert card.metrics["held_out"] == {"positive": 12, "negative": 12}
    written = json.loads((tmp_path / "m" / "model.json").read_text())
    assert written["inputs"]["positive"][0]["sha256"] == hashlib.sha256(good.read_bytes()).hexdigest()
    assert written["inputs"]["negative"][0]["texts"] == 120
    assert written["parameters"]["word_ngrams"] == 2 and written["parameters"]["thread"] == 1
    assert written["model_id"] == model_id(tmp_path / "m") == load_quality_model(tmp_path / "m").model_id
    model = load_quality_model(tmp_path / "m")
    rng = random.Random(1)
    scores = model.score([paragraph(rng, SCIENCE), paragraph(rng, SPAM), ""])
    assert scores.dtype == np.float32 and scores[0] > scores[1] and scores[2] == 0


def test_two_trainings_give_the_same_model_file(corpus, tmp_path):
    good, bad = corpus
    for name in ("a", "b"):
        train_quality_model([good], [bad], tmp_path / name, QualityTrainSettings(**FAST))
    assert (tmp_path / "a" / "model.bin").read_bytes() == (tmp_path / "b" / "model.bin").read_bytes()


def test_refusals_are_one_line(corpus, tmp_path):
    good, bad = corpus
    few = tmp_path / "few.jsonl"
    few.write_text(json.dumps({"text": "one science text about cells"}) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    corrupt = tmp_path / "broken.jsonl.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00not gzip at all")
    settings = QualityTrainSettings(**FAST)
    cases = [
        ([good], [few], ConfigError, "fewer than the 10"),
        ([good], [empty], ConfigError, "0 negative texts"),
        ([good], [good.with_name("missing.jsonl")], SourceError, "no such file"),
        ([good], [corrupt], SourceError, "unreadable"),
    ]
    for positive, negative, error, words in cases:
        with pytest.raises(error, match=words) as raised:
            train_quality_model(positive, negative, tmp_path / "out", settings)
        assert "\n" not in str(raised.value)


def test_cli_trains_and_refuses_in_one_line(corpus, tmp_path, capsys):
    good, bad = corpus
    args = ["train-quality", "--positive", str(good), "--negative", str(bad), "--out", str(tmp_path / "m")]
    assert main([*args, "--dim", "16", "--bucket", "20000"]) == 0
    printed = capsys.readouterr()
    assert "ROC AUC" in printed.out and str(tmp_path / "m" / "model.bin") in printed.out
    assert printed.err == ""  # these classes separate: no warning
    for negative in (good, tmp_path / "nope.txt"):  # one class under two names; a missing file
        assert main([*args[:3], "--negative", str(negative), "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tokenmill train-quality: ") and err.count("\n") == 1


def test_scores_that_barely_move_are_warned_about(corpus, tmp_path, capsys):
    """One epoch at a tiny learning rate ranks the classes with every score near 0.5: the card and the CLI say so."""
    good, bad = corpus
    args = ["train-quality", "--positive", str(good), "--negative", str(bad), "--out", str(tmp_path / "m")]
    assert main([*args, "--dim", "16", "--bucket", "20000", "--epoch", "1", "--lr", "0.001"]) == 0
    (warning,) = json.loads((tmp_path / "m" / "model.json").read_text())["metrics"]["warnings"]
    assert warning.startswith("held-out scores span only ")
    assert capsys.readouterr().err == f"tokenmill train-quality: warning: {warning}\n"


def test_model_id_changes_with_a_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    before = model_id(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 9 + b"\1")
    assert model_id(tmp_path) != before and len(before) == 16


@pytest.fixture(scope="module")
def tiny_transformers(tmp_path_factory, corpus):
    """A 2-layer BERT of hidden size 32 with random weights and a WordPiece tokenizer trained on the test corpus."""
    good, bad = corpus
    folder = tmp_path_factory.mktemp("tiny_bert")
    return random_bert(
        folder, [good.read_text(), bad.read_text()], hidden=32, layers=2, vocab_size=300, max_positions=128
    )


def test_tiny_transformers_model_scores_deterministically_on_cpu(tiny_transformers):
    rng = random.Random(2)
    texts = [paragraph(rng, SCIENCE, n) for n in (12, 60, 240, 24)]  # 240 words: cut at max_tokens
    model = load_quality_model(tiny_transformers, device="auto", max_tokens=64)
    scores = model.score(texts)
    assert model.kind == "transformers" and scores.dtype == np.float32 and scores.shape == (4,)
    assert np.isfinite(scores).all()
    again = load_quality_model(tiny_transformers, device="cpu", max_tokens=64)
    assert np.array_equal(again.score(texts), scores) and again.model_id == model.model_id
    # a text's score does not depend on the batch it came in (length-sorted batches, padding masked)
    assert np.allclose(model.score(texts[1:2]), scores[1:2], atol=1e-5)


def test_cuda_scores_match_the_cpu_within_the_bf16_tolerance(tiny_transformers):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = random.Random(3)
    texts = [paragraph(rng, SCIENCE if i % 2 else SPAM, 12 * (1 + i % 9)) for i in range(100)]
    on_cpu = load_quality_model(tiny_transformers, device="cpu").score(texts)
    on_cuda = load_quality_model(tiny_transformers, device="cuda").score(texts)
    assert np.abs(on_cuda - on_cpu).max() < 2e-2


def test_a_model_id_is_hashed_once_until_its_file_is_touched(tmp_path, monkeypatch):
    """The id is remembered under the file's stat: an untouched model is not read again; a model rewritten in place,
    even with its size and mtime kept, is hashed again (its ctime moved)."""
    import os
    import time

    from tokenmill.stages.quality_model import model as model_module

    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.bin"
    path.write_bytes(b"a" * 1000)
    first = model_id(path)
    assert first == model_module.hashed_model_id(path, [path])
    real = model_module.hashed_model_id
    monkeypatch.setattr(model_module, "hashed_model_id", lambda *a: pytest.fail("hashed again"))
    assert model_id(path) == first
    monkeypatch.setattr(model_module, "hashed_model_id", real)
    stat = path.stat()
    time.sleep(0.01)
    path.write_bytes(b"b" * 1000)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert model_id(path) == real(path, [path]) != first
