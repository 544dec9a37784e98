"""dedup level 1, the key: normalization, batch keys equal per-text keys, shingle unit by script, optional
Chinese folding, exact groups of normalized variants."""

from __future__ import annotations

import random

import pytest
from support import dedup_record, write_records

from tokenmill.common import text_keys
from tokenmill.stages.dedup import (
    DedupSettings,
    build_dedup_report,
)
from tokenmill.stages.dedup import keys as K


def test_dedup_key_normalization():
    k = text_keys.dedup_key
    assert k("Ｈｅｌｌｏ，　ＷＯＲＬＤ！") == k("hello world") == "helloworld"  # NFKC full-width, casefold, spaces
    assert k("床前明月光，疑是地上霜。") == k("床前明月光\n疑是地上霜") == "床前明月光疑是地上霜"
    assert k("a\u200bb\ufeffc") == "abc"  # zero-width space and BOM (format characters)
    assert k("Straße") == k("STRASSE")  # full case folding
    assert k("★ love ♥ ©2024") == "love2024" and k("★ love", strip_symbols=False) == "★love"
    assert k("春眠不觉晓") != k("春眠不覺曉")  # no Chinese folding unless asked
    assert k("!!!") != k("???") and k("!!!") == "!!!"  # all-punctuation texts key on themselves
    assert K.key_digest(k("a b")) == K.key_digest(k("AB")) and len(K.key_digest("x")) == 32


def test_batch_keys_equal_per_text_keys():
    rng = random.Random(0)
    tricky = [
        "Ｈｅｌｌｏ，　ＷＯＲＬＤ！",
        "Straße ™ ① ﬁ",
        "e\u0301 cafe\u0301",
        "!!!",
        "",
        "  ",
        "\u1100\u1161",
        "가나",
        "İstanbul",
        "ΣΑΣ",
        "x\U00020000y",
        "😀 hi",
        "a\u200bb",
        "床前明月光，疑是地上霜。",
    ]
    pools = [
        (0x20, 0x2FF),
        (0x300, 0x36F),
        (0x1100, 0x11FF),
        (0x2000, 0x33FF),
        (0xAC00, 0xAC20),
        (0xFF00, 0xFFEF),
        (0x4E00, 0x4E40),
        (0x1F300, 0x1F320),
    ]
    texts = tricky + [
        "".join(chr(rng.randint(*rng.choice(pools))) for _ in range(rng.randint(0, 12))) for _ in range(3000)
    ]
    for strip in (True, False):
        assert text_keys.dedup_keys(texts, strip) == [text_keys.dedup_key(t, strip) for t in texts]
        spaced = text_keys.dedup_keys(texts, strip, spaced=True)
        assert spaced == [text_keys.dedup_key(t, strip, spaced=True) for t in texts]
        assert [K.exact_key(k) for k in spaced] == text_keys.dedup_keys(texts, strip)  # the same exact identity


def test_spaced_keys_and_shingle_unit_by_script():
    assert text_keys.dedup_key("  AEdiles,  seize\n him! ", spaced=True) == "aediles seize him"
    keys = ["aediles seize him", "床前 明月光", "привет мир", "ไทย ภาษา", "", "abc 春"]
    assert text_keys.by_words(keys).tolist() == [True, False, True, False, False, True]


def test_chinese_folding_is_optional_and_consistent():
    pytest.importorskip("opencc")
    texts = ["舉頭望明月，低頭思故鄉。", "举头望明月\n低头思故乡", "Hello, 世界!"]
    keys = text_keys.dedup_keys(texts, fold_chinese=True)
    assert keys[0] == keys[1] == "举头望明月低头思故乡" and keys[2] == "hello世界"
    assert keys == [text_keys.dedup_key(t, fold_chinese=True) for t in texts]
    assert text_keys.dedup_keys(texts[:2]) == ["舉頭望明月低頭思故鄉", "举头望明月低头思故乡"]  # off by default


def test_exact_level_groups_normalized_variants(tmp_path):
    recs = [
        dedup_record("f.json", 0, "Hello, World!"),
        dedup_record("f.json", 1, "hello world"),
        dedup_record("f.json", 2, "ＨＥＬＬＯ　ＷＯＲＬＤ。"),
        dedup_record("f.json", 3, "goodbye world"),
    ]
    write_records(tmp_path / "in", recs)
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
    assert stats.dropped["exact_duplicate"] == 2 and stats.dropped["near_duplicate"] == 0
    assert stats.docs_out == 2
