"""The piece encoder gives HF's ids exactly, on text built to break it, and steps aside where it cannot."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tokenmill.stages.tokenize import piece_bpe
from tokenmill.stages.tokenize.piece_bpe import PieceEncoder
from tokenmill.stages.tokenize.train import build_trainer_tokenizer

# every class the split pattern tells apart, several white spaces, combining marks (neither letter nor punctuation),
# characters beyond the basic plane, our special tokens' text and English contractions
POOL = [
    *"abcdefghij ABC éüñ",
    "\u0301",
    "\u0308",
    *"0123٣٤²½",
    *",.!?;:'\"-()[]，。！？、「」—…",
    *"+=<>|$€©™",
    "😀",
    "👍🏽",
    "\U00020000",
    "\U0002a6d6",
    "\ue000",
    *[" ", "  ", "\t", "\n", "\n\n", "\r\n", "\u3000", "\u00a0", "\u2028", "\x85", "\x0b", "\x0c", "\x00", "\x01"],
    *"明月光床前疑是地上霜举头望低思故乡",
    "<|title|>",
    "<s>",
    "'s",
    "'ll",
]
POEM = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"


def _texts(seed: int, n: int, longest: int = 40) -> list[str]:
    r = random.Random(seed)
    return ["".join(r.choice(POOL) for _ in range(r.randint(0, longest))) for _ in range(n)]


def _trained(vocab: int, pretokenizer: str = "punct_attach"):
    tok, trainer = build_trainer_tokenizer(vocab, 2, pretokenizer)
    tok.train_from_iterator(_texts(1, 3000) + [POEM] * 50 + ["The quick brown fox's tail."] * 50, trainer)
    tok.encode_special_tokens = True
    return tok


@pytest.fixture(scope="module", params=[400, 1500])
def tok(request):
    return _trained(request.param)


def _split(encoded) -> list[list[int]]:
    ids, counts = encoded
    return [a.tolist() for a in np.split(ids, np.cumsum(counts)[:-1])] if len(counts) else []


def _hf(tok, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]


def test_random_text_of_every_class_encodes_to_hf_ids(tok):
    pe = PieceEncoder.build(tok, tok.to_str())
    assert pe is not None
    # the vocabulary holds tokens that span a character boundary with part of a character, the hardest case
    assert any(kind != "char" for atoms in pe._crossings for kind, _ in atoms)
    for seed in range(2, 6):
        texts = _texts(seed, 400)
        assert _split(pe.encode(texts)) == _hf(tok, texts)


def test_tokens_holding_part_of_a_character_span_its_boundaries():
    """A hand-made vocabulary whose merges join the last bytes of one character to the first of the next."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    byte_chars = piece_bpe.BYTE_CHARS
    b = lambda *xs: "".join(byte_chars[x] for x in xs)  # noqa: E731
    # one byte of each side; two bytes of the left character; two bytes of the right one
    merges = [(b(0xAD), b(0xE6)), (b(0x98), b(0x8E)), (b(0x98, 0x8E), b(0xE4)), (b(0xE4), b(0xB8))]
    merges += [(b(0x80), b(0xE4, 0xB8))]
    vocab = {c: i for i, c in enumerate(byte_chars)}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(piece_bpe.PUNCT_ATTACH_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    pe = PieceEncoder.build(tok, tok.to_str())
    assert pe is not None
    # characters ending in 0xAD (中 ...), 0x98 0x8E (明 ...) or 0x80, starting with 0xE6 or 0xE4 0xB8, and others
    pool = [chr(c) for c in range(0x4E00, 0x7000) if (c & 0x3F) == 0x2D][::40] + [*"\u560e明\u6000\u5000一丁，a 1"]
    r = random.Random(3)
    texts = ["".join(r.choice(pool) for _ in range(r.randint(0, 30))) for _ in range(2000)]
    assert _split(pe.encode(texts)) == _hf(tok, texts)


def test_batches_of_one_text_empty_texts_and_later_planes(tok):
    pe = PieceEncoder.build(tok, tok.to_str())
    assert pe is not None
    for texts in ([], ["a"], [""], ["", "", POEM, ""], [POEM + " ok"], ["\U0002a6d6明\U00020000"], ["x😀 👍🏽"]):
        assert _split(pe.encode(texts)) == _hf(tok, texts), texts
    assert pe._limit > piece_bpe.PLANE  # the last batches grew the span tables past the basic plane


def test_small_chunks_and_the_piece_cache_starting_over_change_nothing(tok, monkeypatch):
    monkeypatch.setattr(piece_bpe, "CACHE_IDS", 50)
    monkeypatch.setattr(piece_bpe, "CHUNK_POINTS", 64)  # texts of up to 80 points: a chunk of one text at times
    pe = PieceEncoder.build(tok, tok.to_str())
    assert pe is not None
    for seed in (7, 8, 9):
        texts = _texts(seed, 100, longest=80)
        assert _split(pe.encode(texts)) == _hf(tok, texts)
    assert len(pe._ids) < 50 + 2000  # it started over instead of growing


def test_a_surrogate_leaves_the_batch_to_hf(tok):
    pe = PieceEncoder.build(tok, tok.to_str())
    assert pe is not None and pe.encode(["ok", "lone \ud800 surrogate"]) is None


def test_a_vocabulary_needing_too_large_span_tables_is_left_to_hf(tok, monkeypatch):
    monkeypatch.setattr(piece_bpe, "MAX_SPANS", 4)
    assert PieceEncoder.build(tok, tok.to_str()) is None


def test_tokenizers_of_another_shape_are_left_to_hf():
    gpt2_split = _trained(400, "bytelevel")
    assert PieceEncoder.build(gpt2_split, gpt2_split.to_str()) is None
    spec = json.loads(_trained(400).to_str())
    for change in (
        lambda s: s.update(normalizer={"type": "NFC"}),
        lambda s: s["model"].update(dropout=0.1),
        lambda s: s["added_tokens"].append({**s["added_tokens"][0], "id": 9999, "content": "x", "special": False}),
        lambda s: s["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\w+"),
    ):
        changed = json.loads(json.dumps(spec))
        change(changed)
        assert PieceEncoder.build(None, json.dumps(changed)) is None
